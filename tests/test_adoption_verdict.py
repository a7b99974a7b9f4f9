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


def _interval(v, lo, hi):
    return {"value": v, "low": lo, "high": hi}


def _evidence(folder: Path, *, worse=(), mean_higher=True, new_constant=False, auc=0.9, refund_yes=(True, True),
              ece=0.02, ratio=1.0) -> None:
    (folder / "compare").mkdir(parents=True)
    const = [{"field": "needs_human", "constant": True}] if new_constant else []
    compare = {"baseline": "v2", "verdicts": {"v3": {"worse": list(worse), "worse_excused": ["jevbench_hard"],
                                                      "better": [], "below_chance": [], "mean_higher": mean_higher,
                                                      "passes": mean_higher and not worse}},
               "mean": {"runs": {"v3": {"diff": _interval(0.05, 0.02, 0.08)}}},
               "suites": {"typed_decisions": {"runs": {"v2": {"constant_fields": []},
                                                       "v3": {"constant_fields": const}}}}}
    (folder / "compare" / "compare.json").write_text(json.dumps(compare))
    (folder / "selection.json").write_text(json.dumps({CAND: {"kinds": {
        "noul:agnews": {"yes_auc": auc}, "noul:tool": {"yes_auc": 0.91}, "tool:toolrl": {"accuracy": 0.5}}}}))
    rows = [{"ticket": adoption_verdict.REFUND_TICKET, "order": order, "p_yes": 0.8 if ok else 0.3,
             "refund": "yes" if ok else "no", "refund_want": "yes"} for order, ok in zip(("criteria", "reversed"),
                                                                                        refund_yes)]
    (folder / "tickets.json").write_text(json.dumps({CAND: {"rows": rows}}))
    (folder / "speed.json").write_text(json.dumps({"a": "noul-smollm2-135m-v2", "b": CAND, "workloads": {
        "agnews_1q": {"ratio_b_over_a": ratio}}}))
    model = folder / CAND
    model.mkdir()
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
    ({"new_constant": True}, "no new constant field"),
    ({"auc": 0.84}, "yes AUC >= 0.85"),
    ({"refund_yes": (True, False)}, "README refund ticket"),
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


def test_missing_evidence_is_undecided_never_a_pass(tmp_path, monkeypatch):
    _evidence(tmp_path)
    shutil.rmtree(tmp_path / "compare")
    (tmp_path / "speed.json").unlink()
    assert _run(tmp_path, monkeypatch) == 3
    out = json.loads((tmp_path / "verdict.json").read_text())
    assert out["verdict"] == "undecided"
    assert sum(c["status"] == "not measured" for c in out["clauses"]) == 4


def test_evidence_about_other_models_is_refused(tmp_path, monkeypatch):
    _evidence(tmp_path)
    (tmp_path / "speed.json").write_text(json.dumps({"a": "default", "b": CAND, "workloads": {}}))
    with pytest.raises(SystemExit, match="timed A='default'"):
        _run(tmp_path, monkeypatch)
