"""``noulengine score --suite S --predictions FILE``: score answers produced by any system.

``S`` is a suite (``agnews``), a group (``jevbench``: its three tiers) or a collection
(``accuracy-v1``: its default task list), as ``eval`` runs them; each suite is scored on its own.

Prediction rows (JSONL: UTF-8, one JSON object per line; ``eval``'s ``predictions.jsonl`` is one):

* ``suite``: the suite the row answers; rows of other suites are skipped. Needed when ``S`` names
  several suites; optional for one.
* ``row``: the 0-based row of the suite's prepared file; or else ``id``, a record id that occurs
  once in the suite.
* ``answers``: ``{field: {"probabilities": {label: p, ...}}}`` with every candidate label of the
  question, each p finite and in [0, 1], summing to 1 within 0.01; a ``noul`` answer may instead be
  ``{"type": "noul", "noul": p}`` (P(yes)). ``error``: non-null marks an error row.
* or a ``/v1/systemone`` response, given directly or as ``{"id": ..., "response": {...}}``.

Which rows are scored: the suite's rows (``--sample N --seed S``: the fixed-seed sample ``eval``
selects). When the predictions cover only some of them, the output says so first and only the
predicted rows are scored (a 20-row sample is scored as 20 rows, not as 0.3% coverage of the suite);
``--count-missing`` scores every selected row instead, the missing ones as errors, and states the
predicted rows' own accuracy beside it (the number scoring without it gives).

Every answer is validated before scoring: an invalid answer, a missing field, an error row or a line
that cannot be read (not JSON: a NaN, a repeated key, a truncated object) is an error (never
correct, lowers coverage) and is listed with its line, record id, field and rule (``error_rows`` in
the JSON, and below the table); the other rows are scored. An unreadable line whose row cannot be
told (no readable ``row`` or ``id``) is listed by its line (``unmatched_lines``) and predicts no row.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from noulengine.records.errors import RecordError


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


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _unrepeated(pairs: list) -> dict:
    """A JSON object without its repeated keys: a row named twice on one line names no row."""
    counts = Counter(k for k, _ in pairs)
    return {k: v for k, v in pairs if counts[k] == 1}


def _lenient_object(text: str) -> dict | None:
    """A line the strict parser refused, read leniently only to tell which suite row it answers
    (never to score it): the whole object, less any repeated key, when a NaN, an Infinity or a
    repeated key was the problem; else its leading complete top-level fields (``suite``, ``row`` and
    ``id`` come first in eval's rows, so a truncated line still names its row); None when not even
    the first field reads."""
    try:
        obj = json.loads(text, object_pairs_hook=_unrepeated)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        return obj
    decoder, fields = json.JSONDecoder(), {}
    space = lambda at: _JSON_SPACE.match(text, at).end()  # noqa: E731 - the index of the next non-blank
    pos = space(0)
    if not text.startswith("{", pos):
        return None
    pos = space(pos + 1)
    try:
        while text.startswith('"', pos):
            key, pos = decoder.raw_decode(text, pos)
            pos = space(pos)
            if not text.startswith(":", pos):
                break
            value, pos = decoder.raw_decode(text, space(pos + 1))
            fields.setdefault(key, value)
            pos = space(pos)
            if not text.startswith(",", pos):
                break
            pos = space(pos + 1)
    except (ValueError, RecursionError):  # the first field that does not read: the fields before it
        pass
    return fields or None


def _read_line(text, predictions, n: int) -> tuple[dict | None, RecordError | None]:
    """``(row, None)`` for a readable prediction line (``text`` as
    :func:`~noulengine.records.loader.iter_jsonl_lines` yields it); ``(what a lenient read finds or
    None, RecordError)`` for one that is not UTF-8, not strict JSON or not an object."""
    from noulengine.records.errors import RecordError
    from noulengine.records.loader import parse_json_line

    if isinstance(text, RecordError):  # not UTF-8
        return None, text
    try:
        row = parse_json_line(text, file=predictions, line=n)
    except RecordError as exc:
        return _lenient_object(text), exc
    if not isinstance(row, dict):
        return None, RecordError(f"expected a JSON object, got {type(row).__name__}", file=predictions, line=n)
    return row, None


def _suite_row(row: dict, where: str, single: str | None, by_row: dict, by_id: dict) -> tuple[str, int | None]:
    """``(suite, suite row)`` a prediction row answers; the row is None for a suite not scored.

    Raises:
        ValueError: no ``suite`` when several are scored, a ``row`` that is not an integer or that the
            suite lacks, an ``id`` that matches no row or several.
    """
    name = row.get("suite", single)
    if name is None:
        raise ValueError(f"{where}: field 'suite' is needed when scoring several suites ({', '.join(by_row)})")
    if name not in by_row:
        return name, None
    if "row" in row:
        if not isinstance(row["row"], int) or isinstance(row["row"], bool):
            raise ValueError(f"{where}: field 'row' must be an integer, got {row['row']!r}")
        idx = row["row"]
    else:
        if not isinstance(row.get("id"), str):
            raise ValueError(f"{where}: give 'row' (an integer) or 'id' (a string), got id {row.get('id')!r}")
        ids = by_id.get(name, {}).get(row.get("id"), [])
        if len(ids) != 1:
            raise ValueError(f"{where}: id {row.get('id')!r} matches {len(ids)} rows of suite {name!r}; give 'row'")
        idx = ids[0]
    if idx not in by_row[name]:
        raise ValueError(f"{where}: suite {name!r} has no row {idx}")
    return name, idx


def _match_rows(predictions, names: list[str], loaded: dict) -> tuple[dict, int, list[dict]]:
    """Read the predictions file: ``({suite: {row: (line, answer map)}}, rows of other suites,
    unmatched unreadable lines)``.

    A line that cannot be read (not UTF-8, not JSON: a NaN, a repeated key, a truncated object; a
    blank line; not an object) refuses nothing, like an invalid answer: when a lenient read still
    names its suite row (``row`` or ``id``), that row is predicted and each of its decisions is an
    ``unreadable_line`` error; otherwise the line is returned as a
    :class:`~noulengine.records.errors.RecordError` dict (file, line, record id when readable, rule,
    ``kind: "unreadable_line"``).

    Raises:
        ValueError: when a line is readable but names no row the suites have, names a row twice, or
            answers a field its row does not ask: listing every such line and every unreadable one.
    """
    from noulengine.records.errors import RecordError
    from noulengine.records.loader import iter_jsonl_lines

    single = names[0] if len(names) == 1 else None
    by_id: dict[str, dict[str, list[int]]] = {}
    for name in names:
        for i, rec in loaded[name]:
            by_id.setdefault(name, {}).setdefault(rec.id, []).append(i)
    by_row = {name: dict(loaded[name]) for name in names}
    got: dict[str, dict[int, tuple[int, dict]]] = {name: {} for name in names}
    other = 0
    problems: list[tuple[int, str]] = []  # every bad line is reported, not just the first
    unreadable: list[tuple[int, str]] = []  # listed with them when the file is refused for another reason
    unmatched: list[dict] = []
    for n, text in iter_jsonl_lines(predictions):
        where = f"{predictions}:{n}"
        row, bad = _read_line(text, predictions, n)
        if bad is not None:
            unreadable.append((n, str(bad)))
        try:
            if row is None:  # nothing on the line names a row: listed by its line below
                raise bad
            name, idx = _suite_row(row, where, single, by_row, by_id)
            if idx is None:
                other += 1
                continue
            if idx in got[name]:
                raise ValueError(f"{where}: row {idx} predicted twice")
            if bad is not None:
                got[name][idx] = (n, {"answers": {}, "error": None, "unreadable": bad})
                continue
            try:
                got[name][idx] = (n, to_answer_map(row, by_row[name][idx]))
            except ValueError as exc:
                raise ValueError(f"{where}: {exc} (suite row {idx})") from None
        except ValueError as exc:  # RecordError is a ValueError
            if bad is None:
                problems.append((n, str(exc)))
                continue
            rid = bad.record_id
            if rid is None and row is not None and isinstance(row.get("id"), str):
                rid = row["id"]
            entry = RecordError(bad.rule, record_id=rid, field=bad.field, file=str(predictions), line=n).to_dict()
            unmatched.append({**entry, "kind": "unreadable_line", "row": None})
    if problems:
        listed = [msg for _, msg in sorted(problems + unreadable)]
        shown = "\n".join(listed[:50]) + (f"\n... and {len(listed) - 50} more" if len(listed) > 50 else "")
        raise ValueError(f"{len(listed)} bad prediction line(s) in {predictions}:\n{shown}")
    return got, other, unmatched


def _error_rows(scorer, fed, got: dict, predictions) -> list[dict]:
    """One entry per decision that a prediction row has but that could not be scored: its record
    id, field and rule (a :class:`~noulengine.records.errors.RecordError` dict) and suite row."""
    from noulengine.metrics.validation import validate_answer
    from noulengine.records.errors import RecordError

    out = []
    for d in scorer.decisions:
        if d.error is None or d.error == "missing_prediction":
            continue
        i, rec = fed[d.row]
        line, amap = got[i]
        if d.error == "invalid_answer":
            q = next(q for q in rec.request.questions if q.field == d.field)
            rule = "; ".join(validate_answer(amap["answers"][d.field], q.labels))
        elif d.error == "missing_answer":
            rule = "no answer for this field"
        elif d.error == "unreadable_line":
            bad = amap["unreadable"]
            rule = f"the line cannot be read: {bad.rule}" + (f" (at {bad.field})" if bad.field else "")
        else:
            err = amap.get("error")
            msg = err.get("message") if isinstance(err, dict) else err
            rule = f"the prediction is an error row: {msg}"
        entry = RecordError(rule, record_id=rec.id, field=d.field, file=str(predictions), line=line).to_dict()
        out.append({**entry, "kind": d.error, "row": i})
    return out


def _same_rows_as_eval(rows, predicted: set[int]) -> str | None:
    """The ``eval`` selection flags whose rows are exactly ``predicted`` (seed 0 samples, limits)."""
    from noulengine.eval.suites import limit_rows, sample_rows

    n = len(predicted)
    if {i for i, _ in sample_rows(rows, n, seed=0)} == predicted:
        return f"--sample {n} --seed 0"
    if {i for i, _ in limit_rows(rows, n)} == predicted:
        return f"--limit {n}"
    return None


def _score_suite(name: str, rows, got: dict, predictions, *, sample, seed, count_missing: bool) -> dict:
    """The report of one suite (see :func:`score_file`)."""
    from noulengine.eval.suites import get_suite, sample_rows
    from noulengine.metrics import Scorer

    selected = sample_rows(rows, sample, seed=seed) if sample is not None else list(rows)
    chosen = {i for i, _ in selected}
    missing = [i for i, _ in selected if i not in got]
    predicted = len(chosen) - len(missing)
    notes = []
    covers = (f"{name}: {predictions} has predictions for {predicted:,} of the "
              + (f"suite's {len(chosen):,} rows" if sample is None else f"{len(chosen):,} sampled rows"))
    if missing and count_missing:
        notes.append(f"{covers}; the other {len(missing):,} count as errors (--count-missing)")
    elif missing:
        selected = [(i, rec) for i, rec in selected if i in got]
        same = _same_rows_as_eval(rows, chosen - set(missing)) if sample is None else None
        notes.append(f"{covers}: scoring those {predicted:,} rows only (the {len(missing):,} without a prediction are "
                     "not scored; --count-missing counts them as errors)"
                     + (f"; they are the rows eval {same} selects" if same else ""))
    scorer = Scorer(metadata_slices=get_suite(name).slices)
    fed = []
    for i, rec in selected:
        rec.metadata["suite"] = name
        fed.append((i, rec))
        scorer.update(rec, got[i][1] if i in got else {"answers": {}, "error": "missing prediction", "missing": True})
    report = scorer.compute()
    report["predictions_matched"] = len(got)
    report["rows_selected"] = len(chosen)
    report["rows_predicted"] = predicted
    report["rows_missing"] = len(missing)
    report["rows_scored"] = len(selected)
    report["predictions_outside_selection"] = sum(1 for i in got if i not in chosen)
    report["selection"] = {"sample": sample, "seed": seed if sample is not None else None,
                           "predicted_only": not count_missing, "count_missing": count_missing}
    report["error_rows"] = _error_rows(scorer, fed, got, predictions)
    report["notes"] = notes
    report["accuracy_predicted"] = report["accuracy"]
    if missing and count_missing:  # the accuracy counts absent answers as wrong: judge the answers apart
        from noulengine.metrics.scorer import baseline_warnings, summarize

        # The predicted rows alone, summarised exactly as scoring without --count-missing does: the
        # figure for the answers is one number in both modes.
        own = summarize([d for d in scorer.decisions if fed[d.row][0] in got], n_bins=scorer.n_bins)
        report["accuracy_predicted"] = own["accuracy"]
        c = report["counts"]
        absent = sum(1 for d in scorer.decisions if fed[d.row][0] not in got)
        kept = [w for w in report["warnings"] if w not in baseline_warnings(report["accuracy"], report["baselines"])]
        report["warnings"] = [f"decisions without a prediction line: {absent:,} of {c['decisions']:,}, counted wrong, "
                              f"so accuracy ({_pct(report['accuracy'])}) measures coverage as well as the answers; "
                              f"over the {predicted:,} predicted rows alone (as scored without --count-missing) it is "
                              f"{_pct(own['accuracy'])}",
                              *(f"over the predicted rows, {w}" for w in baseline_warnings(own["accuracy"],
                                                                                            own["baselines"])),
                              *kept]
    return report


def score_file(suite_name: str, predictions: str | Path, *, source=None, sample: int | None = None, seed: int = 0,
               predicted_only: bool = False, count_missing: bool = False) -> dict:
    """Score a predictions file against a verified suite, group or collection.

    Args:
        suite_name: a suite (``agnews``), a group (``jevbench``) or a collection (``accuracy-v1``).
        predictions: JSONL rows with ``row`` (or a unique ``id``), ``answers`` and, for several
            suites, ``suite`` (the module docstring has the format).
        source: raw data folder.
        sample: score the fixed-seed sample of this many rows (per suite) that
            ``eval --sample N --seed S`` selects (predictions for other rows are counted, not scored).
        seed: the sample's seed.
        predicted_only: score only the selected rows that have a prediction (the default; kept
            for callers that ask for it explicitly).
        count_missing: score every selected row, those without a prediction as errors
            (``missing_prediction``, lowering coverage).

    Returns:
        For one suite, its report: the :class:`~noulengine.metrics.Scorer` report plus
        ``rows_selected``, ``rows_missing``, ``rows_scored``, ``predictions_outside_selection``,
        ``selection``, ``error_rows`` (every unscorable decision with its record id, field, rule,
        file and line) and ``notes`` (first among them, when the predictions cover only some of the
        selected rows, a sentence saying so); ``rows_predicted`` (selected rows with a prediction
        line), ``accuracy_predicted`` (the accuracy over those rows alone: ``accuracy`` itself unless
        ``count_missing`` scored missing rows too). For a group or collection: ``{"suite", "kind",
        "suites": {name: report, or {"status", "reason"} for a suite not scored}, "notes"}``. Both
        shapes carry ``lines_unreadable`` (how many lines could not be read) and ``unmatched_lines``
        (those of them that name no row: RecordError dicts with file, line and rule).

    Raises:
        ValueError: listing every readable line that names a row or id the suite does not have, a
            row predicted twice, an answer for a field the row does not ask, or no ``suite`` when
            scoring several suites (a line that cannot be read is an error row instead, never a
            refusal); or no prediction is for a scored suite; ``predicted_only`` with
            ``count_missing``.
        SuiteError: the name is unknown (with a did-you-mean), or a single suite is unavailable.
    """
    from noulengine.eval.suites import get_suite, resolve_suites

    if predicted_only and count_missing:
        raise ValueError("predicted_only and count_missing exclude each other")
    kind, names = resolve_suites(suite_name)
    loaded, skipped = {}, {}
    for name in names:
        suite = get_suite(name)
        if kind != "suite":
            status = suite.available(source)
            if not status:
                skipped[name] = {"status": "unavailable", "reason": status.reason}
                continue
        loaded[name] = suite.load(source=source)
    names = [n for n in names if n in loaded]
    got, other, unmatched = _match_rows(predictions, names, loaded) if names else ({}, 0, [])
    elsewhere = f" ({other} row(s) are for other suites)" if other else ""
    if unmatched:
        elsewhere += (f" ({len(unmatched)} line(s) cannot be read and name no row; the first: "
                      f"{unmatched[0]['message']})")
    reports: dict[str, dict] = {}
    for name in names:
        if not got[name] and not count_missing:
            skipped[name] = {"status": "not predicted", "reason": f"no row of {predictions} is for suite {name!r}"}
            continue
        reports[name] = _score_suite(name, loaded[name], got[name], predictions, sample=sample, seed=seed,
                                     count_missing=count_missing)
    if not reports:
        raise ValueError(f"no row of {predictions} is for {'suite' if kind == 'suite' else kind} {suite_name!r}"
                         f"{elsewhere}; nothing to score")
    attributed = sum(1 for rows in got.values() for _, amap in rows.values() if amap.get("unreadable"))
    lines = {"lines_unreadable": attributed + len(unmatched), "unmatched_lines": unmatched}
    unread = ([f"{len(unmatched)} line(s) of {predictions} cannot be read and name no row, so no row is scored for "
               "them; they are listed below"] if unmatched else [])
    if kind == "suite":
        report = reports[suite_name]
        return {"suite": suite_name, **report, "notes": [*unread, *report["notes"]], **lines}
    notes = [*unread, *(n for r in reports.values() for n in r["notes"])]
    notes += [f"{name}: {info['status']}: {info['reason']}" for name, info in skipped.items()]
    return {"suite": suite_name, "kind": kind, "suites": {n: reports.get(n) or skipped[n] for n in
                                                          [*reports, *skipped]}, "notes": notes, **lines}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


TABLE_HEAD = ["| suite | rows predicted | rows missing | decisions | coverage | accuracy | chance | majority | NLL | "
              "NLL floored | Brier | ECE |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
ERROR_ROWS_SHOWN = 20


def _legend() -> str:
    """What each column of :data:`TABLE_HEAD` counts: one definition, whichever rows are scored."""
    from noulengine.metrics.constants import PROB_FLOOR  # torch-free: --help must not load torch

    return ("rows predicted / missing: selected rows (the suite, or its --sample) with / without a prediction line. "
            "decisions: the gold-labelled questions of the predicted rows (with --count-missing, of the missing rows "
            "too). coverage: share of decisions with a valid answer. accuracy: correct / decisions (no valid answer "
            "= wrong); chance, majority: a uniform guess, always the most frequent gold option, on the same "
            "decisions. NLL, Brier, ECE: on the decisions with a valid answer; NLL floored: how many of those gave "
            f"the gold label p <= {PROB_FLOOR:g} (each adds {-math.log(PROB_FLOOR):.1f} nats to NLL).")


def _table_row(name: str, report: dict) -> str:
    c, b = report["counts"], report.get("baselines") or {}
    cells = [name, report["rows_predicted"], report["rows_missing"], c["decisions"], _pct(c["coverage"]),
             _pct(report["accuracy"]), _pct(b.get("chance")), _pct(b.get("majority")), _num(report["nll"]),
             report.get("nll_floored", 0), _num(report["brier"]), _num(report["ece"])]
    return "| " + " | ".join(str(x) for x in cells) + " |"


def summary_table(suite_name: str, report: dict) -> str:
    """A short markdown table of a :func:`score_file` report: notes first (a partial coverage),
    then one line per suite, the unscorable decisions (id, field, rule) and the warnings."""
    reports = report["suites"] if "suites" in report else {suite_name: report}
    scored = {n: r for n, r in reports.items() if "counts" in r}
    notes = report.get("notes") or []
    lines = [*(f"note: {n}" for n in notes), *([""] if notes else []), *TABLE_HEAD]
    lines += [_table_row(n, r) for n, r in scored.items()]
    lines += ["", *textwrap.wrap("legend: " + _legend(), 110)]
    for name, r in scored.items():
        prefix = f"{name}: " if len(reports) > 1 else ""
        block = []
        if r["predictions_outside_selection"]:
            block.append(f"{prefix}{r['predictions_outside_selection']} prediction(s) outside the selected rows were "
                         "not scored.")
        errors = r.get("error_rows") or []
        if errors:
            block.append(f"{prefix}{len(errors)} decision(s) could not be scored and count as errors:")
            block += [f"- {e['message']}" for e in errors[:ERROR_ROWS_SHOWN]]
            if len(errors) > ERROR_ROWS_SHOWN:
                block.append(f"- ... and {len(errors) - ERROR_ROWS_SHOWN} more (all in --json: error_rows)")
        block += [f"warning: {prefix}{w}" for w in r.get("warnings") or []]
        lines += ["", *block] if block else []
    unmatched = report.get("unmatched_lines") or []
    if unmatched:
        lines += ["", f"{len(unmatched)} line(s) cannot be read and name no row (not scored):"]
        lines += [f"- {e['message']}" for e in unmatched[:ERROR_ROWS_SHOWN]]
        if len(unmatched) > ERROR_ROWS_SHOWN:
            lines.append(f"- ... and {len(unmatched) - ERROR_ROWS_SHOWN} more (all in --json: unmatched_lines)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n", 1)
    columns = "\n".join(textwrap.wrap("The table's columns (the same definitions with and without --count-missing). "
                                       + _legend(), 100))
    p = argparse.ArgumentParser(prog="noulengine score", description=doc[0].replace("``", ""),
                                epilog=doc[1].replace("``", "`") + "\n\n" + columns,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True, help="a suite (agnews), group (jevbench) or collection (accuracy-v1)")
    p.add_argument("--predictions", required=True, help="JSONL predictions file (format below)")
    p.add_argument("--source", help="raw data folder")
    p.add_argument("--output", help="write the metrics JSON here")
    p.add_argument("--sample", type=int, help="score the fixed-seed sample of N rows that eval --sample N selects")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    rows = p.add_mutually_exclusive_group()
    rows.add_argument("--predicted-only", action="store_true",
                      help="score only rows that have a prediction (the default; missing rows are counted, not scored)")
    rows.add_argument("--count-missing", action="store_true",
                      help="score every selected row, those without a prediction as errors (lowers coverage)")
    p.add_argument("--json", action="store_true", help="print the full metrics JSON instead of the short table")
    return p


def main(argv: list[str] | None = None) -> int:
    from noulengine.eval.suites.errors import SuiteError

    from noulengine.eval.suites.paths import refuse_missing_data_folder

    args = build_parser().parse_args(argv)
    if args.sample is not None and args.sample < 1:
        print("error: --sample must be at least 1", file=sys.stderr)
        return 2
    if refuse_missing_data_folder(args.source):
        return 2
    try:
        report = score_file(args.suite, args.predictions, source=args.source, sample=args.sample, seed=args.seed,
                            count_missing=args.count_missing)
    except (ValueError, OSError, SuiteError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2, allow_nan=False)
    if args.output:
        from noulengine.writes import EXIT_WRITE_ERROR, OutputWriteError, write_text_atomic

        try:
            write_text_atomic(args.output, text + "\n")
        except OutputWriteError as exc:  # a full disk: one line, the scores are not printed as if saved
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_WRITE_ERROR
    if args.json:
        for note in report.get("notes") or []:  # said first, also when stdout is JSON
            print(f"note: {note}", file=sys.stderr)
        print(text)
    else:
        print(summary_table(args.suite, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
