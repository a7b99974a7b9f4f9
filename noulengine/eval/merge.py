"""The checked merge of a sharded evaluation's worker runs (``--merge --workers N``).

The merge refuses, naming the worker and what differs, when a worker folder is missing, a worker
has not finished its share, a worker holds a row outside its share or twice, or the workers
disagree on the model (sha256), readout, debiasing, calibration, dtype, row selection, suites and
their pinned sha256, or code revision. A merged run is scored by the same code as a single run
(:func:`noulengine.eval.runner.score_task`), so its metrics equal a single run's over the same rows.
Worker shares are :mod:`noulengine.eval.shards`'.
"""

from __future__ import annotations

import json
from pathlib import Path

from noulengine.eval.report import invocation_totals
from noulengine.eval.run_state import key_differences
from noulengine.eval.runner import EvalConfig, TaskResult, score_task, selected_rows
from noulengine.eval.shards import shard_of, worker_dir
from noulengine.eval.suites import expand_tasks, get_suite
from noulengine.records.errors import NoulEngineError
from noulengine.writes import write_text_atomic

# run_key.json fields every worker must share (worker, the one that must differ, is checked apart)
SHARED_KEY_FIELDS = ("suite", "tasks", "model_sha256", "readout", "debias", "calibration", "calibration_sha256",
                     "symbols_fallback", "dtype", "limit", "sample", "seed", "workers", "probe")


class ShardMergeError(NoulEngineError):
    """Worker runs that cannot be merged (names the worker and what differs or is missing)."""


_NO_ROWS = object()  # a worker's revision when it predicted no row (an empty share)


def _read_json(path: Path, worker: int) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShardMergeError(f"worker {worker}: {path} is missing; the worker has not run (or not finished) "
                              "into this folder") from None
    except ValueError as exc:
        raise ShardMergeError(f"worker {worker}: {path} is not valid JSON ({exc})") from None


def load_worker_runs(output: str | Path, workers: int) -> list[dict]:
    """Read every worker's ``run_key.json``, ``run.json`` and predictions, checking that they are
    the same run.

    Returns:
        One dict per worker: ``{"worker", "dir", "key", "run", "predictions"}`` (predictions keyed
        by ``(suite, row)``).

    Raises:
        ShardMergeError: a worker folder or file is missing, a worker ran another share count or
            worker number, a prediction occurs twice, or the workers' settings differ.
    """
    runs = []
    for r in range(workers):
        d = worker_dir(output, r)
        if not d.is_dir():
            raise ShardMergeError(f"worker {r}: no run folder {d}; run it with --worker {r} --workers {workers} "
                                  f"--output {output}")
        key = _read_json(d / "run_key.json", r)
        run = _read_json(d / "run.json", r)
        if key.get("workers") != workers or key.get("worker") != r:
            raise ShardMergeError(f"worker {r}: {d} holds worker {key.get('worker')!r} of {key.get('workers')!r}, "
                                  f"not worker {r} of {workers}")
        runs.append({"worker": r, "dir": d, "key": key, "run": run, "predictions": _read_worker_predictions(d, r)})
    for run in runs:  # run.json is written as an invocation starts: one still running (or killed) has not finished
        status = run["run"].get("status")
        if status not in (None, "finished"):
            raise ShardMergeError(f"worker {run['worker']} has not finished: its last invocation is {status} "
                                  "(run.json); rerun the worker with the same flags to resume it")
    for run in runs:  # a worker resumed under other code holds rows of two revisions
        revisions = prediction_revisions(run["run"])
        if len(revisions) > 1:
            raise ShardMergeError(f"worker {run['worker']} ran under several code revisions ({sorted(map(str, revisions))}); "
                                  "rerun it from scratch under one revision")
        run["revision"] = next(iter(revisions)) if revisions else _NO_ROWS  # an empty share predicts nothing
    first = runs[0]
    ref = _first_predicting(runs)  # the rows' code: one revision across the workers that predicted
    for other in runs[1:]:
        # resolved settings; the calibration by its sha256 (workers may hold the file at other paths)
        diff = key_differences(first["key"], other["key"], fields=SHARED_KEY_FIELDS,
                               names=("worker 0", f"worker {other['worker']} has"))
        if other["revision"] is not _NO_ROWS and ref is not None and other["revision"] != ref["revision"]:
            diff.append(f"code revision: worker {ref['worker']} predicted under {ref['revision']!r}, worker "
                        f"{other['worker']} under {other['revision']!r}")
        if first["run"].get("suite_sha256") != other["run"].get("suite_sha256"):
            diff.append(f"suite sha256 pins: worker 0 has {first['run'].get('suite_sha256')!r}, worker "
                        f"{other['worker']} has {other['run'].get('suite_sha256')!r}")
        if diff:
            raise ShardMergeError(f"worker {other['worker']} ran another evaluation than worker 0: " + "; ".join(diff))
    return runs


def _first_predicting(runs: list[dict]) -> dict | None:
    """The first worker (of :func:`load_worker_runs`) that predicted any row, or None."""
    return next((run for run in runs if run["revision"] is not _NO_ROWS), None)


def prediction_revisions(run: dict) -> set:
    """The code revisions under which a worker's rows were predicted.

    An invocation that predicted nothing (every row of its share was already on disk: a chain
    that re-runs a finished worker after a new commit) changed no prediction, so its revision does
    not count. An invocation whose record has no request count (a hand-edited file) counts, to be
    safe. A ``run.json`` without invocations (an older layout) is described by its top-level
    ``git_revision``.

    Args:
        run: a worker's parsed ``run.json`` (its invocations as recorded; a killed invocation's rows
            are credited to it by :class:`~noulengine.eval.run_state.InvocationLog` on the next run,
            see :func:`~noulengine.eval.run_state.previous_invocations`).

    Returns:
        A set of revision strings (``None`` where git was not available); empty when the worker
        predicted no row at all (an empty share, or re-runs of one).
    """
    invocations = run.get("invocations")
    if not isinstance(invocations, list):
        return {run.get("git_revision")}
    predicting = [inv for inv in invocations if ((inv.get("throughput") or {}).get("requests") is None
                                                 or inv["throughput"]["requests"] > 0)]
    return {inv.get("git_revision") for inv in predicting}


def _read_worker_predictions(d: Path, worker: int) -> dict:
    """A worker's predictions keyed by ``(suite, row)``; read only (a merge never rewrites them)."""
    path = d / "predictions.jsonl"
    if not path.is_file():
        raise ShardMergeError(f"worker {worker}: {path} is missing")
    out: dict = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row.get("row"), int) or isinstance(row.get("row"), bool):
                raise TypeError("row is not an integer")
            k = (row["suite"], row["row"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ShardMergeError(f"worker {worker}: {path}:{n} is not a prediction row (an interrupted write?); "
                                  "rerun the worker with the same flags to resume it") from None
        if k in out:
            raise ShardMergeError(f"worker {worker}: row {k[1]} of suite {k[0]} is predicted twice in {path}")
        out[k] = row
    return out


def merge_runs(output: str | Path, workers: int, *, source: str | None = None, plots: bool = True):
    """Check the worker runs in ``output`` and score their union as one run.

    Writes ``output/predictions.jsonl`` (suite order, then row order) and returns
    ``(results, meta)`` for :func:`noulengine.eval.report.write_outputs`.

    Raises:
        ShardMergeError: see :func:`load_worker_runs` and :func:`check_partition`.
        SuiteError: a suite is unknown, absent or changed.
    """
    if workers < 1:
        raise ShardMergeError(f"--workers must be at least 1, got {workers}")
    out = Path(output)
    runs = load_worker_runs(out, workers)
    key = runs[0]["key"]
    config = EvalConfig(suite=key["suite"], tasks=key.get("tasks"), limit=key.get("limit"), sample=key.get("sample"),
                        seed=key.get("seed") or 0, output=str(out), source=source, plots=plots, probe=key.get("probe"))
    names = expand_tasks(config.tasks, collection=config.suite)
    pins = runs[0]["run"].get("suite_sha256") or {}
    suites = {name: get_suite(name) for name in names}
    loaded, shares = {}, {}
    for name, suite in suites.items():
        if name not in pins:
            continue  # the workers found it unavailable: so does the merge
        if suite.prepared_pins() != pins[name]:
            raise ShardMergeError(f"suite {name}: the workers ran it pinned at {pins[name]}, this checkout pins "
                                  f"{suite.prepared_pins()}")
        loaded[name] = rows = selected_rows(name, suite.load(source=source), config)
        per_worker: list[list[int]] = [[] for _ in range(workers)]
        for i, rec in rows:
            per_worker[shard_of(name, rec.id, i, workers)].append(i)
        shares[name] = per_worker
    check_partition(runs, shares)
    done: dict = {}
    for run in runs:
        done.update(run["predictions"])  # disjoint: check_partition proved every row has one owner
    for name, rows in loaded.items():  # each prediction is the row it claims to be
        for i, rec in rows:
            got = done[(name, i)].get("id")
            if rec.id is not None and got != rec.id:
                owner = shard_of(name, rec.id, i, workers)
                raise ShardMergeError(f"worker {owner}: the prediction for row {i} of suite {name} carries id {got!r}, "
                                      f"but that row is record {rec.id!r}")
    results = []
    lines: list[str] = []  # the merged predictions, written whole at the end (a rename: never half a file)
    for name, suite in suites.items():
        res = TaskResult(name=name, status="unavailable", licence=suite.licence, notes=suite.report_notes())
        results.append(res)
        if name not in loaded:
            res.reason = "unavailable to the workers"
            continue
        res.status = "ready"
        rows = loaded[name]
        for i, rec in rows:
            rec.metadata["suite"] = name
            lines.append(json.dumps(done[(name, i)], ensure_ascii=False, allow_nan=False) + "\n")
        score_task(res, rows, done, out, plots=plots, probe=key.get("probe"))
    write_text_atomic(out / "predictions.jsonl", "".join(lines))
    first = runs[0]["run"]
    invocations = [{**inv, "worker": run["worker"]} for run in runs for inv in run["run"].get("invocations") or []]
    meta = {k: first.get(k) for k in ("suite", "git_revision", "engine", "versions", "selection", "suite_sha256")}
    ref = _first_predicting(runs)
    if ref is not None:  # the revision that predicted the rows (checked equal on load)
        meta["git_revision"] = ref["revision"]
    if first.get("probe") is not None:
        meta["probe"] = first["probe"]
    selection = {k: v for k, v in (first.get("selection") or {}).items() if k not in ("worker", "workers")}
    meta.update({"tasks": [r.name for r in results], "merged_workers": workers,
                 "selection": {**selection, "merged_workers": workers},
                 "workers": [{"worker": run["worker"], "folder": str(run["dir"]), "wall_s": run["run"].get("wall_s"),
                              "totals": run["run"].get("totals")} for run in runs],
                 "invocations": invocations, "totals": invocation_totals(invocations)})
    req = meta["totals"]["requests"]
    meta["throughput"] = {"inference_seconds": meta["totals"]["inference_seconds"], "requests": req,
                          "requests_per_s": None, "decisions_per_s": None, "tokens_per_s": None,
                          "latency_p50_s": None, "latency_p95_s": None,
                          "note": "summed over the workers' invocations (listed one by one); workers run in parallel, "
                                  "so this is device time, not wall time"}
    # the merged folder is a run folder: a later run into it must match, or be refused
    merged_key = {k: v for k, v in key.items() if k not in ("worker",)}
    merged_key["merged_workers"] = workers
    write_text_atomic(out / "run_key.json", json.dumps(merged_key, indent=2) + "\n")
    return results, meta


def check_partition(runs: list[dict], shares: dict[str, list[list[int]]]) -> None:
    """Every worker holds exactly its share of every suite: none missing, none extra.

    Args:
        runs: from :func:`load_worker_runs`.
        shares: per suite, per worker, the row indices that worker owns (recomputed from the suites).

    Raises:
        ShardMergeError: naming the worker, the suite and the first rows missing or out of share.
    """
    for run in runs:
        r = run["worker"]
        held: dict[str, set[int]] = {}
        for suite, row in run["predictions"]:
            held.setdefault(suite, set()).add(row)
        for suite, per_worker in shares.items():
            want = set(per_worker[r])
            got = held.pop(suite, set())
            missing = sorted(want - got)
            if missing:
                raise ShardMergeError(f"worker {r} has not finished suite {suite}: {len(missing)} of its {len(want)} "
                                      f"rows have no prediction (rows {missing[:5]}{' ...' if len(missing) > 5 else ''})"
                                      "; rerun the worker with the same flags to resume it")
            extra = sorted(got - want)
            if extra:
                raise ShardMergeError(f"worker {r} holds {len(extra)} row(s) of suite {suite} outside its share (rows "
                                      f"{extra[:5]}); it ran with another selection or share function")
        if held:
            raise ShardMergeError(f"worker {r} holds predictions of suites not in this run: {sorted(held)}")
