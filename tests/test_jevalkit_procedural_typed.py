"""Procedural Typed Decisions (jevalkit-v1) from a hand-written local copy (config all, test split):
JSON-string questions and answers, posterior-only questions (probability losses and posterior MAE,
never a hard label), task and level slices, availability, and what inference receives."""

from __future__ import annotations

import copy
import json
import math

import pytest

from noulengine.eval.suites import get_suite
from noulengine.eval.suites.families.procedural_typed import parse_item, task_of
from noulengine.metrics import Scorer
from noulengine.records.errors import RecordError
from tests.jevalkit_helpers import FIXTURES, bench, read_rows  # noqa: F401 (bench: a fixture)

FILE = FIXTURES / "procedural-typed-decisions" / "all" / "test.jsonl"
ROWS = read_rows(FILE)
ANSWERS = {  # engine label order: noul (no, yes); score levels; choice criteria order
    "bayes-00001": {"red": [0.4, 0.6], "count": [0.1, 0.6, 0.2, 0.1]},
    "bayes-00002": {"red": [0.2, 0.8]},
    "route-00007": {"team": [0.7, 0.2, 0.1]},
    "route-00008": {"team": [0.2, 0.3, 0.5], "escalate": [0.9, 0.1]},
}


def _rec(rid, **changes):
    item = copy.deepcopy(ROWS[rid])
    item.update(changes)
    return parse_item(item, file="all/test.jsonl")


def _report():
    scorer = Scorer(metadata_slices=("task", "level"))
    for rid, probs in ANSWERS.items():
        rec = _rec(rid)
        qs = {q.field: q for q in rec.request.questions}
        scorer.update(rec, {"answers": {f: {"probabilities": dict(zip(qs[f].labels, p))} for f, p in probs.items()},
                            "error": None})
    return scorer.compute()


def test_questions_and_answers_decode_from_json_strings():
    rec = _rec("bayes-00001")
    assert [q.field for q in rec.request.questions] == ["red", "count"]
    assert rec.request.state == {"urn": "3 red and 1 blue ball", "drawn": "one ball, unseen"}
    assert rec.targets["count"].label == "1"  # {"score": 1}
    assert _rec("bayes-00002").targets["red"].label == "yes"  # {"noul": 1.0}: exact, a hard label
    assert _rec("route-00008").targets["escalate"].label == "no"  # {"noul": false}
    team = _rec("route-00007").targets["team"]
    assert team.label == "billing" and team.probabilities == {"billing": 0.9, "shipping": 0.05, "tech": 0.05}


def test_posteriors_get_no_invented_hard_label():
    red = _rec("bayes-00001").targets["red"]
    assert red.label is None and red.probabilities == {"no": 0.25, "yes": 0.75}
    team = _rec("route-00008").targets["team"]  # probabilities without a choice: posterior-only
    assert team.label is None and team.probabilities == {"billing": 0.0, "shipping": 0.5, "tech": 0.5}
    assert _rec("route-00008").metadata["posterior_only"] == ["team"]


def test_posterior_questions_count_only_in_probability_losses():
    """Hard decisions: count, red (bayes-00002), team (route-00007), escalate: all right, confidences
    0.6, 0.8, 0.7, 0.9 (one per bin): ECE = mean(1 - conf) = 0.25. The two posteriors enter neither."""
    r = _report()
    assert r["counts"]["decisions"] == 6 and r["counts"]["hard_labelled"] == 4
    assert r["accuracy"] == 1.0 and r["reference"]["accuracy"] == 1.0
    assert r["ece"] == pytest.approx(0.25) and r["reference"]["ece"] == pytest.approx(0.25)
    post = r["reference"]["posterior"]
    # red: |0.6 - 0.75| = 0.15; team: mean(|0.2 - 0|, |0.3 - 0.5|, |0.5 - 0.5|) = 0.4 / 3
    assert post["n"] == 2 and post["mae"] == pytest.approx((0.15 + 0.4 / 3) / 2)
    ce_red = -(0.75 * math.log(0.6) + 0.25 * math.log(0.4))
    ce_team = -(0.5 * math.log(0.3) + 0.5 * math.log(0.5))
    assert post["cross_entropy"] == pytest.approx((ce_red + ce_team) / 2)
    # soft targets (the two posteriors and route-00007's probabilities): TVD 0.15, 0.2, 0.2
    assert r["distribution"]["n"] == 3 and r["distribution"]["tvd"] == pytest.approx((0.15 + 0.2 + 0.2) / 3)


def test_task_and_level_slices():
    assert task_of({"id": "bayes-00012"}) == "bayes" and task_of({"id": "x", "task": "routing"}) == "routing"
    r = _report()
    assert set(r["slices"]["task"]) == {"bayes", "routing"}
    assert set(r["slices"]["level"]) == {"0", "2", "3", "4"}
    assert r["slices"]["level"]["2"]["counts"]["hard_labelled"] == 1  # count; red is a posterior
    assert r["slices"]["task"]["routing"]["reference"]["posterior"]["n"] == 1


def test_bad_rows_name_the_rule():
    with pytest.raises(RecordError, match="level must be an integer 0-4"):
        _rec("bayes-00002", level=7)
    with pytest.raises(RecordError, match="not valid JSON"):
        _rec("bayes-00002", answers="{nope")
    with pytest.raises(RecordError, match="score answer"):
        _rec("bayes-00001", answers=json.dumps({"count": {"score": "1"}}))
    with pytest.raises(RecordError, match="does not ask"):
        _rec("bayes-00002", answers=json.dumps({"blue": {"noul": 0.5}}))


def test_inference_never_receives_answers_ids_or_levels(tiny_llama, tiny_tokenizer):
    from noulengine import Engine

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    for rid in ROWS:
        a = engine.compiler.compile(_rec(rid).request)
        b = engine.compiler.compile(_rec(rid, id="zz-secret-9", level=1, task="SECRET-TASK", answers="{}").request)
        assert a.token_ids == b.token_ids
        text = tiny_tokenizer.decode(a.token_ids)
        for secret in (rid, "0.75", "probabilities", "answers"):
            assert secret not in text


def test_unavailable_then_runs_from_the_local_copy(bench, tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine
    from noulengine.eval.runner import EvalConfig, run_eval

    status = get_suite("procedural-typed-decisions").available(tmp_path / "empty")
    assert status.state == "unavailable" and "procedural-typed-decisions/all/test.jsonl" in status.reason
    assert "download Procedural Typed Decisions" in status.reason
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    [res] = run_eval(engine, EvalConfig(suite="procedural-typed-decisions", output=str(tmp_path / "run"),
                                        source=str(FIXTURES), progress=False, plots=False))
    m = res.metrics
    assert res.status == "ready" and m["counts"]["decisions"] == 6 and m["counts"]["hard_labelled"] == 4
    assert m["reference"]["posterior"]["scored"] == 2 and set(m["slices"]["task"]) == {"bayes", "routing"}
