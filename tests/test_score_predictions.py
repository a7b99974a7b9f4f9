"""`noulengine score` (issue #25 items 3, 4, 8, 9; issue #34 items 11, 15) and the NLL floor count
in eval's outputs.

No model is loaded: predictions are written by hand against the real suites (shared data).
"""

from __future__ import annotations

import json

import pytest

from noulengine.eval.score import main as score_main
from noulengine.eval.score import score_file
from noulengine.eval.suites import get_suite, sample_rows
from noulengine.eval.suites.errors import SuiteError
from noulengine.metrics.scorer import Scorer
from noulengine.records.schema import parse_record
from tests.conftest import SHARED_DATA

needs_data = pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.csv").is_file(), reason="shared data not present")


def _answers(rec, *, right=True, total=1.0, gold_p=None):
    """One answer per asked field: 0.7 on the gold label (``right``) or on another one."""
    out = {}
    for q in rec.request.questions:
        labels = list(q.labels)
        gold = rec.targets[q.field].label if q.field in rec.targets else labels[0]
        top = gold if right else next(lab for lab in labels if lab != gold)
        p = {lab: (0.7 if lab == top else 0.3 / (len(labels) - 1)) for lab in labels}
        if gold_p is not None:
            rest = (1.0 - gold_p) / (len(labels) - 1)
            p = {lab: (gold_p if lab == gold else rest) for lab in labels}
        out[q.field] = {"probabilities": {lab: v * total for lab, v in p.items()}}
    return out


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# -- item 3: invalid rows are named ------------------------------------------------------------

@needs_data
def test_invalid_prediction_rows_are_listed_with_id_field_and_rule(tmp_path, capsys):
    rows = get_suite("agnews").load()[:4]
    preds = _write(tmp_path / "p.jsonl", [
        {"row": 0, "answers": _answers(rows[0][1])},
        {"row": 1, "answers": _answers(rows[1][1], total=0.8)},  # sums to 0.8
        {"row": 2, "answers": {}},  # the field is missing
        {"row": 3, "answers": {}, "error": {"message": "model crashed"}},
    ])
    report = score_file("agnews", preds)
    assert report["counts"]["errors"] == 3 and report["counts"]["scored"] == 1
    errors = report["error_rows"]
    assert [(e["record_id"], e["field"], e["line"], e["row"], e["kind"]) for e in errors] == [
        (rows[1][1].id, "decision", 2, 1, "invalid_answer"), (rows[2][1].id, "decision", 3, 2, "missing_answer"),
        (rows[3][1].id, "decision", 4, 3, "record_error")]
    assert errors[0]["rule"] == "probabilities must sum to 1 within 0.01, got 0.800000"
    assert errors[0]["error_type"] == "record_error" and errors[0]["file"] == str(preds)
    assert errors[2]["rule"] == "the prediction is an error row: model crashed"
    assert score_main(["--suite", "agnews", "--predictions", str(preds)]) == 0
    out = capsys.readouterr().out
    assert "3 decision(s) could not be scored and count as errors:" in out
    assert (f"- {preds}:2, record {rows[1][1].id!r}, field 'decision': probabilities must sum to 1 within 0.01, "
            "got 0.800000") in out
    assert score_main(["--suite", "agnews", "--predictions", str(preds), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["error_rows"] == errors


# -- item 4: the NLL floor is counted -----------------------------------------------------------

def test_decisions_at_the_nll_floor_are_counted_per_slice():
    q = {"pick": {"type": "choice", "instructions": "pick", "criteria": {"a": None, "b": None}}}
    recs = [parse_record({"id": f"r{i}", "state": "s", "questions": q, "targets": {"pick": {"label": "a"}},
                          "suite": suite}) for i, suite in enumerate(["s1", "s1", "s2"])]
    probs = [{"a": 0.0, "b": 1.0}, {"a": 0.6, "b": 0.4}, {"a": 1e-13, "b": 1.0 - 1e-13}]
    scorer = Scorer()
    for rec, p in zip(recs, probs):
        scorer.update(rec, {"answers": {"pick": {"probabilities": p}}, "error": None})
    report = scorer.compute()
    assert report["nll_floored"] == 2
    assert {k: v["nll_floored"] for k, v in report["slices"]["suite"].items()} == {"s1": 1, "s2": 1}
    assert any("2 of 3 scored decisions gave the gold label a probability at or below the NLL floor 1e-12" in w
               for w in report["warnings"])


def test_eval_report_has_the_nll_floor_column(tmp_path):
    from noulengine.eval.report import write_outputs
    from noulengine.eval.runner import TaskResult

    q = {"pick": {"type": "choice", "instructions": "pick", "criteria": {"a": None, "b": None}}}
    scorer = Scorer()
    for i, p in enumerate([{"a": 0.0, "b": 1.0}, {"a": 0.9, "b": 0.1}]):
        rec = parse_record({"id": f"r{i}", "state": "s", "questions": q, "targets": {"pick": {"label": "a"}}})
        scorer.update(rec, {"answers": {"pick": {"probabilities": p}}, "error": None})
    metrics = scorer.compute()
    metrics.update(flip_rate=None, x_mass={"median": None})
    res = TaskResult(name="toy", status="ready", rows=2, metrics=metrics)
    write_outputs([res], tmp_path, {"suite": "accuracy-v1", "git_revision": None, "selection": {}, "engine": {}})
    assert json.loads((tmp_path / "metrics.json").read_text())["toy"]["metrics"]["nll_floored"] == 1
    report = (tmp_path / "report.md").read_text()
    assert "| NLL | NLL floored | Brier |" in report and "| 13.8682 | 1 | 1.0100 |" in report


@needs_data
def test_score_output_counts_the_nll_floor(tmp_path, capsys):
    rows = get_suite("agnews").load()[:2]
    preds = _write(tmp_path / "p.jsonl", [{"row": 0, "answers": _answers(rows[0][1], gold_p=0.0)},
                                          {"row": 1, "answers": _answers(rows[1][1])}])
    assert score_file("agnews", preds)["nll_floored"] == 1
    assert score_main(["--suite", "agnews", "--predictions", str(preds)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| agnews |"))
    assert "| NLL floored |" in out and row.split("|")[10].strip() == "1"


# -- item 8: groups and collections ------------------------------------------------------------

def test_a_group_name_is_not_suggested_as_its_own_spelling():
    with pytest.raises(SuiteError) as info:
        get_suite("jevbench")
    msg = str(info.value)
    assert "did you mean 'jevbench'" not in msg
    assert msg == "'jevbench' is a group of suites (jevbench_easy, jevbench_original, jevbench_hard), not one suite"


@needs_data
def test_groups_and_collections_score_per_suite_as_eval_runs_them(tmp_path, capsys):
    lines = []
    for name in ("jevbench_easy", "jevbench_hard", "agnews"):
        for i, rec in get_suite(name).load()[:3]:
            lines.append({"suite": name, "row": i, "answers": _answers(rec)})
    preds = _write(tmp_path / "p.jsonl", lines)
    group = score_file("jevbench", preds)
    assert group["kind"] == "group" and list(group["suites"]) == ["jevbench_easy", "jevbench_hard", "jevbench_original"]
    assert group["suites"]["jevbench_easy"]["accuracy"] == 1.0 and group["suites"]["jevbench_hard"]["rows_scored"] == 3
    assert group["suites"]["jevbench_original"]["status"] == "not predicted"
    collection = score_file("accuracy-v1", preds)
    assert collection["kind"] == "collection" and collection["suites"]["agnews"]["accuracy"] == 1.0
    for name in ("jevbench", "accuracy-v1"):
        assert score_main(["--suite", name, "--predictions", str(preds)]) == 0
        out = capsys.readouterr().out
        assert "| jevbench_easy | 3 |" in out and "jevbench_original: not predicted" in out
    assert "| agnews | 3 |" in out
    # a row without "suite" is ambiguous when several suites are scored
    _write(preds, [{"row": 0, "answers": {}}])
    assert score_main(["--suite", "jevbench", "--predictions", str(preds)]) == 2
    err = capsys.readouterr().err
    assert "field 'suite' is needed when scoring several suites" in err and "Traceback" not in err


def test_an_unknown_suite_is_one_clean_line(tmp_path, capsys):
    preds = _write(tmp_path / "p.jsonl", [])
    assert score_main(["--suite", "jevbnch", "--predictions", str(preds)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown suite 'jevbnch'; did you mean 'jevbench'") and err.count("\n") == 1


# -- item 9: predictions that cover a subset ---------------------------------------------------

@needs_data
def test_a_sample_of_predictions_is_scored_as_the_sample_and_said_first(tmp_path, capsys):
    rows = get_suite("agnews").load()
    sample = sample_rows(rows, 20, seed=0)  # what eval --sample 20 --seed 0 runs
    preds = _write(tmp_path / "p.jsonl", [{"suite": "agnews", "row": i, "id": rec.id, "answers": _answers(rec)}
                                          for i, rec in sample])
    report = score_file("agnews", preds)
    assert report["counts"]["decisions"] == 20 and report["counts"]["coverage"] == 1.0 and report["accuracy"] == 1.0
    assert report["rows_missing"] == len(rows) - 20 and report["rows_scored"] == 20
    assert score_main(["--suite", "agnews", "--predictions", str(preds)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"note: agnews: {preds} has predictions for 20 of the suite's 7,600 rows: scoring those 20 "
                          "rows only")
    assert "they are the rows eval --sample 20 --seed 0 selects" in out and "| 100.0% | 100.0% |" in out
    assert "carry no information" not in out
    # counting the missing rows is asked for explicitly, and then the warning blames coverage, not the answers
    assert score_main(["--suite", "agnews", "--predictions", str(preds), "--count-missing"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: agnews:") and "count as errors (--count-missing)" in out
    assert ("accuracy (0.3%) measures coverage as well as the answers; over the 20 predicted rows alone (as scored "
            "without --count-missing) it is 100.0%") in out
    assert "carry no information" not in out
    # no note when the rows are the selection
    assert score_main(["--suite", "agnews", "--predictions", str(preds), "--sample", "20"]) == 0
    assert capsys.readouterr().out.startswith("| suite | rows predicted | rows missing |")


@needs_data
def test_no_prediction_for_the_suite_is_a_clear_error(tmp_path, capsys):
    rec = get_suite("jevbench_easy").load()[0][1]
    preds = _write(tmp_path / "p.jsonl", [{"suite": "jevbench_easy", "row": 0, "answers": _answers(rec)}])
    assert score_main(["--suite", "agnews", "--predictions", str(preds)]) == 2
    assert capsys.readouterr().err == (f"error: no row of {preds} is for suite 'agnews' (1 row(s) are for other "
                                       "suites); nothing to score\n")


def test_score_help_documents_the_predictions_format(capsys):
    with pytest.raises(SystemExit):
        score_main(["--help"])
    out = capsys.readouterr().out
    for words in ("Prediction rows", "`row`: the 0-based row", '{"probabilities": {label: p, ...}}', "--count-missing",
                  "/v1/systemone", "a group (`jevbench`"):
        assert words in out, words


# -- issue #34 item 11: one definition of each figure, in both modes -----------------------------

def _nineteen_of_twenty(tmp_path):
    """eval's 20-row agnews sample, one row removed, one answer invalid (sums to 0.8), a third right."""
    sample = sample_rows(get_suite("agnews").load(), 20, seed=0)
    lines = [{"suite": "agnews", "row": i, "id": rec.id,
              "answers": _answers(rec, right=k % 3 == 0, total=0.8 if k == 5 else 1.0)}
             for k, (i, rec) in enumerate(sample) if k != 7]
    return _write(tmp_path / "p.jsonl", lines), sample


def _table_row_of(out: str, suite: str) -> list[str]:
    return [c.strip() for c in next(line for line in out.splitlines() if line.startswith(f"| {suite} |")).split("|")]


@needs_data
def test_the_same_predictions_give_the_same_figures_in_both_modes(tmp_path, capsys):
    preds, sample = _nineteen_of_twenty(tmp_path)
    right = sum(1 for k in range(20) if k != 7 and k != 5 and k % 3 == 0)  # the invalid row is wrong
    default = score_file("agnews", preds, sample=20)
    counted = score_file("agnews", preds, sample=20, count_missing=True)
    assert default["accuracy"] == default["accuracy_predicted"] == pytest.approx(right / 19)
    assert counted["accuracy_predicted"] == default["accuracy"]  # the answers' accuracy: one number
    assert counted["accuracy"] == pytest.approx(right / 20)  # missing = wrong, asked for
    for report in (default, counted):
        assert (report["rows_selected"], report["rows_predicted"], report["rows_missing"]) == (20, 19, 1)
    assert score_main(["--suite", "agnews", "--predictions", str(preds), "--sample", "20"]) == 0
    plain = capsys.readouterr().out
    assert score_main(["--suite", "agnews", "--predictions", str(preds), "--sample", "20", "--count-missing"]) == 0
    out = capsys.readouterr().out
    head = ["", "suite", "rows predicted", "rows missing", "decisions", "coverage", "accuracy"]
    assert _table_row_of(plain, "suite")[:7] == _table_row_of(out, "suite")[:7] == head
    # rows predicted + rows missing = the 20 selected rows, in both modes
    assert _table_row_of(plain, "agnews")[2:7] == ["19", "1", "19", "94.7%", f"{100 * right / 19:.1f}%"]
    assert _table_row_of(out, "agnews")[2:7] == ["19", "1", "20", "90.0%", f"{100 * right / 20:.1f}%"]
    assert (f"over the 19 predicted rows alone (as scored without --count-missing) it is {100 * right / 19:.1f}%"
            in out)
    assert "accuracy over the scored decisions" not in out  # a third figure, with its own denominator: gone


@needs_data
def test_a_legend_under_the_table_explains_every_column(tmp_path, capsys):
    preds, _ = _nineteen_of_twenty(tmp_path)
    for extra in ([], ["--count-missing"]):
        assert score_main(["--suite", "agnews", "--predictions", str(preds), "--sample", "20", *extra]) == 0
        lines = capsys.readouterr().out.splitlines()
        table_end = max(i for i, line in enumerate(lines) if line.startswith("|"))
        assert lines[table_end + 1] == "" and lines[table_end + 2].startswith("legend: rows predicted / missing:")
        legend = " ".join(lines[table_end + 2:lines.index("", table_end + 2)])
        for words in ("decisions: the gold-labelled questions", "coverage: share of decisions with a valid answer",
                      "accuracy: correct / decisions (no valid answer = wrong)", "chance, majority:",
                      "NLL floored: how many of those gave the gold label p <= 1e-12 (each adds 27.6 nats to NLL)"):
            assert words in legend, words
    with pytest.raises(SystemExit):
        score_main(["--help"])
    assert "NLL floored: how many of those" in capsys.readouterr().out.replace("\n", " ")


# -- issue #34 item 15: an unreadable line is an error row, not a refusal ------------------------

@needs_data
def test_an_unreadable_line_is_named_counted_and_the_rest_scored(tmp_path, capsys):
    rows = get_suite("agnews").load()[:5]
    good = [json.dumps({"row": i, "id": rec.id, "answers": _answers(rec)}) for i, rec in rows]
    lines = [good[0].replace("0.7", "NaN", 1),  # 1: NaN, row 0 readable
             good[1][:30],  # 2: truncated after its row
             good[2],
             '{"answers": {"decision": ',  # 4: nothing readable
             good[3],
             good[4][:-1] + ', "row": 9}',  # 6: its row named twice, its id once
             '{"id": "no-such-id", "answers": NaN}']  # 7: an id the suite does not have
    assert "NaN" in lines[0]
    preds = tmp_path / "p.jsonl"
    preds.write_bytes(("\n".join(lines) + "\n").encode() + b'{"row": 3, "note": "\xff"}\n')  # 8: not UTF-8
    report = score_file("agnews", preds)
    # lines whose row can be told are errors of that row, named by line, record id, field and rule
    errors = {e["line"]: e for e in report["error_rows"]}
    assert sorted(errors) == [1, 2, 6]
    assert (errors[1]["record_id"], errors[1]["row"], errors[1]["field"], errors[1]["kind"]) == (
        rows[0][1].id, 0, "decision", "unreadable_line")
    assert errors[1]["rule"].startswith("the line cannot be read: invalid JSON: NaN is not valid JSON "
                                        "(at answers.decision.probabilities.")
    assert (errors[2]["record_id"], errors[2]["row"]) == (rows[1][1].id, 1)
    assert (errors[6]["record_id"], errors[6]["row"]) == (rows[4][1].id, 4)
    assert "duplicate key 'row'" in errors[6]["rule"]
    # the readable rows are scored; the other lines name no row: listed by line (and id), counted
    assert report["counts"]["decisions"] == 5 and report["counts"]["scored"] == 2 and report["accuracy"] == 0.4
    assert report["counts"]["error_kinds"] == {"unreadable_line": 3}
    assert [e["line"] for e in report["unmatched_lines"]] == [4, 7, 8] and report["lines_unreadable"] == 6
    assert report["unmatched_lines"][1]["record_id"] == "no-such-id"
    assert report["notes"][0] == (f"3 line(s) of {preds} cannot be read and name no row, so no row is scored for "
                                  "them; they are listed below")
    assert score_main(["--suite", "agnews", "--predictions", str(preds)]) == 0
    out = capsys.readouterr().out
    assert f"- {preds}:1, record {rows[0][1].id!r}, field 'decision': the line cannot be read: invalid JSON: NaN" in out
    assert "3 line(s) cannot be read and name no row (not scored):" in out and f"- {preds}:8: not UTF-8" in out
    assert f"- {preds}:7, record 'no-such-id', field 'answers': invalid JSON: NaN is not valid JSON" in out
    # with --count-missing the rows no line could be matched to are missing rows, counted as errors
    counted = score_file("agnews", preds, count_missing=True)
    assert counted["counts"]["error_kinds"]["unreadable_line"] == 3
    assert counted["counts"]["error_kinds"]["missing_prediction"] == 7600 - 5


@needs_data
def test_a_file_that_cannot_be_read_at_all_is_one_clear_error(tmp_path, capsys):
    preds = tmp_path / "p.jsonl"
    preds.write_text("row,answer\n0,world\n")
    assert score_main(["--suite", "agnews", "--predictions", str(preds)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no row of {preds} is for suite 'agnews' (2 line(s) cannot be read and name no "
                          f"row; the first: {preds}:1: invalid JSON: Expecting value") and "Traceback" not in err
