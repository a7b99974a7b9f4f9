"""DecisionBench (jevalkit-v1) from a hand-written local copy in the upstream row format: the binary
projection, choice ids, score re-sorting with the inverse mapping and original values, the 1e-15
NLL floor, availability without the data, and what inference receives."""

from __future__ import annotations

import copy
import json
import math

import pytest

from noulengine.eval.suites import get_suite
from noulengine.eval.suites.families.decisionbench import parse_item
from noulengine.metrics import Scorer
from noulengine.records.errors import RecordError
from tests.jevalkit_helpers import FIXTURES, bench, read_rows  # noqa: F401 (bench: a fixture)

ROWS = read_rows(FIXTURES / "decisionbench" / "eval.jsonl")


def _rec(rid, **changes):
    item = copy.deepcopy(ROWS[rid])
    item.update(changes)
    return parse_item(item, file="eval.jsonl")


def _score(pairs):
    scorer = Scorer(metadata_slices=("task", "primitive"))
    for rec, probs in pairs:
        q = rec.request.questions[0]
        scorer.update(rec, {"answers": {"decision": {"probabilities": dict(zip(q.labels, probs))}}, "error": None})
    return scorer.compute()


def test_binary_first_candidate_is_yes():
    rec = _rec("db-bin-1")
    q = rec.request.questions[0]
    assert q.type == "noul" and q.labels == ("no", "yes")
    assert q.descriptions == ("Not eligible: outside the window", "Eligible: within the 30-day window")
    assert rec.targets["decision"].label == "yes"  # gold = the first candidate
    assert rec.targets["decision"].probabilities == {"no": 0.2, "yes": 0.8}
    assert _rec("db-bin-2").targets["decision"].label == "no"  # gold = the second candidate
    assert rec.request.state == {"order": "A-17", "days_since_delivery": 12, "policy": "refunds within 30 days"}
    assert rec.metadata["source"] == {"generator": "internal-gen-v3", "seed": 991}  # source_json parsed, kept aside


def test_binary_tie_goes_to_the_first_candidate_in_the_reference():
    report = _score([(_rec("db-bin-1"), [0.5, 0.5])])  # engine order (no, yes)
    assert report["accuracy"] == 0.0  # generic: first maximum in (no, yes) is "no"
    assert report["reference"]["accuracy"] == 1.0  # source: first maximum in (eligible=yes, not_eligible=no)


def test_choice_keeps_the_original_candidate_ids():
    rec = _rec("db-sel-1")
    q = rec.request.questions[0]
    assert q.type == "choice" and q.labels == ("c7", "c2", "c9")
    assert q.descriptions == ("Postal: 3-5 days, cheapest", "Express: next day", "Freight: pallets only")
    assert rec.targets["decision"].label == "c2"
    assert rec.targets["decision"].probabilities == {"c7": 0.1, "c2": 0.7, "c9": 0.2}  # a list, in candidate order


def test_score_sorted_by_ordinal_value_with_the_inverse_mapping():
    rec = _rec("db-ord-1")  # candidates high (3), low (1), mid (2)
    q = rec.request.questions[0]
    assert q.type == "score" and q.labels == ("0", "1", "2")
    assert q.descriptions == ("Low: cosmetic", "Medium: degraded service", "High: outage or data loss")
    assert rec.targets["decision"].label == "1"  # gold mid = level 1
    rule = rec.metadata["protocol"]["fields"]["decision"]
    assert rule == {"order": [2, 0, 1], "values": [1.0, 2.0, 3.0]}  # high -> 2, low -> 0, mid -> 1
    # equal ordinal values keep their order: a(5), b(0), c(5) -> b, a, c
    rec2 = _rec("db-ord-2")
    assert rec2.request.questions[0].descriptions == ("Zero", "Five", "Five (urgent)")
    assert rec2.metadata["protocol"]["fields"]["decision"] == {"order": [1, 0, 2], "values": [0.0, 5.0, 5.0]}
    assert rec2.targets["decision"].label == "2"
    assert rec2.targets["decision"].probabilities == {"0": 0.0, "1": 0.25, "2": 0.75}


def test_ordinal_ties_resolve_in_the_original_order():
    """Levels (low, mid, high) get (0.2, 0.4, 0.4): the generic argmax takes mid (first maximum in level
    order, the gold: right); upstream visits high, low, mid and takes high (wrong)."""
    report = _score([(_rec("db-ord-1"), [0.2, 0.4, 0.4])])
    assert report["accuracy"] == 1.0 and report["reference"]["accuracy"] == 0.0


def test_ordinal_error_in_the_original_values():
    """db-ord-2: values (0, 5, 5) by level, gold c = 5. p = (0.5, 0.25, 0.25): expected value
    0 * 0.5 + 5 * 0.25 + 5 * 0.25 = 2.5, error |2.5 - 5| = 2.5; the generic error in levels is
    |0.75 - 2| = 1.25."""
    report = _score([(_rec("db-ord-2"), [0.5, 0.25, 0.25])])
    assert report["reference"]["ordinal_values"] == {"n": 1, "mae": pytest.approx(2.5)}
    assert report["ordinal"]["mae"] == pytest.approx(1.25)


def test_reference_nll_floor_is_1e_15():
    report = _score([(_rec("db-bin-1"), [1.0, 0.0])])  # P(gold yes) = 0
    assert report["nll"] == pytest.approx(-math.log(1e-12))  # 27.63
    assert report["reference"]["nll"] == pytest.approx(-math.log(1e-15))  # 34.54
    assert report["reference"]["nll_floored"] == 1 and report["reference"]["rules"]["nll_floor"] == 1e-15


def test_soft_targets_are_scored():
    report = _score([(_rec("db-bin-1"), [0.2, 0.8]), (_rec("db-sel-1"), [0.1, 0.7, 0.2])])
    assert report["distribution"]["n"] == 2 and report["distribution"]["tvd"] == pytest.approx(0.0)


def test_bad_rows_name_the_rule():
    with pytest.raises(RecordError, match="unknown primitive"):
        _rec("db-bin-1", primitive="ranking")
    with pytest.raises(RecordError, match="not a candidate id"):
        _rec("db-sel-1", gold_candidate_id="c1")
    with pytest.raises(RecordError, match="exactly 2 candidates"):
        _rec("db-sel-1", primitive="binary_classification")
    with pytest.raises(RecordError, match="ordinal_scoring needs a number"):
        _rec("db-sel-1", primitive="ordinal_scoring")
    with pytest.raises(RecordError, match="question text"):
        _rec("db-sel-1", question=None)


def test_inference_never_receives_gold_source_task_or_id(tiny_llama, tiny_tokenizer):
    from noulengine import Engine

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    for rid in ROWS:
        base = _rec(rid)
        other = _rec(rid, id="zz-secret", task="secret_task", gold_candidate_id=None, gold_probabilities=None,
                     source_json=json.dumps({"generator": "SECRET-GEN"}), source={"generator": "SECRET-GEN"})
        a, b = engine.compiler.compile(base.request), engine.compiler.compile(other.request)
        assert a.token_ids == b.token_ids
        text = tiny_tokenizer.decode(b.token_ids)
        for secret in ("zz-secret", "secret_task", "SECRET-GEN", "internal-gen", "gold", "ordinal_value"):
            assert secret not in text


def test_unavailable_without_the_local_copy_names_the_download(bench, tmp_path):
    suite = get_suite("decisionbench")
    status = suite.available(tmp_path / "empty")
    assert status.state == "unavailable" and "decisionbench/eval.jsonl" in status.reason
    assert "download DecisionBench's eval split" in status.reason


def test_runs_from_the_local_copy(bench, tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine
    from noulengine.eval.runner import EvalConfig, run_eval
    from noulengine.eval.suites import sha256_file

    suite = get_suite("decisionbench")
    assert suite.available(FIXTURES).state == "preparable"
    rows = suite.load(source=FIXTURES)
    assert [r.id for _, r in rows] == list(ROWS)
    assert suite.prepared_pins() == {"eval.jsonl": sha256_file(FIXTURES / "decisionbench" / "eval.jsonl")}
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    [res] = run_eval(engine, EvalConfig(suite="decisionbench", output=str(tmp_path / "run"), source=str(FIXTURES),
                                        progress=False, plots=False))
    m = res.metrics
    assert res.status == "ready" and m["counts"]["decisions"] == 5 and m["counts"]["errors"] == 0
    assert m["reference"]["family"] == "decisionbench" and m["reference"]["ordinal_values"]["n"] == 2
    assert set(m["slices"]["primitive"]) == {"binary_classification", "candidate_selection", "ordinal_scoring"}
    assert m["distribution"]["n"] == 3
