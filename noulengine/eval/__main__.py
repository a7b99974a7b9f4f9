"""``python -m noulengine.eval --suite accuracy-v1 [...]`` (also ``noulengine eval``)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path


PROG = "python -m noulengine.eval"
EPILOG = """data and exit status:
  each selected suite's data is looked for before the model loads (--source DIR, else
  $NOULENGINE_DATA, else ../shared/data beside the clone; the layout: docs/evaluation.md#data).
  exit 2: no selected suite has its data (the message names every folder tried and what each
  suite expects where), or bad arguments. With some suites ready and some not, the ready ones run
  and the others are reported unavailable: exit 0 when the suites came from the collection's
  default list, exit 1 when --tasks named a suite (or a group holding one) that had no data.
  exit 1 also when a suite failed."""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    from noulengine.cli import add_engine_args, add_ray_args

    p = argparse.ArgumentParser(prog=prog, description="Evaluate a model on pinned benchmark suites: prints a "
                                "summary table and writes the full report (report.md), metrics.json, run.json and "
                                "predictions.jsonl into --output.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="accuracy-v1", help="the suite collection (default accuracy-v1)")
    p.add_argument("--tasks", help="comma-separated suites or groups (default: the collection's list)")
    p.add_argument("--limit", type=int, help="the first N rows of each suite")
    p.add_argument("--sample", type=int, help="a fixed-seed sample of N rows of each suite")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.add_argument("--output", help="run folder (default runs/eval-HASH, HASH from the model and the run's settings, "
                   "printed at the start: the same settings resume there, different ones never share it); an "
                   "existing predictions.jsonl there is resumed")
    p.add_argument("--source", help="raw data folder (default $NOULENGINE_DATA or ../shared/data); see the exit "
                   "status below")
    p.add_argument("--chunk", type=int, default=64, help="requests handed to the engine at a time")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-plots", action="store_true", help="skip the reliability diagrams (no matplotlib needed)")
    p.add_argument("--probe", choices=("reverse",), default=None,
                   help="reverse: also ask every choice question with its options in reverse order (extra requests "
                        "in the same batches) and report per suite the share of answers that change, beside the "
                        "rotation flip rate of --debias permute; part of the run key")
    from noulengine.cli import add_adapter_arg

    add_adapter_arg(p, "evaluate a LoRA adapter served unmerged on --model (its base): every row is answered by it, "
                       "with its own calibration; once (docs/adapters.md); part of the run key")
    shard = p.add_argument_group("sharding (docs/evaluation.md#sharded-runs)")
    shard.add_argument("--workers", type=int, metavar="N", help="split every selected suite into N shares by a stable "
                       "hash of the row id")
    shard.add_argument("--worker", type=int, metavar="R", help="run share R (0..N-1) into OUTPUT/worker-R/")
    shard.add_argument("--merge", action="store_true", help="check the N worker runs in OUTPUT and write the merged "
                       "run there (no model is loaded)")
    add_engine_args(p)
    add_ray_args(p)
    from noulengine.escalate.args import add_escalation_args

    add_escalation_args(p, thresholds=True)
    return p


def _run_key(args, engine, tasks) -> dict:
    """What must match for a run folder to be resumed (and, for worker runs, to be merged): the
    resolved settings the engine uses (:mod:`noulengine.eval.run_state`)."""
    from noulengine.eval.run_state import run_key

    key = run_key(engine.describe(adapter=args.use_adapter), suite=args.suite, limit=args.limit, sample=args.sample,
                  seed=args.seed, tasks=tasks, worker=args.worker, workers=args.workers, probe=args.probe)
    if args.use_adapter is not None:  # the rows are answered unmerged by this adapter (model_sha256: base + adapter)
        key["adapter"] = args.use_adapter
    return key


def _check_data(names: list[str], source, *, named: bool) -> tuple[int | None, list[str]]:
    """Look for each selected suite's data before the model loads.

    Returns:
        ``(exit status, missing_named)``: status 2 (with the message printed) when no suite has
        its data, else None; ``missing_named``, the suites without data that ``--tasks`` named
        (``named``), which make the run exit 1 once the others ran. A partial set is named on
        stderr here, at the top of the run.
    """
    from noulengine.eval.suites.discovery import check_data, no_data_message, partial_data_note
    from noulengine.eval.suites.paths import refuse_missing_data_folder

    if refuse_missing_data_folder(source):  # --source DIR or NOULENGINE_DATA=DIR naming no folder
        return 2, []
    check = check_data(names, source)
    if not check.missing:
        return None, []
    if not check.runnable:
        print(no_data_message(check), file=sys.stderr)
        return 2, []
    print(partial_data_note(check), file=sys.stderr)
    return None, check.missing if named else []


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def summary_text(metrics: dict, meta: dict) -> str:
    """The terminal summary of a run: one line per suite, the warnings' count, this and all
    invocations' throughput (report.md has the rest)."""
    rows = [("suite", "status", "rows", "coverage", "accuracy", "chance", "majority", "NLL", "ECE")]
    # option-order robustness, shown when measured: --probe reverse, and --debias permute's flip rate
    order = [("reversal changed", "reversal_change_share", "order_probe"), ("rotation flips", "flip_rate", None)]
    order = [o for o in order if any((m.get("metrics") or {}).get(o[2] or o[1]) is not None for m in metrics.values())]
    rows[0] += tuple(o[0] for o in order)
    n_warn = 0
    for name, m in metrics.items():
        x = m.get("metrics")
        if not x:
            rows.append((name, m["status"], *["-"] * (len(rows[0]) - 2)))
            continue
        n_warn += len(x.get("warnings") or [])
        base = x.get("baselines") or {}
        rows.append((name, m["status"], str(m["rows"]), _pct(x["counts"]["coverage"]), _pct(x["accuracy"]),
                     _pct(base.get("chance")), _pct(base.get("majority")), _num(x["nll"]), _num(x["ece"]),
                     *[_num(x.get(key)) for _, key, _ in order]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    t = meta.get("throughput") or {}
    merged = meta.get("merged_workers") is not None
    if t.get("requests") and not merged:
        lines.append(f"this invocation: {t['requests']} requests in {t['inference_seconds']:.1f} s "
                     f"({t['requests_per_s']:.2f} requests/s, {t['decisions_per_s']:.2f} decisions/s)")
    elif "requests" in t and not merged:
        lines.append("this invocation: no new requests (every row was already predicted)")
    tot = meta.get("totals") or {}
    if merged:
        lines.append(f"{tot.get('invocations')} worker invocations: {tot.get('requests')} requests in "
                     f"{tot.get('inference_seconds') or 0:.1f} s of inference (summed over the workers)")
    elif tot.get("invocations", 0) > 1:
        lines.append(f"all {tot['invocations']} invocations: {tot['requests']} requests in "
                     f"{tot['inference_seconds']:.1f} s of inference")
    for name, m in metrics.items():  # a constant answer hides behind an accuracy near the majority class
        for c in ((m.get("metrics") or {}).get("answer_concentration") or []):
            if c["constant"]:
                lines.append(f"constant answer: {name}: {c['field']} = {c['answer_label']!r} on "
                             f"{100 * c['answer_share']:.0f}% of {c['n']} (gold's most common: "
                             f"{100 * c['gold_share']:.0f}%)")
    if n_warn:
        lines.append(f"{n_warn} warning(s): see report.md")
    return "\n".join(lines)


def _finish(results, out: Path, meta: dict, what: str = "") -> int:
    """Write the run's outputs, print a summary and the folder; exit 1 when a suite failed."""
    from noulengine.eval.report import write_outputs

    metrics = write_outputs(results, out, meta)
    print(summary_text(metrics, meta))
    from noulengine.eval.runner import error_rows_warning

    for name, m in metrics.items():  # error rows also on stderr: they hide behind a low accuracy otherwise
        warning = error_rows_warning(m.get("metrics") or {})
        if warning:
            print(f"warning: {name}: {warning}", file=sys.stderr)
    print(f"{what}wrote {out}/ (report.md: the full report; metrics.json, run.json, predictions.jsonl)")
    failed = [n for n, m in metrics.items() if m["status"] not in ("ready", "preparable", "unavailable")]
    return 1 if failed else 0


def _merge(args) -> int:
    from noulengine.eval.merge import ShardMergeError, merge_runs
    from noulengine.eval.suites.errors import SuiteError
    from noulengine.writes import EXIT_WRITE_ERROR, OutputWriteError, write_error_from

    if args.workers is None or args.worker is not None:
        print("error: --merge takes --workers N (the number of worker runs) and no --worker", file=sys.stderr)
        return 2
    if not args.output:
        print("error: --merge takes --output (the folder the worker runs printed at their start)", file=sys.stderr)
        return 2
    out = Path(args.output)
    try:
        results, meta = merge_runs(out, args.workers, source=args.source, plots=not args.no_plots)
    except (ShardMergeError, SuiteError) as exc:
        print(f"error: cannot merge {out}: {exc}", file=sys.stderr)
        return 2
    except OutputWriteError as exc:  # a full disk: the worker runs are untouched; rerun the merge
        print(f"error: {exc}; the worker runs are untouched: rerun the merge", file=sys.stderr)
        return EXIT_WRITE_ERROR
    meta["command"] = f"{args.prog} " + " ".join(args.argv)
    meta["status"] = "finished"
    try:
        return _finish(results, out, meta, f"merged {args.workers} worker runs; ")
    except (OutputWriteError, OSError) as exc:
        print(f"error: {write_error_from(exc, out)}; the worker runs are untouched: rerun the merge", file=sys.stderr)
        return EXIT_WRITE_ERROR


def _warn_revision_change(worker: int, revision: str | None, previous: list[dict]) -> None:
    """Warn, before any row runs, when a shard worker resumes under another code revision than the
    one that predicted its rows on disk: should it predict a row, ``--merge`` refuses the worker
    (rows of two revisions), so the hours spent would be lost. A worker already complete predicts
    nothing and merges fine, hence a warning, not a refusal.

    Args:
        worker: the shard worker's number.
        revision: this checkout's revision (:func:`~noulengine.eval.report.git_revision`).
        previous: the earlier invocations as :class:`~noulengine.eval.run_state.InvocationLog`
            reads them (``log.previous``: a killed invocation's rows already credited to it).
    """
    from noulengine.eval.merge import prediction_revisions

    earlier = prediction_revisions({"invocations": previous})
    if not earlier or earlier == {revision}:
        return
    was = ", ".join(sorted(map(str, earlier)))
    head = f"warning: worker {worker}'s rows on disk were predicted under {was}; this checkout is {revision}. "
    single = next(iter(earlier))
    if len(earlier) > 1:
        tail = "--merge refuses this worker already (rows of several revisions): rerun it from scratch."
    elif single is None or "-dirty-" in single:
        tail = (f"If this invocation predicts any row, --merge will refuse the worker, and {single} cannot be "
                "checked out again (uncommitted changes, or no git): rerun the worker from scratch.")
    else:
        tail = (f"If this invocation predicts any row, --merge will refuse the worker (two revisions). To finish "
                f"it under one revision: git worktree add --detach DIR {single}, then run this command from DIR "
                "with --output naming the same folder.")
    print(head + tail, file=sys.stderr)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)  # before the imports below: --help needs no torch
    args.prog, args.argv = prog, list(argv if argv is not None else sys.argv[1:])
    args.use_adapter = None  # set from --adapter below (eval answers every row with it)
    from noulengine.cli import engine_from_args, ray_config_from_args
    from noulengine.eval.report import git_revision, invocation_totals, library_versions, throughput
    from noulengine.eval.run_state import InvocationLog, Terminated, default_output, key_differences, sigterm_raises
    from noulengine.eval.runner import EvalConfig, run_eval
    from noulengine.eval.suites import expand_tasks
    from noulengine.eval.suites.errors import SuiteError
    from noulengine.metrics.reliability import require_matplotlib

    from noulengine.eval.shards import check_shard_args, worker_dir
    from noulengine.eval.suites import get_suite
    from noulengine.threads import busy_note, cli_threads

    if args.merge:
        if not args.no_plots:
            try:
                require_matplotlib()
            except ImportError as exc:
                print(f"error: {exc}; or pass --no-plots", file=sys.stderr)
                return 2
        return _merge(args)
    try:
        check_shard_args(args.worker, args.workers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    try:
        names = expand_tasks(tasks, collection=args.suite)  # unknown names fail before the model loads
        if not args.no_plots:
            require_matplotlib()  # not after an hour of inference
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"error: {exc}; or pass --no-plots", file=sys.stderr)
        return 2
    from noulengine.escalate.args import config_from_args as escalation_from_args, thresholds_from_args

    try:  # before the model loads: a bad threshold costs no inference
        escalation = escalation_from_args(args)
        thresholds = thresholds_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if escalation is not None and args.workers is not None:
        print("error: --escalate-url runs on a whole run: merge the worker runs, then rerun the same command "
              "without --workers/--worker (the predictions are resumed, only the escalation step runs)",
              file=sys.stderr)
        return 2
    from noulengine.cli import adapter_specs as parse_adapter_specs

    adapter_specs = parse_adapter_specs(args.adapter)
    if len(adapter_specs) > 1:
        print("error: eval takes one --adapter (every row is answered by it); run one evaluation per adapter",
              file=sys.stderr)
        return 2
    args.use_adapter = next(iter(adapter_specs), None)
    status, missing_named = _check_data(names, args.source, named=tasks is not None)
    if status is not None:
        return status
    ray_config = ray_config_from_args(args) if args.ray else None
    busy = None
    if ray_config is None:
        threads = cli_threads(args.workers)  # NOULENGINE_THREADS, else the usable cores shared among --workers
        busy = busy_note(threads)  # printed once, now (run.json and report.md keep it)
    else:  # each actor runs --cpus-per-actor threads (noulengine.distributed.ray_data)
        threads = {"threads": max(1, int(ray_config.num_cpus)) if not ray_config.num_gpus else None,
                   "source": "--cpus-per-actor (each Ray actor)"}
    revision = git_revision()  # the code that runs is the code checked out now, not at the end
    t_load = time.perf_counter()
    engine = engine_from_args(args, adapters=adapter_specs)
    load_s = time.perf_counter() - t_load
    key = _run_key(args, engine, tasks)
    base = Path(args.output) if args.output else default_output(key)
    if not args.output:
        print(f"output: {base} (from the model and the run's settings; --output DIR to choose)", file=sys.stderr)
    out = base if args.workers is None else worker_dir(base, args.worker)
    key_path = out / "run_key.json"
    if key_path.is_file() and (out / "predictions.jsonl").is_file():
        old = json.loads(key_path.read_text())
        diff = key_differences(old, key, given={"readout": args.readout, "calibration": args.calibration})
        if diff:
            print(f"error: {out} holds predictions of a different run ({'; '.join(diff)}); use another --output",
                  file=sys.stderr)
            return 2
    from noulengine.writes import (EXIT_WRITE_ERROR, OutputWriteError, is_write_failure, write_error_from,
                                   write_text_atomic)

    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(key_path, json.dumps(key, indent=2) + "\n")
    except OSError as exc:  # a full disk or a read-only folder: one line, nothing started
        print(f"error: {OutputWriteError(key_path, exc)}", file=sys.stderr)
        return EXIT_WRITE_ERROR
    except OutputWriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_WRITE_ERROR
    cfg = EvalConfig(suite=args.suite, tasks=tasks, limit=args.limit, sample=args.sample, seed=args.seed,
                     output=str(out), chunk=args.chunk, source=args.source, progress=not args.no_progress,
                     plots=not args.no_plots, worker=args.worker, workers=args.workers, ray=ray_config,
                     probe=args.probe, adapter=args.use_adapter)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = {"suite": args.suite, "git_revision": revision, "engine": engine.describe(adapter=args.use_adapter),
            "threads": threads,
            "versions": library_versions(),
            "selection": {"limit": args.limit, "sample": args.sample, "seed": args.seed,
                          **({"worker": args.worker, "workers": args.workers} if args.workers is not None else {})},
            **({"probe": args.probe} if args.probe else {}),
            **({"ray": {"address": ray_config.address, "actors": ray_config.actors, "cpus_per_actor": ray_config.num_cpus,
                        "gpus_per_actor": ray_config.num_gpus, "batch_size": ray_config.batch_size}}
               if ray_config is not None else {}),
            "model_load_s": load_s, "command": f"{prog} " + " ".join(args.argv),
            **({"cpu_busy_at_start": busy} if busy else {})}
    # run.json records this invocation now and after every batch: a kill keeps its timing
    from noulengine.eval.runner import read_predictions

    log = InvocationLog(out / "run.json", meta, {"started": started, "git_revision": revision, "model_load_s": load_s,
                                                 "threads": threads.get("threads")},
                        predictions=list(read_predictions(out / "predictions.jsonl", repair=False).values()))
    if args.workers is not None:
        _warn_revision_change(args.worker, revision, log.previous)
    try:
        log.update([], force=True)
    except OutputWriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_WRITE_ERROR
    log.start_heartbeat()  # a kill no handler sees loses at most one heartbeat of wall time
    t0 = time.perf_counter()
    try:
        with sigterm_raises():
            results = run_eval(engine, cfg, on_progress=log.update)
    except SuiteError as exc:
        log.close("failed")
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OutputWriteError, OSError) as exc:  # a full disk (predictions, plots): whole batches only; resumable
        if not is_write_failure(exc):
            log.stop_heartbeat()
            raise
        try:
            log.close("failed")  # records the rows that landed, when run.json can still be written
        except OutputWriteError:
            pass  # the next invocation counts them from predictions.jsonl (InvocationLog rows)
        print(f"error: {write_error_from(exc, out)}", file=sys.stderr)
        return EXIT_WRITE_ERROR
    except KeyboardInterrupt:
        log.close("interrupted")  # the predictions so far stay; rerun the same command to resume
        raise
    except Terminated:
        log.close("terminated")  # as interrupted, by SIGTERM: its wall time runs to the signal
        raise
    except BaseException:
        log.stop_heartbeat()  # a crash: run.json keeps the last heartbeat, as after a SIGKILL
        raise
    revision_at_end = git_revision()
    meta.update({"tasks": [r.name for r in results],
                 **({"git_revision_at_end": revision_at_end} if revision_at_end != revision else {}),
                 "suite_sha256": {r.name: get_suite(r.name).prepared_pins() for r in results if r.status == "ready"},
                 "wall_s": time.perf_counter() - t0, "status": "finished"})
    meta["throughput"] = throughput(results)
    meta["invocations"] = log.finish(results)
    meta["totals"] = invocation_totals(meta["invocations"])
    try:
        status = _finish(results, out, meta)  # the busy-CPU note was printed once, at the start; run.json keeps it
    except (OutputWriteError, OSError) as exc:  # the predictions are whole: rerun the same command to write these
        print(f"error: {write_error_from(exc, out)}; the predictions are complete: rerun the same command to write "
              "the report", file=sys.stderr)
        return EXIT_WRITE_ERROR
    if missing_named:
        print(f"error: --tasks named {', '.join(missing_named)}, which had no data (reported as unavailable); "
              "the other suites ran", file=sys.stderr)
        status = max(status, 1)
    if escalation is not None:
        from noulengine.eval.escalation import EscalationRunError, run_escalation_step, table_markdown

        try:
            table = run_escalation_step(results, cfg, escalation, thresholds, out, progress=not args.no_progress)
        except EscalationRunError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except (OutputWriteError, OSError) as exc:  # a full disk: the LLM answers landed so far are kept
            if not is_write_failure(exc):
                raise
            print(f"error: {write_error_from(exc, out)}; the LLM answers written so far are kept: rerun the same "
                  "command to resume", file=sys.stderr)
            return EXIT_WRITE_ERROR
        print(table_markdown(table, escalation))
        print(f"wrote {out}/escalation.md and escalation.json (LLM answers: {out}/escalations.jsonl)")
    return status

if __name__ == "__main__":
    sys.exit(main())
