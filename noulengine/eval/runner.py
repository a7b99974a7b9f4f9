"""Evaluation runner: verified suites in, resumable predictions and scored metrics out.

Protocol, per task:

1. look the suite up in the registry; report it ``unavailable`` (never scored 0) when its data
   is absent, and refuse it when a prepared file's sha256 differs from its manifest;
2. select rows (``--sample N --seed S`` draws a fixed-seed sample, ``--limit N`` the first N;
   ``--worker R --workers N`` then keeps the worker's share, by a stable hash of the row id,
   :mod:`noulengine.eval.shards`);
3. run the engine on the rows not yet in ``predictions.jsonl`` (an interrupted run resumes with
   no lost or duplicated rows; a per-record failure is written as an error row);
4. score every selected row with :class:`noulengine.metrics.Scorer` (errors count in coverage).

With ``probe="reverse"`` (``--probe reverse``) every row's choice questions are also asked with their
options reversed, as extra requests of the same batches; the result travels in the row's
prediction and each suite reports the share of answers that changed (:mod:`noulengine.eval.probe`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from noulengine.eval.probe import (PROBES, change_summary, decide_with_probe, record_items, reversed_request,
                                   with_probe)
from noulengine.eval.shards import shard_rows
from noulengine.eval.suites import expand_tasks, get_suite, limit_rows, sample_rows


@dataclass
class EvalConfig:
    """Evaluation settings (the CLI flags beyond the engine's).

    Attributes:
        suite: the collection (``accuracy-v1``).
        tasks: suite names or groups (None: the collection's default list).
        limit: the first N rows of each suite (None: all).
        sample: a fixed-seed sample of N rows of each suite (None: all).
        seed: the sample's seed.
        output: the run folder (predictions, metrics, report, plots, metadata).
        chunk: requests handed to the engine at a time (predictions are appended per chunk).
        plots: draw one reliability diagram per suite (needs matplotlib, ``noulengine[plots]``).
        worker, workers: run only worker ``worker``'s share of ``workers`` (both None: every row).
        ray: a :class:`~noulengine.distributed.RayConfig` to run inference on Ray Data actors
            (None: the local engine). Each suite's remaining rows are one Ray Dataset; rows are
            appended as batches finish, so an interrupted Ray run resumes like a local one.
        adapter: a LoRA adapter loaded on the engine that answers every row (None: the model).
        probe: ``"reverse"``: also ask every choice question with its options reversed and report
            the share of changed answers per suite (:mod:`noulengine.eval.probe`); None: no probe.
    """

    suite: str = "accuracy-v1"
    tasks: list[str] | None = None
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    output: str = "runs/latest"
    chunk: int = 64
    source: str | None = None
    progress: bool = True
    plots: bool = True
    worker: int | None = None
    workers: int | None = None
    ray: object | None = None
    probe: str | None = None
    adapter: str | None = None


def selected_rows(name: str, rows, config: EvalConfig):
    """The rows of suite ``name`` a run scores: ``sample``, then ``limit``, then the worker's share."""
    if config.sample is not None:
        rows = sample_rows(rows, config.sample, seed=config.seed)
    if config.limit is not None:
        rows = limit_rows(rows, config.limit)
    if config.workers is not None:
        rows = shard_rows(name, rows, config.worker, config.workers)
    return rows


@dataclass
class TaskResult:
    name: str
    status: str
    reason: str = ""
    rows: int = 0
    metrics: dict | None = None
    notes: list[str] = field(default_factory=list)
    licence: str = ""
    seconds: float = 0.0
    new_predictions: int = 0
    new_decisions: int = 0  # target fields of the rows run in this invocation
    input_tokens: int = 0  # of the rows run in this invocation
    latencies: list[float] = field(default_factory=list)
    slot_labels: dict[int, str] = field(default_factory=dict)  # slot -> label, where every question agrees


def read_predictions(path: Path, *, repair: bool = True) -> dict[tuple[str, int], dict]:
    """Existing predictions keyed by ``(suite, row)``; a torn last line (a killed run) is dropped
    and, with ``repair`` (a run about to append), the file is rewritten without it, so appending
    resumes cleanly; readers that only score (``noulengine compare``) pass ``repair=False``.

    Raises:
        ValueError: a line other than the last is not valid JSON (a corrupt file).
    """
    done: dict[tuple[str, int], dict] = {}
    if not path.is_file():
        return done
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    good = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # torn tail from an interrupted write
            raise ValueError(f"{path}:{i + 1}: not valid JSON; refusing to resume from a corrupt predictions file")
        if not line.endswith("\n"):
            break
        done[(row["suite"], int(row["row"]))] = row
        good.append(line)
    if repair and len(good) != len(lines):  # cut the torn tail in place: nothing else is rewritten
        from noulengine.writes import OutputWriteError

        try:
            os.truncate(path, sum(len(line.encode("utf-8")) for line in good))
        except OSError as exc:
            raise OutputWriteError(path, exc, "its torn last line is still there") from exc
    return done


def run_eval(engine, config: EvalConfig, *, on_progress=None) -> list[TaskResult]:
    """Run (or resume) an evaluation; returns one :class:`TaskResult` per task.

    Args:
        on_progress: called with the results so far after each batch of predictions is written
            (their ``seconds``, ``new_predictions`` and throughput counts cover what has landed), so
            a caller can record an invocation that may be interrupted.

    Raises:
        UnknownSuiteError: a task name is not registered (with a did-you-mean).
        PreparedFileChangedError: a prepared file differs from its manifest (before inference).
    """
    from tqdm import tqdm

    if config.probe is not None and config.probe not in PROBES:
        raise ValueError(f"unknown probe {config.probe!r}; choose from {list(PROBES)}")
    out_dir = Path(config.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    pred_path = out_dir / "predictions.jsonl"
    done = read_predictions(pred_path)
    names = expand_tasks(config.tasks, collection=config.suite)
    results: list[TaskResult] = []
    suites = {}
    for name in names:  # every check before any inference
        suite = get_suite(name)
        status = suite.available(config.source)
        if status.state == "changed":
            # Refuse before any inference: verify()/prepare() raise the hash-mismatch error.
            if suite.prepared_path.is_file():
                suite.verify()
            suite.prepare(source=config.source)
        suites[name] = (suite, status)
    from noulengine.writes import OutputWriteError

    try:  # unbuffered bytes: a failed write leaves nothing in a buffer for close() to retry
        sink_cm = pred_path.open("ab", buffering=0)
    except OSError as exc:
        raise OutputWriteError(pred_path, exc, "no row was written") from exc
    with sink_cm as sink:
        for name in names:
            suite, status = suites[name]
            res = TaskResult(name=name, status=status.state, reason=status.reason, licence=suite.licence,
                             notes=suite.report_notes(prepared=bool(status)))
            results.append(res)
            if not status:
                res.status = "unavailable"
                continue
            rows = suite.load(source=config.source)  # prepares if needed, verifies the sha256 first
            res.status, res.reason = "ready", ""
            rows = selected_rows(name, rows, config)
            for _, rec in rows:
                rec.metadata["suite"] = name
                if config.adapter is not None:  # answered by the adapter (it never reaches the prompt)
                    rec.request = dataclasses.replace(rec.request, adapter=config.adapter)
            todo = [(i, rec) for i, rec in rows if (name, i) not in done]
            res.rows = len(rows)
            t0 = time.perf_counter()
            bar = tqdm(total=len(rows), initial=len(rows) - len(todo), desc=name, unit="req",
                       disable=not config.progress)
            meter = _BatchMeter(bar, engine)
            for part in _predictions(engine, todo, config, meter):
                tokens_before = res.input_tokens
                rows_out = [{"suite": name, "row": i, **decision} for (i, _), decision in part]
                _append_batch(sink, pred_path, rows_out)  # the whole batch lands, or none of it
                for ((i, rec), _), row in zip(part, rows_out):
                    done[(name, i)] = row
                    # throughput covers only what this invocation ran, never resumed rows
                    res.new_decisions += len(rec.targets)
                    res.input_tokens += row.get("usage", {}).get("input_tokens", 0)
                    if config.probe:  # the probe's requests ran in the same batches: their tokens count too
                        probed = (row.get("probe") or {}).get(config.probe) or {}
                        res.input_tokens += probed.get("usage", {}).get("input_tokens", 0)
                    if row.get("error") is None:
                        res.latencies.append(row.get("latency_s", 0.0))
                res.new_predictions += len(part)
                res.seconds = time.perf_counter() - t0
                if on_progress is not None:
                    on_progress(results)
                meter.landed(len(part), res.input_tokens - tokens_before)
            bar.close()
            res.seconds = time.perf_counter() - t0
            score_task(res, rows, done, out_dir, plots=config.plots, probe=config.probe)
    return results


def _append_batch(sink, path: Path, rows: list[dict]) -> None:
    """Append one batch of prediction rows to ``sink`` (the file opened ``"ab"``, unbuffered); on a write error (a full disk) cut the file
    back to where the batch began, so it holds only whole batches and the rows it holds are the rows
    counted, then raise.

    Raises:
        OutputWriteError: the write or the flush failed (naming ``path``).
    """
    from noulengine.writes import OutputWriteError

    data = memoryview("".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows).encode("utf-8"))
    start = sink.tell()
    try:
        while data:  # a raw write may take part of the bytes
            data = data[sink.write(data):]
    except OSError as exc:
        kept = "the rows of earlier batches are kept; rerun the same command to resume"
        try:
            sink.seek(start)
            sink.truncate(start)
        except OSError:  # not truncatable (a device): a torn last line is dropped when the run resumes
            kept = "a torn last line, if any, is dropped when the run resumes; " + kept
        raise OutputWriteError(path, exc, kept) from exc


class _BatchMeter:
    """Moves a suite's tqdm bar as the engine finishes each forward pass, not only when a chunk
    of predictions lands (one chunk of long requests can take minutes), with the input tokens/s
    of this invocation in the postfix.

    The engine reports passes in requests of its call, probe requests included; the bar counts
    rows, so a pass advances it by its share of the chunk's rows, and :meth:`landed` settles the
    bar on the rows written.
    """

    def __init__(self, bar, engine):
        self.bar, self.engine = bar, engine
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.chunk_rows = 0  # rows of the chunk in flight
        self.ran = 0  # requests of the engine call run so far
        self.shown = 0  # rows of the chunk the bar shows

    def start(self, rows: int) -> None:
        """A chunk of ``rows`` rows goes to the engine."""
        self.chunk_rows, self.ran, self.shown = rows, 0, 0

    def batch(self, n: int, total: int) -> None:
        """The engine ran a pass of ``n`` of the call's ``total`` requests."""
        self.ran += n
        self.tokens += (getattr(self.engine, "last_batch", None) or {}).get("tokens", 0)
        # never the whole chunk before it lands: the last rows appear when they are written
        step = min(self.chunk_rows * self.ran // max(total, 1), self.chunk_rows - 1) - self.shown
        if step > 0:
            self.bar.update(step)
            self.shown += step
        self._postfix()

    def landed(self, rows: int, tokens: int = 0) -> None:
        """``rows`` rows were written (the bar catches up with them); ``tokens``, their input
        tokens, count when no pass was reported for them (Ray actors run the passes)."""
        if not self.ran:
            self.tokens += tokens
        self.bar.update(rows - self.shown)
        self.shown = self.chunk_rows = self.ran = 0
        self._postfix()

    def _postfix(self) -> None:
        dt = time.perf_counter() - self.t0
        if self.tokens and dt > 0:
            self.bar.set_postfix_str(f"{self.tokens / dt:,.0f} tok/s", refresh=True)


def _predictions(engine, todo, config: EvalConfig, meter: _BatchMeter | None = None):
    """Yield lists of ``((row, record), Decision.to_dict())``: local chunks of ``config.chunk``
    requests, or, with ``config.ray``, each Ray batch as it finishes (one Dataset per suite).

    With ``config.probe`` each row's probe request runs beside it (in the same batches, or the
    same Ray Dataset) and a row is yielded only with its probe result attached. ``meter`` (local
    runs) hears of every forward pass."""
    if config.ray is not None:
        yield from _ray_predictions(todo, config)
        return
    for start in range(0, len(todo), config.chunk):
        chunk = todo[start:start + config.chunk]
        if meter is not None:
            meter.start(len(chunk))
        rows = decide_with_probe(engine, [rec.request for _, rec in chunk], config.probe,
                                 progress=None if meter is None else meter.batch)
        yield list(zip(chunk, rows))


def _ray_predictions(todo, config: EvalConfig):
    from noulengine.distributed.ray_data import iter_decisions

    requests = [rec.request for _, rec in todo]
    probe_of: dict[int, int] = {}  # row position -> index of its probe request
    if config.probe is not None:
        extra = []
        for j, (_, rec) in enumerate(todo):
            rev = reversed_request(rec.request)
            if rev is not None:
                probe_of[j] = len(todo) + len(extra)
                extra.append(rev)
        requests += extra
    owner = {k: j for j, k in probe_of.items()}
    own: dict[int, dict] = {}
    probes: dict[int, dict] = {}
    part = []
    for idx, decision in iter_decisions(requests, config.ray):
        j = owner.get(idx, idx)
        (probes if idx in owner else own)[j] = decision
        if j not in own or (j in probe_of and j not in probes):
            continue  # its partner has not landed yet
        part.append((todo[j], with_probe(own.pop(j), config.probe, probes.pop(j, None))))
        if len(part) >= config.chunk:
            yield part
            part = []
    if part:
        yield part


def score_task(res: TaskResult, rows, done: dict, out_dir: Path, *, plots: bool, probe: str | None = None) -> None:
    """Score one suite's ``rows`` from ``done`` predictions into ``res`` (metrics, slot labels, the
    reliability diagram, with ``probe`` the order probe's change share); the one scoring path for a
    run and for a merge of worker runs."""
    from noulengine.metrics import Scorer

    name = res.name
    res.rows = len(rows)
    scorer = Scorer(metadata_slices=get_suite(name).slices)
    for i, rec in rows:
        scorer.update(rec, done[(name, i)])
    res.metrics = scorer.compute()
    predictions = [done[(name, i)] for i, _ in rows]
    records = [rec for _, rec in rows]
    res.metrics["flip_rate"] = _mean_flip_rate(predictions)
    if probe is not None:  # beside the rotation flip rate: the share of answers reversal changed
        res.metrics["order_probe"] = change_summary(record_items(zip(records, predictions)), probe)
        res.metrics["reversal_change_share"] = res.metrics["order_probe"]["change_share"]
        if res.metrics["order_probe"]["missing"]:
            res.metrics["warnings"].append(f"{res.metrics['order_probe']['missing']} choice decisions have no "
                                           f"{probe} probe result (rows predicted without --probe); the change "
                                           "share counts the others only")
    res.metrics["x_mass"] = candidate_mass(predictions)
    res.metrics["duplicate_ids"] = repeated_ids(records)
    res.metrics["warnings"] += suite_warnings(res.metrics)
    res.slot_labels = shared_slot_labels(records)
    res.metrics["reliability"] = _reliability(scorer, out_dir, name) if plots else None


X_MASS_WARN = 0.01  # median candidate mass under which a suite is flagged


def error_rows_warning(metrics: dict) -> str | None:
    """The sentence for a suite whose decisions include error rows (None without any)."""
    counts = metrics.get("counts", {})
    if not counts.get("errors"):
        return None
    kinds = ", ".join(f"{k}: {v}" for k, v in counts.get("error_kinds", {}).items())
    return (f"{counts['errors']} of {counts['decisions']} decisions are error rows ({kinds}); they count as wrong, "
            "so the scores below measure the failures, not the model's answers (the messages are in "
            "predictions.jsonl)")


def suite_warnings(metrics: dict) -> list[str]:
    """Plain sentences for a suite's error rows, repeated ids and low candidate mass (from its metrics)."""
    out = []
    errors = error_rows_warning(metrics)
    if errors:
        out.append(errors)
    dup = metrics["duplicate_ids"]
    if dup["count"]:
        out.append(f"{dup['count']} record id(s) occur more than once ({', '.join(dup['ids'][:5])}"
                   f"{', ...' if dup['count'] > 5 else ''}); every row is scored, as the published protocol counts "
                   f"rows, so {dup['extra_rows']} row(s) are repeats")
    median = metrics["x_mass"]["median"]
    if median is not None and median < X_MASS_WARN:
        out.append(f"low candidate mass: the median x_mass is {median:.2g} (< {X_MASS_WARN}): the model puts almost "
                   "none of its next-token probability on the candidates, so the renormalised answer "
                   "probabilities rest on tiny numbers")
    return out


def repeated_ids(records) -> dict:
    """Record ids that occur on more than one row of a suite.

    Rows are scored one by one whatever their ids (the published protocols count rows), so a
    repeated id is reported, never silently merged or dropped.

    Returns:
        ``{"count": ids repeated, "extra_rows": rows beyond the first of each id, "ids": [...]}``.
    """
    seen: dict[str, int] = {}
    for rec in records:
        if rec.id is not None:
            seen[rec.id] = seen.get(rec.id, 0) + 1
    ids = sorted(k for k, n in seen.items() if n > 1)
    return {"count": len(ids), "extra_rows": sum(seen[k] - 1 for k in ids), "ids": ids}


def shared_slot_labels(records) -> dict[int, str]:
    """``{slot: label}`` for the slots whose label is the same in every scored question of a suite.

    A suite of one fixed question (AG News) names all its slots; a suite whose options vary by row
    names none, and the report says so instead of guessing.
    """
    seen: dict[int, set] = {}
    for rec in records:
        questions = {q.field: q for q in rec.request.questions}
        for fld in rec.targets:
            for slot, label in enumerate(questions[fld].labels):
                seen.setdefault(slot, set()).add((questions[fld].type, label))
    return {slot: next(iter(v))[1] for slot, v in seen.items() if len(v) == 1}


def candidate_mass(predictions) -> dict:
    """Median and low share of the answers' ``x_mass`` (candidates' raw probability mass).

    Returns:
        ``{"median", "low_share", "threshold", "n"}``: ``low_share`` is the share of answers with
        ``x_mass < X_MASS_WARN``; ``None`` values when no answer carries ``x_mass``.
    """
    vals = [a["x_mass"] for p in predictions for a in (p.get("answers") or {}).values()
            if isinstance(a, dict) and isinstance(a.get("x_mass"), (int, float))]
    if not vals:
        return {"median": None, "low_share": None, "threshold": X_MASS_WARN, "n": 0}
    return {"median": statistics.median(vals), "low_share": sum(v < X_MASS_WARN for v in vals) / len(vals),
            "threshold": X_MASS_WARN, "n": len(vals)}


def _mean_flip_rate(predictions) -> float | None:
    """Mean permutation flip rate over answers that carry one (``--debias permute``), else None."""
    rates = [a["flip_rate"] for p in predictions for a in (p.get("answers") or {}).values()
             if isinstance(a, dict) and a.get("flip_rate") is not None]
    return sum(rates) / len(rates) if rates else None


def _reliability(scorer, out_dir: Path, name: str) -> str | None:
    conf, ok = scorer.reliability_inputs()
    if conf.numel() == 0:
        return None
    from noulengine.metrics import plot_reliability

    path = out_dir / f"reliability_{name}.png"
    plot_reliability(conf, ok, path, title=f"{name}: reliability (15 bins)")
    return path.name
