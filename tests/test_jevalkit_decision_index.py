"""Decision Index (jevalkit-v1) from a hand-written local build: only state and questions reach the
model, expected-null questions stay asked but unscored, and the generic accuracy is a named
diagnostic, never the index."""

from __future__ import annotations

import copy
import json

import pytest

from noulengine.eval.suites import get_suite
from noulengine.eval.suites.families.decision_index import parse_item
from noulengine.metrics import Scorer
from noulengine.metrics.reference import reference_lines
from noulengine.records.errors import RecordError
from tests.jevalkit_helpers import FIXTURES, bench, read_rows  # noqa: F401 (bench: a fixture)

ROWS = read_rows(FIXTURES / "decision-index" / "suite.jsonl")


def _rec(rid, **changes):
    item = copy.deepcopy(ROWS[rid])
    item.update(changes)
    return parse_item(item, file="suite.jsonl")


def _score(answers: dict[str, dict[str, list[float]]]):
    scorer = Scorer(metadata_slices=("track",))
    for rid, probs in answers.items():
        rec = _rec(rid)
        qs = {q.field: q for q in rec.request.questions}
        scorer.update(rec, {"answers": {f: {"probabilities": dict(zip(qs[f].labels, p))} for f, p in probs.items()},
                            "error": None})
    return scorer.compute()


def test_expected_answers_become_targets_and_null_ones_stay_asked():
    rec = _rec("di-001")
    assert [q.field for q in rec.request.questions] == ["route", "urgency", "sentiment"]  # sentiment still asked
    assert rec.targets["route"].label == "billing" and rec.targets["urgency"].label == "2"  # "today" = level 2
    assert "sentiment" not in rec.targets and rec.metadata["unscored"] == ["sentiment"]
    two = _rec("di-002")  # a row-level expected object
    assert two.targets["harmful"].label == "no" and two.metadata["unscored"] == ["category"]
    assert rec.metadata["track"] == "support" and rec.metadata["weight"] == 2.0


def test_unscored_questions_count_in_no_metric():
    """route right (0.8), urgency wrong (0.5 on level 1), harmful right (0.7); the unscored sentiment
    and category get no answer at all and still cost nothing: 3 decisions, coverage 100%."""
    r = _score({"di-001": {"route": [0.8, 0.2], "urgency": [0.2, 0.5, 0.3]}, "di-002": {"harmful": [0.7, 0.3]}})
    assert r["counts"]["decisions"] == 3 and r["counts"]["errors"] == 0 and r["counts"]["coverage"] == 1.0
    assert r["accuracy"] == pytest.approx(2 / 3)
    assert r["reference"]["unscored"] == {"questions": 2, "rows": 2}
    # ECE: one decision per bin: (|0.8 - 1| + |0.5 - 0| + |0.7 - 1|) / 3
    assert r["ece"] == pytest.approx((0.2 + 0.5 + 0.3) / 3)
    # an invalid answer to an unscored question is still no error
    r2 = _score({"di-001": {"route": [0.8, 0.2], "urgency": [0.2, 0.5, 0.3], "sentiment": [2.0, -1.0]},
                 "di-002": {"harmful": [0.7, 0.3]}})
    assert r2["counts"] == r["counts"]


def test_generic_accuracy_is_named_a_diagnostic_not_the_index():
    r = _score({"di-001": {"route": [0.8, 0.2], "urgency": [0.2, 0.5, 0.3]}, "di-002": {"harmful": [0.7, 0.3]}})
    assert "not the Decision Index" in r["reference"]["diagnostic_only"]
    assert "index" not in r and "decision_index" not in r["reference"]  # no number is ever called the index
    lines = "\n".join(reference_lines(r))
    assert "a diagnostic, not the Decision Index" in lines and "2 question(s) on 2 row(s)" in lines
    notes = get_suite("decision-index").report_notes()
    assert any("not the Decision Index" in n for n in notes)


def test_bad_rows_name_the_rule():
    with pytest.raises(RecordError, match="unknown question key 'answer_key'"):
        _rec("di-001", questions={"q": {"type": "noul", "instructions": "x?", "answer_key": True}})
    with pytest.raises(RecordError, match="given twice"):
        _rec("di-001", expected={"route": "billing"})
    with pytest.raises(RecordError, match="not a candidate"):
        _rec("di-002", expected={"harmful": False, "category": "rant"})


def test_inference_receives_state_and_questions_only(tiny_llama, tiny_tokenizer):
    from noulengine import Engine

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    for rid, row in ROWS.items():
        blank = copy.deepcopy(row)
        for q in blank["questions"].values():
            q.pop("expected", None)
        blank.pop("expected", None)
        blank.update(id="zz-secret", track="SECRET-TRACK", weight=9.5, source="SECRET-SOURCE")
        a = engine.compiler.compile(_rec(rid).request)
        b = engine.compiler.compile(parse_item(blank, file="x").request)
        assert a.token_ids == b.token_ids
        text = tiny_tokenizer.decode(a.token_ids)
        for secret in (rid, "di-build-SECRET", "expected", "support", "weight"):
            assert secret not in text


def test_unavailable_then_runs_from_the_local_build(bench, tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine
    from noulengine.eval.runner import EvalConfig, run_eval

    status = get_suite("decision-index").available(tmp_path / "empty")
    assert status.state == "unavailable" and "decision-index/suite.jsonl" in status.reason
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    [res] = run_eval(engine, EvalConfig(suite="decision-index", output=str(tmp_path / "run"), source=str(FIXTURES),
                                        progress=False, plots=False))
    m = res.metrics
    assert m["counts"]["decisions"] == 3 and m["reference"]["unscored"] == {"questions": 2, "rows": 2}
    assert set(m["slices"]["track"]) == {"support", "safety"}
    preds = [json.loads(x) for x in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert "sentiment" in preds[0]["answers"]  # the unscored question was asked and answered
