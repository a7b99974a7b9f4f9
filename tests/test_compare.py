"""`noulengine compare` (issue #45 items 1-2): paired bootstrap intervals over records, each run
against chance, the mean over a collection's suites, the adoption rule's suite clauses, constant
answers flagged; the vectorised bootstrap against its one-replicate-at-a-time reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from noulengine.eval.compare import CompareError, Run, compare_runs, load_run, main, parse_run, verdict
from noulengine.metrics.bootstrap import (percentile_interval, replicate_accuracies,
                                          replicate_accuracies_reference)
from noulengine.metrics.scorer import answer_concentration, score
from noulengine.records.schema import parse_record
from tests.conftest import SHARED_DATA

needs_agnews = pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.csv").is_file(), reason="shared data not present")
needs_jevbench = pytest.mark.skipif(not (SHARED_DATA / "jevbench" / "easy.jsonl").is_file(),
                                    reason="shared data not present")


# ---------------------------------------------------------------------------------------------
# The bootstrap itself.

def test_vectorised_replicates_equal_the_reference():
    rng = np.random.default_rng(3)
    decisions = rng.integers(1, 6, size=37).astype(float)  # records of 1..5 decisions
    correct = np.stack([rng.integers(0, decisions + 1) for _ in range(3)], axis=1)
    fast = replicate_accuracies(correct, decisions, n_resamples=600, seed=[7, 1])
    slow = replicate_accuracies_reference(correct, decisions, n_resamples=600, seed=[7, 1])
    assert fast.shape == (600, 3)
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-12)


def test_the_same_seed_pairs_separate_calls_and_another_seed_differs():
    decisions = np.ones(50)
    a = replicate_accuracies(np.arange(50) % 2, decisions, n_resamples=200, seed=5)
    b = replicate_accuracies(np.arange(50) % 2, decisions, n_resamples=200, seed=5)
    c = replicate_accuracies(np.arange(50) % 2, decisions, n_resamples=200, seed=6)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_one_record_of_72_is_no_difference_and_thirty_are():
    """The issue's case: on Jevbench original one record is 1.4 points; the paired interval of a
    one-record difference includes zero, a thirty-record one does not."""
    decisions = np.ones(72)
    base = (np.arange(72) % 3 == 0).astype(float)  # 24 right
    one = base.copy()
    one[1] = 1.0  # one more record right
    many = base.copy()
    many[np.flatnonzero(base == 0)[:30]] = 1.0
    for cand, excluded in ((one, False), (many, True)):
        reps = replicate_accuracies(np.stack([base, cand], axis=1), decisions, seed=0)
        iv = percentile_interval(cand.mean() - base.mean(), reps[:, 1] - reps[:, 0])
        assert iv.low <= iv.value <= iv.high
        assert (iv.low > 0) is excluded
    same = replicate_accuracies(np.stack([base, base], axis=1), decisions, n_resamples=500)
    iv = percentile_interval(0.0, same[:, 1] - same[:, 0])
    assert (iv.low, iv.high) == (0.0, 0.0)  # paired: identical runs differ on no replicate


def test_a_records_decisions_are_resampled_together():
    """Five records of five decisions each, all-right or all-wrong: resampling records gives a wide
    interval (5 units), resampling the 25 decisions as if independent would give a narrow one."""
    decisions = np.full(5, 5.0)
    correct = np.array([5, 5, 0, 0, 5], dtype=float)
    reps = replicate_accuracies(correct, decisions, n_resamples=4000, seed=1)[:, 0]
    assert set(np.round(reps * 25).astype(int) % 5) == {0}  # every replicate moves in whole records
    iv = percentile_interval(0.6, reps)
    assert iv.low <= 0.2 and iv.high >= 1.0 - 1e-12


@pytest.mark.parametrize("correct, decisions, rule", [
    (np.ones(3), np.ones(4), "same R"), (np.array([2.0]), np.array([1.0]), r"\[0, decisions\]"),
    (np.zeros(0), np.zeros(0), "no records"), (np.zeros(2), np.zeros(2), "no decisions")])
def test_bad_bootstrap_inputs_are_refused(correct, decisions, rule):
    with pytest.raises(ValueError, match=rule):
        replicate_accuracies(correct, decisions, n_resamples=10)


# ---------------------------------------------------------------------------------------------
# Constant answers (item 2).

YN = {"flag": {"type": "noul", "instructions": "Flag?"}}


def _flag_pairs(n: int, gold_yes: int, answered_yes: int):
    out = []
    for i in range(n):
        rec = parse_record({"id": f"r{i}", "state": "s", "questions": YN,
                            "targets": {"flag": {"label": "yes" if i < gold_yes else "no"}}})
        p = 0.8 if i < answered_yes else 0.2
        out.append((rec, {"answers": {"flag": {"probabilities": {"no": 1 - p, "yes": p}}}, "error": None}))
    return out


@pytest.mark.parametrize("n, gold_yes, answered_yes, constant", [
    (40, 16, 0, True),     # always "no" where gold is 60/40: flagged
    (40, 16, 2, True),     # 38 of 40 = 95%: the threshold itself is flagged
    (40, 16, 3, False),    # 37 of 40 = 92.5%: not
    (40, 4, 0, False),     # gold itself is 90% "no": answering "no" throughout is not evidence-blind
    (10, 4, 0, False),     # under 20 decisions: reported, not flagged
])
def test_constant_answers_are_flagged_by_the_rule(n, gold_yes, answered_yes, constant):
    rep = score(_flag_pairs(n, gold_yes, answered_yes))
    (c,) = rep["answer_concentration"]
    assert c["field"] == "flag" and c["n"] == n
    assert c["answer_share"] == pytest.approx((n - answered_yes) / n)
    assert c["gold_share"] == pytest.approx(max(gold_yes, n - gold_yes) / n)
    assert c["constant"] is constant
    assert any("constant answer" in w for w in rep["warnings"]) is constant


def test_concentration_compares_label_text_not_position():
    """A choice field whose options change from record to record is constant only when one label
    text wins, not when one position does."""
    pairs = []
    for i in range(30):
        labels = [f"tool{i}", f"other{i}"]
        rec = parse_record({"id": f"r{i}", "state": "s", "targets": {"t": {"label": labels[1]}},
                            "questions": {"t": {"type": "choice", "instructions": "?",
                                                "criteria": {lab: None for lab in labels}}}})
        pairs.append((rec, {"answers": {"t": {"probabilities": {labels[0]: 0.9, labels[1]: 0.1}}}, "error": None}))
    from noulengine.metrics.scorer import Scorer

    s = Scorer()
    for r, a in pairs:
        s.update(r, a)
    (c,) = answer_concentration(s.decisions)
    assert c["answer_share"] == pytest.approx(1 / 30) and not c["constant"]


# ---------------------------------------------------------------------------------------------
# compare on real suite records (synthetic answers).

def _answers_for(records, pick, suite="jevbench_easy") -> list[dict]:
    """eval-shaped prediction rows for ``(row, record)`` pairs; ``pick(record, question)`` names the label
    given probability 0.7 (the rest shared evenly)."""
    rows = []
    for i, rec in records:
        answers = {}
        for q in rec.request.questions:
            top = pick(rec, q)
            rest = (1 - 0.7) / (len(q.labels) - 1)
            answers[q.field] = {"label": top, "probabilities": {lab: 0.7 if lab == top else rest for lab in q.labels}}
        rows.append({"suite": suite, "row": i, "answers": answers,
                     "error": None})
    return rows


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@needs_jevbench
def test_compare_scores_like_score_and_flags_what_it_should(tmp_path):
    from noulengine.eval.score import score_file
    from noulengine.eval.suites import get_suite

    records = get_suite("jevbench_easy").load()
    gold = lambda rec, q: rec.targets[q.field].label if q.field in rec.targets else q.labels[0]  # noqa: E731
    first = lambda rec, q: q.labels[0]  # noqa: E731
    good = _write(tmp_path / "good" / "predictions.jsonl", _answers_for(records, gold))
    # the second run misses the last 8 rows (a paused run): compared on the rows both answered
    slot = _write(tmp_path / "slot.jsonl", _answers_for(records[:-8], first))
    result = compare_runs([load_run(*parse_run(f"good={tmp_path / 'good'}")), load_run(*parse_run(str(slot)))],
                          n_resamples=2000)
    e = result["suites"]["jevbench_easy"]
    assert e["records"] == len(records) - 8 and e["rows_per_run"] == {"good": len(records), "slot": len(records) - 8}
    assert any("compared on the" in n for n in result["notes"])
    cut = _write(tmp_path / "cut.jsonl", _answers_for(records[:-8], first))
    assert e["runs"]["slot"]["accuracy"] == pytest.approx(score_file("jevbench_easy", cut)["accuracy"])
    assert e["runs"]["good"]["accuracy"] == 1.0
    assert e["chance"] == pytest.approx(score_file("jevbench_easy", cut)["baselines"]["chance"])
    diff = e["runs"]["slot"]["diff"]
    assert diff["high"] < 0 and diff["value"] == pytest.approx(e["runs"]["slot"]["accuracy"] - 1.0)
    v = result["verdicts"]["slot"]
    assert v["worse"] == ["jevbench_easy"] and v["passes"] is False  # one worse suite fails, whatever the mean
    assert v["mean_higher"] is False
    assert result["mean"]["suites"] == ["jevbench_easy"] and "the mean is over 1 of" in result["notes"][-1]
    json.dumps(result, allow_nan=False)


@needs_jevbench
def test_the_cli_writes_both_files_and_refuses_bad_inputs(tmp_path, capsys):
    from noulengine.eval.suites import get_suite

    records = get_suite("jevbench_easy").load()
    a = _write(tmp_path / "a.jsonl", _answers_for(records, lambda rec, q: q.labels[0]))
    b = _write(tmp_path / "b.jsonl", _answers_for(records, lambda rec, q: q.labels[-1]))
    assert main([f"first={a}", f"last={b}", "--output", str(tmp_path / "cmp"), "--resamples", "500"]) == 0
    out = capsys.readouterr().out
    assert "| jevbench_easy |" in out and "Δ last − first" in out and "mean of 1 accuracy-v1 suites" in out
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["bootstrap"] == {"resamples": 500, "seed": 0, "level": 0.95, "unit": "record",
                                  "method": "percentile; paired (every run scored on the same replicate)"}
    assert (tmp_path / "cmp" / "compare.md").read_text().startswith("# Comparison: first, last")
    # the same inputs give the same intervals (a fixed seed)
    assert main([f"first={a}", f"last={b}", "--resamples", "500", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["suites"] == saved["suites"]
    assert main([str(a)]) == 2 and "two or more runs" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "nope.jsonl")]) == 2 and "no such file or folder" in capsys.readouterr().err
    assert main([f"x={a}", f"x={b}"]) == 2 and "named alike" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"suite": "jevbench_easy", "row": 0}\nnot json\n{"suite": "jevbench_easy", "row": 1}\n')
    assert main([str(a), str(bad)]) == 2 and "bad.jsonl" in capsys.readouterr().err


def test_verdict_excuses_a_suite_where_the_baseline_has_no_skill():
    def suite(diff_high, base_chance_low, cand_chance_high=0.1):
        return {"runs": {"base": {"above_chance": {"low": base_chance_low, "high": 0.2}},
                         "cand": {"diff": {"value": diff_high - 0.05, "low": diff_high - 0.1, "high": diff_high},
                                  "above_chance": {"low": -0.3, "high": cand_chance_high}}}}

    suites = {"skilled": suite(0.05, 0.02), "no_skill": suite(-0.01, -0.03), "lost": suite(-0.01, 0.01, -0.02)}
    mean = {"runs": {"base": {"accuracy": 0.5}, "cand": {"accuracy": 0.55}}}
    v = verdict(suites, mean, "base", "cand")
    assert v["worse"] == ["lost"] and v["worse_excused"] == ["no_skill"] and v["below_chance"] == ["lost"]
    assert v["mean_higher"] is True and v["passes"] is False
    del suites["lost"]
    assert verdict(suites, mean, "base", "cand")["passes"] is True
    partial = {**mean, "missing": ["agnews"]}  # a mean over some suites decides nothing...
    assert verdict(suites, partial, "base", "cand")["passes"] is None
    suites["lost"] = suite(-0.01, 0.01)  # ...but a worse suite fails the clauses without it
    assert verdict(suites, partial, "base", "cand")["passes"] is False
    # under chance alone (not worse: its interval crosses zero) fails too, with a full and higher mean
    suites["lost"] = suite(0.02, 0.01, cand_chance_high=-0.01)
    v = verdict(suites, mean, "base", "cand")
    assert v["worse"] == [] and v["below_chance"] == ["lost"] and v["mean_higher"] is True and v["passes"] is False


def test_runs_sharing_no_record_are_refused():
    with pytest.raises(CompareError, match="share no answered record"):
        compare_runs([Run("a", [], {("agnews", 0): {}}), Run("b", [], {("agnews", 1): {}})])
