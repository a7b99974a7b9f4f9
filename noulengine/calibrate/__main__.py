"""``noulengine calibrate``: fit temperatures on a validation file's calibration rows.

Usage::

    noulengine calibrate --validation val.jsonl [--validation more.jsonl] [--test test.jsonl]
        [--model PATH] [--readout MODE] [--debias MODE] [--group global|type|type+options]
        [--min-rows 50] [--limit-per-role N] [--output calibration.json]

Writes the calibration JSON, two reliability diagrams (``<output stem>_reliability_{before,after}.png``)
and prints a summary. Exit status: 0 ok, 2 refused input, 3 selection NLL got worse (file still written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from noulengine.cli import add_engine_args

    ap = argparse.ArgumentParser(prog="noulengine calibrate", description=__doc__.replace("``", ""),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--validation", action="append", required=True,
                    help="validation JSONL with validation_role calibration/selection rows (repeatable)")
    ap.add_argument("--test", action="append", default=[], help="a test file that must share no id or content")
    ap.add_argument("--group", default="type+options", choices=("global", "type", "type+options"),
                    help="one temperature per group (default type+options, with fallback to the parent)")
    ap.add_argument("--min-rows", type=int, default=50, help="rows a group needs for its own temperature")
    ap.add_argument("--limit-per-role", type=int, default=None,
                    help="use at most N rows per role and file (label round-robin in file order)")
    ap.add_argument("--output", default="calibration.json", help="the calibration file to write")
    ap.add_argument("--no-plots", action="store_true", help="skip the reliability diagrams")
    ap.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_engine_args(ap, skip=("calibration",))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before the imports below: --help needs no torch
    from noulengine.calibrate.report import plot_before_after, summary_text
    from noulengine.calibrate.run import run_calibration
    from noulengine.calibrate.temperature import NonFiniteFitError
    from noulengine.calibrate.validation import ValidationFileError, limit_per_role, load_validation
    from noulengine.cli import engine_from_args

    try:
        vset = load_validation(args.validation, test_paths=args.test)
    except ValidationFileError as exc:
        print(f"error: refusing the validation data: {exc}", file=sys.stderr)
        return 2
    if args.min_rows < 1 or (args.limit_per_role is not None and args.limit_per_role < 1):
        print("error: --min-rows and --limit-per-role must be at least 1", file=sys.stderr)
        return 2
    args.calibration = "none"  # fit from raw logits, never on top of a model's shipped temperatures
    from noulengine.threads import cli_threads

    cli_threads()  # NOULENGINE_THREADS, else the usable physical cores
    engine = engine_from_args(args)
    total = len(limit_per_role(vset.calibration, args.limit_per_role)) + len(
        limit_per_role(vset.selection, args.limit_per_role))
    from tqdm import tqdm

    bar = tqdm(total=total, unit="req", file=sys.stderr, disable=args.no_progress)
    try:
        run = run_calibration(engine, vset, group_by=args.group, min_rows=args.min_rows,
                              limit_per_role_n=args.limit_per_role, progress=bar.update)
    except NonFiniteFitError as exc:  # never write a temperature from a non-finite fit
        print(f"error: {exc}; nothing written", file=sys.stderr)
        return 2
    finally:
        bar.close()
    from noulengine.writes import EXIT_WRITE_ERROR, OutputWriteError, write_error_from, write_text_atomic

    out = Path(args.output)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not args.no_plots:
            try:
                pngs = plot_before_after(run, out.parent / f"{out.stem}_reliability")
                run.data["reliability_diagrams"] = [str(p) for p in pngs]
            except ImportError as exc:
                run.data["warnings"].append(f"no reliability diagrams: {exc}")
        write_text_atomic(out, json.dumps(run.data, indent=2) + "\n")
    except (OutputWriteError, OSError) as exc:  # a full disk: one line; no calibration file, or the old one intact
        print(f"error: {write_error_from(exc, out)}", file=sys.stderr)
        return EXIT_WRITE_ERROR
    print(summary_text(run.data))
    print(f"wrote {out}")
    if run.data["selection_nll_worse"]:  # the summary's warning line says so (once); the status tells scripts
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
