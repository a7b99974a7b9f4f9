"""The scorer over (record, answer_map) pairs, checked against hand-computed values."""

import json
import math

import pytest

from noulengine.metrics.scorer import Scorer, score
from noulengine.records.schema import parse_record

QUESTIONS = {
    "pick": {"type": "choice", "instructions": "pick", "criteria": {"a": None, "b": None, "c": None}},
    "level": {"type": "score", "instructions": "rate", "criteria": ["low", "mid", "high"]},
}
NOUL = {"ok": {"type": "noul", "instructions": "ok?"}}


def rec(rid, questions, targets, **extra):
    return parse_record({"id": rid, "state": "s", "questions": questions, "targets": targets, **extra})


def answer(labels, probs, qtype="choice"):
    return {"type": qtype, "labels": labels, "probabilities": dict(zip(labels, probs)),
            "confidence": max(probs), "label": labels[probs.index(max(probs))]}


ABC, LVL, YN = ["a", "b", "c"], ["0", "1", "2"], ["no", "yes"]


def pairs():
    r1 = rec("r1", QUESTIONS, {"pick": {"label": "a"}, "level": {"label": 2}}, category="x", suite="s1")
    a1 = {"answers": {"pick": answer(ABC, [0.7, 0.2, 0.1]), "level": answer(LVL, [0.2, 0.5, 0.3], "score")},
          "error": None}
    r2 = rec("r2", NOUL, {"ok": {"label": "yes", "probabilities": {"yes": 0.8, "no": 0.2}}}, category="y")
    a2 = {"answers": {"ok": answer(YN, [0.4, 0.6], "noul")}, "error": None}
    r3 = rec("r3", QUESTIONS, {"pick": {"label": "b"}})
    a3 = {"answers": {}, "error": "boom"}
    r4 = rec("r4", QUESTIONS, {"pick": {"label": "a"}, "level": {"label": 0}})
    a4 = {"answers": {"pick": answer(ABC, [1.0, 0.3, 0.2])}, "error": None}  # sums to 1.5; level missing
    return [(r1, a1), (r2, a2), (r3, a3), (r4, a4)]


def test_report_by_hand():
    rep = score(pairs())
    json.dumps(rep, allow_nan=False)  # JSON-able
    c = rep["counts"]
    assert (c["decisions"], c["hard_labelled"], c["soft_labelled"], c["scored"], c["errors"]) == (6, 6, 1, 3, 3)
    assert c["coverage"] == 0.5
    assert c["error_kinds"] == {"invalid_answer": 1, "missing_answer": 1, "record_error": 1}
    assert rep["accuracy"] == pytest.approx(2 / 6)  # decision level, errors are wrong
    assert rep["accuracy_scored"] == pytest.approx(2 / 3)
    assert rep["rows_all_correct"] == pytest.approx(1 / 4) and rep["rows"] == 4
    assert rep["nll"] == pytest.approx(-(math.log(0.7) + math.log(0.3) + math.log(0.6)) / 3, abs=1e-12)
    assert rep["brier"] == pytest.approx((0.14 + 0.78 + 0.32) / 3, abs=1e-12)
    # confidences 0.7 (bin 10, right), 0.5 (bin 7, wrong), 0.6 (bin 8, right): (0.3 + 0.5 + 0.4) / 3
    assert rep["ece"] == pytest.approx(0.4, abs=1e-12)
    assert rep["ordinal"] == {"n": 1, "mae": pytest.approx(0.9), "rps": pytest.approx(0.265)}
    d = rep["distribution"]
    assert d["status"] == "ok" and d["n"] == 1
    assert d["kl"] == pytest.approx(0.2 * math.log(0.2 / 0.4) + 0.8 * math.log(0.8 / 0.6), abs=1e-12)
    assert d["brier_vs_distribution"] == pytest.approx(0.08, abs=1e-12)
    assert d["tvd"] == pytest.approx(0.2, abs=1e-12)
    slots = rep["slots"]  # predicted [0, 1, 1], gold [0, 2, 1]
    assert [s["predicted"] for s in slots] == [1, 2, 0]
    assert [s["gold"] for s in slots] == [1, 1, 1]
    assert slots[2]["flags"] == ["never_predicted"]


def test_slices():
    sl = score(pairs())["slices"]
    assert set(sl) == {"suite", "type", "field", "category"}
    assert sl["type"]["choice"]["counts"]["decisions"] == 3
    assert sl["type"]["choice"]["accuracy"] == pytest.approx(1 / 3)
    assert sl["type"]["noul"]["accuracy"] == 1.0
    assert sl["type"]["score"]["accuracy"] == 0.0 and sl["type"]["score"]["ordinal"]["n"] == 1
    assert sl["type"]["choice"]["ordinal"] == {"n": 0, "mae": None, "rps": None}
    assert sl["category"]["<none>"]["counts"]["decisions"] == 3
    assert sl["suite"]["s1"]["counts"]["decisions"] == 2
    assert set(sl["field"]) == {"pick", "level", "ok"}
    assert "slices" not in sl["field"]["pick"]


def test_metadata_slices():
    """A suite manifest's "slices" (record metadata keys) become slices beside the built-in ones."""
    r1 = rec("r1", NOUL, {"ok": {"label": "yes"}}, level=0, task="t")
    r2 = rec("r2", NOUL, {"ok": {"label": "yes"}}, level=1)
    r3 = rec("r3", NOUL, {"ok": {"label": "no"}}, level=1)
    yes = {"answers": {"ok": answer(YN, [0.3, 0.7], "noul")}, "error": None}
    rep = score([(r1, yes), (r2, yes), (r3, yes)], metadata_slices=("level", "task"))
    lv = rep["slices"]["level"]
    assert list(lv) == ["0", "1"]  # values as strings
    assert lv["0"]["accuracy"] == 1.0 and lv["1"]["accuracy"] == 0.5 and lv["1"]["counts"]["decisions"] == 2
    assert rep["slices"]["task"]["<none>"]["counts"]["decisions"] == 2
    assert "level" not in score([(r1, yes)])["slices"]  # only when asked for
    with pytest.raises(ValueError, match="metadata_slices"):
        Scorer(metadata_slices=("category",))


def test_soft_metrics_unavailable_not_zero():
    rep = score(pairs()[:1])
    assert rep["distribution"] == {"n": 0, "kl": None, "brier_vs_distribution": None, "tvd": None,
                                   "status": "unavailable"}
    assert "suite" in rep["slices"] and "category" in rep["slices"]


def test_distribution_only_gold_scores_soft_but_not_hard():
    r = rec("r", NOUL, {"ok": {"probabilities": {"yes": 0.5, "no": 0.5}}})
    rep = score([(r, {"answers": {"ok": answer(YN, [0.5, 0.5], "noul")}, "error": None})])
    assert rep["counts"]["hard_labelled"] == 0 and rep["accuracy"] is None and rep["nll"] is None
    assert rep["distribution"]["kl"] == 0.0 and rep["distribution"]["status"] == "ok"


def test_invalid_answer_never_correct():
    r = rec("r", NOUL, {"ok": {"label": "yes"}})
    bad = {"answers": {"ok": answer(YN, [0.0, 2.0], "noul")}, "error": None}
    rep = score([(r, bad)])
    assert rep["accuracy"] == 0.0 and rep["counts"]["errors"] == 1 and rep["counts"]["coverage"] == 0.0
    assert rep["nll"] is None and rep["ece"] is None and rep["rows_all_correct"] == 0.0


def test_multi_field_rows_decision_level():
    r = rec("r", QUESTIONS, {"pick": {"label": "a"}, "level": {"label": 0}})
    a = {"answers": {"pick": answer(ABC, [0.8, 0.1, 0.1]), "level": answer(LVL, [0.1, 0.8, 0.1], "score")},
         "error": None}
    rep = score([(r, a), (r, a)])
    assert rep["accuracy"] == 0.5 and rep["rows_all_correct"] == 0.0


def test_update_argument_checks_and_reset():
    s = Scorer()
    with pytest.raises(TypeError, match="Record"):
        s.update({"id": "x"}, {"answers": {}, "error": None})
    r = rec("r", NOUL, {"ok": {"label": "yes"}})
    with pytest.raises(TypeError, match="answer_map"):
        s.update(r, None)
    with pytest.raises(ValueError, match="slice_by"):
        Scorer(slice_by=("nope",))
    s.update(r, {"answers": {"ok": answer(YN, [0.2, 0.8], "noul")}, "error": None})
    conf, ok = s.reliability_inputs()
    assert conf.tolist() == [0.8] and ok.tolist() == [1.0]
    s.reset()
    assert s.compute()["counts"]["decisions"] == 0


def test_baselines_by_hand():
    # pick: gold a, b, a (3 options); level: gold 2, 0 (3 levels); ok: gold yes (2 options)
    base = score(pairs())["baselines"]
    assert base["chance"] == pytest.approx((5 * (1 / 3) + 1 / 2) / 6)
    assert base["majority"] == pytest.approx((2 + 1 + 1) / 6)  # pick: a twice; level: one of each; ok: yes
    # gold slots over all six: a=0, 2, yes=1, b=1, a=0, 0 -> slot 0 three times
    assert base["majority_slot"] == pytest.approx(3 / 6)


def test_at_or_below_the_majority_answer_is_a_plain_warning():
    q = {"t": {"type": "choice", "instructions": "t", "criteria": {"harmful": None, "benign": None}}}
    pairs9 = [(rec(f"r{i}", q, {"t": {"label": "harmful" if i < 9 else "benign"}}),
               {"answers": {"t": answer(["harmful", "benign"], [0.4, 0.6] if i < 5 else [0.6, 0.4])}, "error": None})
              for i in range(10)]
    rep = score(pairs9)  # 4 of the 9 harmful right, the benign one wrong: 40% vs majority 90%
    assert rep["accuracy"] == pytest.approx(0.4) and rep["baselines"]["majority"] == pytest.approx(0.9)
    assert rep["warnings"] and "90.0%" in rep["warnings"][-1] and "most frequent gold option" in rep["warnings"][-1]
    right = [(rec("h", q, {"t": {"label": "harmful"}}), {"answers": {"t": answer(["harmful", "benign"], [0.9, 0.1])}}),
             (rec("b", q, {"t": {"label": "benign"}}), {"answers": {"t": answer(["harmful", "benign"], [0.2, 0.8])}})]
    assert not score(right)["warnings"]  # 2 of 2 right, above chance (50%) and majority (50%)


def test_an_unreadable_prediction_line_is_its_own_error_kind():
    """Issue #34 item 15: a row whose prediction line cannot be read (external scoring) is an
    error of every decision of the row, never correct, counted apart from error rows."""
    r = rec("r1", QUESTIONS, {"pick": {"label": "a"}, "level": {"label": 2}})
    rep = score([(r, {"answers": {}, "error": None, "unreadable": True})])
    assert rep["counts"]["error_kinds"] == {"unreadable_line": 2} and rep["counts"]["coverage"] == 0.0
    assert rep["accuracy"] == 0.0 and rep["accuracy_scored"] is None


def test_noul_separation_block():
    """P(yes) against the gold side: AUC and medians over scored hard-labelled yes/no decisions;
    an unscored one (record error) and non-noul questions are not in it."""
    p_yes = [0.9, 0.6, 0.55, 0.2, 0.6]
    gold = ["yes", "yes", "no", "no", "no"]
    ps = [(rec(f"n{i}", NOUL, {"ok": {"label": g}}), {"answers": {"ok": answer(YN, [1 - p, p], "noul")}, "error": None})
          for i, (p, g) in enumerate(zip(p_yes, gold))]
    ps.append((rec("bad", NOUL, {"ok": {"label": "yes"}}), {"answers": {}, "error": "boom"}))
    rep = score(ps + pairs()[:1])
    # yes {0.9, 0.6} vs no {0.55, 0.2, 0.6}: 3 + (1 + 1 + 0.5) over 6
    assert rep["noul"] == {"n": 5, "yes_auc": pytest.approx(5.5 / 6), "p_yes_median_yes": pytest.approx(0.75),
                           "p_yes_median_no": pytest.approx(0.55)}
    one_side = score(ps[:2])["noul"]
    assert one_side["yes_auc"] is None and one_side["p_yes_median_no"] is None and one_side["n"] == 2
    assert score(pairs()[:1])["noul"] == {"n": 0, "yes_auc": None, "p_yes_median_yes": None, "p_yes_median_no": None}


def test_the_eval_report_states_the_yes_no_separation(tmp_path):
    """report.md gives each suite with yes/no questions its P(yes) AUC and medians; a suite
    without any gets no such line."""
    from noulengine.eval.report import write_outputs
    from noulengine.eval.runner import TaskResult

    yn = [(rec(f"n{i}", NOUL, {"ok": {"label": g}}), {"answers": {"ok": answer(YN, [1 - p, p], "noul")}, "error": None})
          for i, (p, g) in enumerate([(0.8, "yes"), (0.3, "no"), (0.6, "no")])]
    results = [TaskResult("yn", "ready", rows=3, metrics=score(yn)),
               TaskResult("choice", "ready", rows=1, metrics=score(pairs()[:1]))]
    write_outputs(results, tmp_path, {"suite": "t", "engine": {}, "selection": None, "git_revision": None})
    report = (tmp_path / "report.md").read_text()
    assert ("Yes/no answers (3): P(yes) separates gold yes from gold no with ROC AUC 1.0000 (0.5 = no "
            "information); median P(yes) 0.8000 on gold-yes, 0.4500 on gold-no.") in report
    assert report.count("Yes/no answers") == 1
