"""``scripts/adoption_verdict.py``: the adoption rule clause by clause, from the chain's files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import adoption_verdict  # noqa: E402

CAND = "runs-cand-model"
NAMES = {"v2": "noul-smollm2-135m-v2", "v3": "noul-test-v3"}


def _interval(v, lo, hi):
    return {"value": v, "low": lo, "high": hi}


def _evidence(folder: Path, *, worse=(), below=(), mean_higher=True, mean_missing=(), new_constant=False, auc=0.9,
              refund_yes=(True, True), route="billing", ece=0.02, ratio=1.0, run_model=None, status="finished",
              drop_suite=None) -> None:
    """The chain's files as their writers lay them out, for a candidate passing every clause unless told."""
    (folder / "compare").mkdir(parents=True)
    const = [{"field": "needs_human", "n": 100, "answer_label": "no", "answer_share": 1.0, "gold_label": "yes",
              "gold_share": 0.67, "constant": True}] if new_constant else []
    suites = {name: {"runs": {"v2": {"constant_fields": [], "above_chance": _interval(0.07, 0.05, 0.09)},
                              "v3": {"constant_fields": [], "diff": _interval(-0.04, -0.06, -0.01) if name in worse
                                     else _interval(0.01, -0.02, 0.04),
                                     "above_chance": _interval(-0.04, -0.07, -0.01) if name in below
                                     else _interval(0.1, 0.05, 0.15)}}}
              for name in adoption_verdict.rule_suites() if name != drop_suite}
    suites["typed_decisions"]["runs"]["v3"]["constant_fields"] = const
    runs = []
    for label in ("v2", "v3"):
        run = folder / f"{label}-run"
        run.mkdir()
        model = run_model if (run_model and label == "v3") else NAMES[label]
        (run / "run.json").write_text(json.dumps({"engine": {"model": {"name": model}}, "status": status}))
        runs.append({"name": label, "files": [str(run / "predictions.jsonl")]})
    compare = {"baseline": "v2", "runs": runs,
               "verdicts": {"v3": {"worse": list(worse), "worse_excused": ["jevbench_hard"], "better": [],
                                   "below_chance": list(below), "mean_higher": mean_higher,
                                   "passes": mean_higher and not worse}},
               "mean": {"suites": ["agnews"] * (7 - len(mean_missing)), "missing": list(mean_missing),
                        "runs": {"v3": {"diff": _interval(0.05, 0.02, 0.08)}}},
               "suites": suites}
    (folder / "compare" / "compare.json").write_text(json.dumps(compare))
    (folder / "selection.json").write_text(json.dumps({CAND: {"kinds": {
        "noul:agnews": {"yes_auc": auc}, "noul:tool": {"yes_auc": 0.91}, "tool:toolrl": {"accuracy": 0.5}}}}))
    rows = [{"ticket": adoption_verdict.REFUND_TICKET, "order": order, "p_yes": 0.8 if ok else 0.3,
             "refund": "yes" if ok else "no", "refund_want": "yes", "route": route, "route_want": "billing"}
            for order, ok in zip(("criteria", "reversed"), refund_yes)]
    (folder / "tickets.json").write_text(json.dumps({CAND: {"rows": rows}}))
    (folder / "speed.json").write_text(json.dumps({"a": "noul-smollm2-135m-v2", "b": CAND, "workloads": {
        "agnews_1q": {"ratio_b_over_a": ratio}}}))
    model = folder / CAND
    model.mkdir()
    (model / "training.json").write_text(json.dumps({"name": NAMES["v3"]}))
    (model / "calibration.json").write_text(json.dumps({"metrics": {"selection": {"all": {"after": {
        "ece": ece, "n": 700, "accuracy": 0.93}}}}}))


def _run(folder, monkeypatch):
    monkeypatch.chdir(folder)
    return adoption_verdict.main(["--dir", ".", "--candidate-model", CAND])


def test_every_clause_passing_adopts(tmp_path, monkeypatch, capsys):
    _evidence(tmp_path)
    assert _run(tmp_path, monkeypatch) == 0
    out = json.loads((tmp_path / "verdict.json").read_text())
    assert out["verdict"] == "adopt" and len(out["clauses"]) == 7
    assert all(c["status"] == "pass" for c in out["clauses"])
    text = capsys.readouterr().out
    assert "excused, the baseline at chance there: jevbench_hard" in text and "+5.0 points [+2.0, +8.0]" in text


@pytest.mark.parametrize("change, clause", [
    ({"worse": ["toolace"]}, "no suite worse"),
    ({"mean_higher": False}, "seven-suite mean higher"),
    ({"below": ["jevbench_hard"]}, "seven-suite mean higher"),
    ({"new_constant": True}, "no new constant field"),
    ({"auc": 0.84}, "yes AUC >= 0.85"),
    ({"refund_yes": (True, False)}, "README refund ticket"),
    ({"route": "shipping"}, "README refund ticket"),  # refund right, routed wrong: not right
    ({"ece": 0.051}, "calibrated ECE"),
    ({"ratio": 0.9}, "speed unchanged"),
])
def test_one_failing_clause_keeps_the_baseline_and_is_named(tmp_path, monkeypatch, change, clause):
    _evidence(tmp_path, **change)
    assert _run(tmp_path, monkeypatch) == 1
    out = json.loads((tmp_path / "verdict.json").read_text())
    assert out["verdict"] == "keep the baseline"
    assert [c["clause"] for c in out["clauses"] if c["status"] == "fail"] == [
        next(c["clause"] for c in out["clauses"] if c["clause"].startswith(clause))]
    failed = next(c for c in out["clauses"] if c["status"] == "fail")["evidence"]
    # the failed clause carries its interval (issue #45: "say which clause failed, with its interval")
    expected = {"worse": "toolace -4.0 points [-6.0, -1.0] (the baseline above chance there: +7.0 points [+5.0, +9.0])",
                "below": "under chance on jevbench_hard -4.0 points [-7.0, -1.0]",
                "new_constant": "needs_human = no on 100% of 100 (gold's most common 67%)"}
    for key, text in expected.items():
        if key in change:
            assert text in failed


def test_missing_evidence_is_undecided_never_a_pass(tmp_path, monkeypatch):
    _evidence(tmp_path)
    shutil.rmtree(tmp_path / "compare")
    (tmp_path / "speed.json").unlink()
    (tmp_path / "verdict.md").write_text("an earlier verdict")
    assert _run(tmp_path, monkeypatch) == 3
    out = json.loads((tmp_path / "verdict.json").read_text())
    assert out["verdict"] == "undecided" and "an earlier" not in (tmp_path / "verdict.md").read_text()
    assert sum(c["status"] == "not measured" for c in out["clauses"]) == 4


@pytest.mark.parametrize("change, undecided", [
    ({"mean_missing": ["agnews"]}, ["seven-suite mean higher"]),
    ({"drop_suite": "zh-decision-bench"}, ["no suite worse", "seven-suite mean higher"]),
    ({"status": "interrupted"}, ["no suite worse", "seven-suite mean higher"]),
    ({"auc": None}, ["yes AUC"]),
    ({"refund_yes": ()}, ["README refund ticket"]),
])
def test_partial_evidence_is_undecided(tmp_path, monkeypatch, change, undecided):
    _evidence(tmp_path, **change)
    assert _run(tmp_path, monkeypatch) == 3
    out = json.loads((tmp_path / "verdict.json").read_text())
    assert [c["clause"] for c in out["clauses"] if c["status"] == "not measured"] == [
        next(c["clause"] for c in out["clauses"] if c["clause"].startswith(u)) for u in undecided]


@pytest.mark.parametrize("change", [{"run_model": "noul-smollm2-135m-v6"}, {"speed_models": True}])
def test_evidence_about_other_models_is_refused(tmp_path, monkeypatch, capsys, change):
    _evidence(tmp_path, **{k: v for k, v in change.items() if k != "speed_models"})
    if change.get("speed_models"):
        (tmp_path / "speed.json").write_text(json.dumps({"a": "default", "b": CAND, "workloads": {}}))
    assert _run(tmp_path, monkeypatch) == 2
    err = capsys.readouterr().err
    assert ("made by model 'noul-smollm2-135m-v6'" in err) if "run_model" in change else ("timed A='default'" in err)
    assert not (tmp_path / "verdict.json").exists()
