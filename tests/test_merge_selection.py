"""``scripts/merge_selection.py`` and ``scripts/merge_chain.py`` (issue #54 items 2-4): the rule that
names the merged candidates from selection-row scores, and the chain's plan, without a model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts")]

import merge_chain  # noqa: E402
import merge_selection as ms  # noqa: E402


def _kind(acc: float, n: int = 10, auc: float | None = None) -> dict:
    out = {"decisions": n, "accuracy": acc, "nll": 1.0, "brier": 0.5, "ece": 0.1}
    if auc is not None:
        out["yes_auc"] = auc
    return out


def _metrics(ag: float, tools: float, noul_auc: float, procedural_auc: float = 0.1) -> dict:
    kinds = {"qa_reasoning": _kind(ag, 100), "tool:toolrl": _kind(tools, 50),
             "noul:agnews": _kind(0.8, 60, noul_auc), "noul:tool": _kind(0.8, 60, 0.99),
             "procedural:arithmetic": _kind(0.5, 20, procedural_auc), "procedural:table_lookup": _kind(0.7, 30)}
    return {"all": {"decisions": 320, "accuracy": 0.7, "nll": 1.0}, "kinds": kinds}


def test_families_weigh_alike_and_only_held_out_yes_no_kinds_gate():
    s = ms.summarize(_metrics(0.9, 0.5, 0.88))
    assert s["families"]["procedural"] == pytest.approx((0.5 * 20 + 0.7 * 30) / 50)  # decisions-weighted inside
    assert s["score"] == pytest.approx((0.9 + 0.5 + 0.8 + 0.62) / 4)  # each family one quarter
    assert s["min_yes_auc"] == pytest.approx(0.88)  # procedural's 0.1 AUC is reported, not a gate


def test_the_best_eligible_merge_per_slot_with_ties_going_to_the_principled_one():
    results = {name: ms.summarize(_metrics(0.9, 0.5, 0.9)) for name in ms.GRID}
    results["v2v6-lin30"] = ms.summarize(_metrics(0.9, 0.52, 0.9))  # +0.5 points: within the tie margin
    results["v2v4-lin30"] = ms.summarize(_metrics(0.9, 0.6, 0.9))  # +2.5 points: wins
    results["v2v4-ties"] = ms.summarize(_metrics(0.95, 0.7, 0.5))  # best score, but its yes AUC fails
    results["v4x5n"] = ms.summarize(_metrics(0.9, 0.5, 0.8))  # ineligible: the three-way merge is taken
    chosen = ms.choose(results)
    assert chosen == {"c1": "v2v6-lin50", "c2": "v2v4-lin30", "c3": "v2v4v6-lin"}
    results["v2v4v6-lin"] = ms.summarize(_metrics(0.9, 0.5, 0.7))
    assert ms.choose(results)["c3"] is None  # nothing eligible: no third candidate


def test_the_sources_are_scored_as_they_are_and_merges_under_runs():
    assert ms.model_path("v2") == ms.V2 and ms.model_path("v4x5n") == ms.V4
    assert ms.model_path("v2v6-lin50") == str(ms.OUT / "models" / "v2v6-lin50")
    assert len(ms.GRID) <= 12 and all(fam in (*ms.CANDIDATES, "source") for fam, *_ in ms.GRID.values())


def test_the_chain_plan_runs_the_deciding_suite_first(capsys, monkeypatch):
    monkeypatch.setattr(merge_chain, "REPO", REPO / "no-such-checkout")  # nothing done: the whole plan
    assert merge_chain.main(["--plan"]) == 0
    out = capsys.readouterr().out
    evals = [line for line in out.splitlines() if "noulengine.eval --suite" in line]
    assert "typed_decisions" in evals[0] and "agnews,wildjailbreak" in evals[-1]
    assert out.index("merge_selection.py") < out.index("calibrate") < out.index("selection_by_kind.py")
    assert "compare_models_speed.py" in out and out.rstrip().endswith("compare/compare.md")


def test_the_continuation_joins_the_chain_once_trained_with_its_own_clause_files(capsys, monkeypatch, tmp_path):
    """Item 4's candidate: until its training folder is finished the plan names the command that trains
    it; once finished it is copied in, calibrated, checked on its own clause files (the shared ones
    predate it) and evaluated on every group beside v2."""
    monkeypatch.setattr(merge_chain, "REPO", tmp_path)
    assert merge_chain.main(["--plan"]) == 0
    assert "# v7: not trained yet" in capsys.readouterr().out
    label, trained = merge_chain.CONTINUATION
    (tmp_path / trained).mkdir(parents=True)
    (tmp_path / trained / "training.json").write_text("{}")
    assert merge_chain.main(["--plan"]) == 0
    out = capsys.readouterr().out
    folder = f"runs/chain54/models/{label}"
    assert f"{folder}/" in out and f"--model {folder} --output {folder}/calibration.json" in out
    assert f"--output runs/chain54/{label}/tickets.json" in out and f"--output runs/chain54/{label}/selection.json" in out
    groups = [g for g, _ in merge_chain.EVALS]
    assert all(f"--output runs/chain54/evals/{label}-{g} " in out for g in groups)
    (tmp_path / trained / "checkpoint").mkdir()  # paused: not finished
    assert merge_chain.main(["--plan"]) == 0
    assert "# v7: not trained yet" in capsys.readouterr().out
