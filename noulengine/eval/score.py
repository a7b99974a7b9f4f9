"""``noulengine score --suite S --predictions FILE``: score answers produced by any system.

Accepted prediction rows (JSONL), matched to suite rows by ``row`` (0-based) or else by ``id``:

* noulengine's own rows (``{"row"?, "id", "answers": {field: {"probabilities": {...}}}, "error"}``);
* ``/v1/systemone`` responses (``{"id", "answers": {field: {"type": "noul", "noul": p}}}``;
  choice/score answers carry ``probabilities``), wrapped as ``{"id": ..., "response": {...}}`` or
  given directly.

Every answer is validated before scoring (finite, in [0, 1], every candidate present, sum
within 0.01); an invalid or missing answer counts as an error, never as correct.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def to_answer_map(row: dict, record) -> dict:
    """Normalise one prediction row to the scorer's ``{"answers": {field: {"probabilities"}}, "error"}``.

    Raises:
        ValueError: ``response`` or ``answers`` is not an object, or an answer names a field the
            record does not ask.
    """
    body = row.get("response", row)
    if not isinstance(body, dict):
        raise ValueError(f"field 'response' must be an object, got {type(body).__name__}")
    if body.get("answers") is not None and not isinstance(body["answers"], dict):
        raise ValueError(f"field 'answers' must be an object of field -> answer, got {type(body['answers']).__name__}")
    questions = {q.field: q for q in record.request.questions}
    unknown = sorted(set(body.get("answers") or {}) - set(questions))
    if unknown:
        raise ValueError(f"answers name field(s) {unknown} that the row does not ask")
    if row.get("error") is not None:
        return {"answers": {}, "error": row["error"]}
    answers = {}
    for fld, ans in (body.get("answers") or {}).items():
        if not isinstance(ans, dict):
            continue
        if "probabilities" not in ans and ans.get("type") == "noul" and isinstance(ans.get("noul"), (int, float)):
            p = float(ans["noul"])
            ans = {**ans, "probabilities": {"no": 1.0 - p, "yes": p}}
        answers[fld] = ans
    return {"answers": answers, "error": None}


def score_file(suite_name: str, predictions: str | Path, *, source=None, sample: int | None = None, seed: int = 0,
               predicted_only: bool = False) -> dict:
    """Score a predictions file against a verified suite.

    Args:
        suite_name: a registered suite.
        predictions: JSONL rows with ``row`` (or a unique ``id``) and ``answers``.
        source: raw data folder.
        sample: score the fixed-seed sample of this many rows that ``eval --sample N --seed S``
            selects (predictions for other rows are counted, not scored).
        seed: the sample's seed.
        predicted_only: score only the selected rows that have a prediction; the missing rows
            are counted in ``rows_missing`` instead of scored as errors.

    Rows of the selection with no prediction count as errors (coverage < 1) unless
    ``predicted_only``. The report adds ``rows_selected``, ``rows_missing`` and
    ``predictions_outside_selection``.

    Raises:
        ValueError: listing every bad line (not UTF-8, not a JSON object, a row or id the suite
            does not have, a row predicted twice, an answer for a field the row does not ask).
    """
    from noulengine.eval.suites import get_suite
    from noulengine.metrics import Scorer
    from noulengine.records.errors import RecordError
    from noulengine.records.loader import iter_jsonl_lines, parse_json_line

    suite = get_suite(suite_name)
    rows = suite.load(source=source)
    by_row = {i: rec for i, rec in rows}
    by_id: dict[str, list[int]] = {}
    for i, rec in rows:
        by_id.setdefault(rec.id, []).append(i)
    got: dict[int, dict] = {}
    problems: list[str] = []  # every bad line is reported, not just the first
    for n, text in iter_jsonl_lines(predictions):
        try:
            if isinstance(text, RecordError):  # not UTF-8
                raise text
            row = parse_json_line(text, file=predictions, line=n)
            if not isinstance(row, dict):
                raise ValueError(f"{predictions}:{n}: expected a JSON object, got {type(row).__name__}")
            if row.get("suite") not in (None, suite_name):
                continue
            if "row" in row:
                if not isinstance(row["row"], int) or isinstance(row["row"], bool):
                    raise ValueError(f"{predictions}:{n}: field 'row' must be an integer, got {row['row']!r}")
                idx = row["row"]
            else:
                if not isinstance(row.get("id"), str):
                    raise ValueError(f"{predictions}:{n}: give 'row' (an integer) or 'id' (a string), got id {row.get('id')!r}")
                ids = by_id.get(row.get("id"), [])
                if len(ids) != 1:
                    raise ValueError(f"{predictions}:{n}: id {row.get('id')!r} matches {len(ids)} suite rows; give 'row'")
                idx = ids[0]
            if idx not in by_row:
                raise ValueError(f"{predictions}:{n}: suite {suite_name!r} has no row {idx}")
            if idx in got:
                raise ValueError(f"{predictions}:{n}: row {idx} predicted twice")
            try:
                got[idx] = to_answer_map(row, by_row[idx])
            except ValueError as exc:
                raise ValueError(f"{predictions}:{n}: {exc} (suite row {idx})") from None
        except ValueError as exc:  # RecordError is a ValueError
            problems.append(str(exc))
    if problems:
        shown = "\n".join(problems[:50]) + (f"\n... and {len(problems) - 50} more" if len(problems) > 50 else "")
        raise ValueError(f"{len(problems)} bad prediction line(s) in {predictions}:\n{shown}")
    selected = rows
    if sample is not None:
        from noulengine.eval.suites import sample_rows

        selected = sample_rows(rows, sample, seed=seed)
    chosen = {i for i, _ in selected}
    missing = [i for i, _ in selected if i not in got]
    if predicted_only:
        selected = [(i, rec) for i, rec in selected if i in got]
    scorer = Scorer(metadata_slices=suite.slices)
    for i, rec in selected:
        rec.metadata["suite"] = suite_name
        scorer.update(rec, got.get(i, {"answers": {}, "error": "missing prediction", "missing": True}))
    report = scorer.compute()
    report["predictions_matched"] = len(got)
    report["rows_selected"] = len(chosen)
    report["rows_missing"] = len(missing)
    report["predictions_outside_selection"] = sum(1 for i in got if i not in chosen)
    report["selection"] = {"sample": sample, "seed": seed if sample is not None else None,
                           "predicted_only": predicted_only}
    return report


def summary_table(suite_name: str, report: dict) -> str:
    """A short markdown table of a :func:`score_file` report, with its warnings."""
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    def num(x):
        return "n/a" if x is None else f"{x:.4f}"

    c, b = report["counts"], report.get("baselines") or {}
    lines = ["| suite | rows scored | rows missing | decisions | coverage | accuracy | chance | majority | NLL | Brier | ECE |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {suite_name} | {report['rows']} | {report['rows_missing']} | {c['decisions']} | {pct(c['coverage'])} | "
             f"{pct(report['accuracy'])} | {pct(b.get('chance'))} | {pct(b.get('majority'))} | {num(report['nll'])} | "
             f"{num(report['brier'])} | {num(report['ece'])} |"]
    if report["predictions_outside_selection"]:
        lines.append(f"\n{report['predictions_outside_selection']} prediction(s) outside the selected rows were not scored.")
    lines += [f"\nwarning: {w}" for w in report.get("warnings") or []]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="noulengine score", description=__doc__.split("\n")[0])
    p.add_argument("--suite", required=True, help="suite name (e.g. agnews)")
    p.add_argument("--predictions", required=True, help="JSONL predictions file")
    p.add_argument("--source", help="raw data folder")
    p.add_argument("--output", help="write the metrics JSON here")
    p.add_argument("--sample", type=int, help="score the fixed-seed sample of N rows that eval --sample N selects")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.add_argument("--predicted-only", action="store_true",
                   help="score only rows that have a prediction; missing rows are counted, not scored as errors")
    p.add_argument("--json", action="store_true", help="print the full metrics JSON instead of the short table")
    args = p.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        print("error: --sample must be at least 1", file=sys.stderr)
        return 2
    try:
        report = score_file(args.suite, args.predictions, source=args.source, sample=args.sample, seed=args.seed,
                            predicted_only=args.predicted_only)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2, allow_nan=False)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text if args.json else summary_table(args.suite, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
