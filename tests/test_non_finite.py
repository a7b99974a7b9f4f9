"""A NaN is never an answer: non-finite logits make that request an error row, everywhere.

The model is a tiny seeded Qwen2 (untied head) with one input-embedding row set to NaN, so only
requests whose prompt contains that token produce NaN logits; the others must be answered exactly
as by the clean model.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from noulengine import Engine
from noulengine.engine.decision import make_answer
from noulengine.records.errors import NonFiniteLogitsError

QUESTIONS = {"flag": {"type": "noul", "instructions": "Should a human look at it?"},
             "topic": {"type": "choice", "instructions": "Which topic?", "criteria": {"world": None, "sports": None}}}
GOOD = {"id": "good", "state": "the sun is up", "questions": QUESTIONS}
BAD = {"id": "bad", "state": "quartz jukebox vexed", "questions": QUESTIONS}


def strict_loads(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in output")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def nan_model(tiny_qwen2, tiny_tokenizer):
    """tiny_qwen2 with the embedding row of a token that only BAD's prompt contains set to NaN."""
    clean = Engine.from_model(tiny_qwen2, tiny_tokenizer)
    only_bad = sorted(set(clean.compile(BAD).token_ids) - set(clean.compile(GOOD).token_ids))
    assert only_bad, "the two prompts must differ in at least one token"
    model = copy.deepcopy(tiny_qwen2)
    assert not model.config.tie_word_embeddings  # the head stays finite: only the input row is poisoned
    with torch.no_grad():
        model.get_input_embeddings().weight[only_bad[0]] = float("nan")
    return model


def test_make_answer_refuses_nan_and_inf(tiny_llama, tiny_tokenizer):
    plan = Engine.from_model(tiny_llama, tiny_tokenizer).compile(GOOD).questions[1]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(NonFiniteLogitsError, match="non-finite candidate logits") as info:
            make_answer(plan, torch.full((1, 2), bad, dtype=torch.float64))
        assert info.value.field == "topic" and info.value.rule == "non-finite logits"


def test_nan_request_is_an_error_row_and_the_others_are_answered(nan_model, tiny_qwen2, tiny_tokenizer):
    out = Engine.from_model(nan_model, tiny_tokenizer).decide_batch([GOOD, BAD, {**GOOD, "id": "good2"}])
    assert out[0].ok and out[2].ok and not out[1].ok
    err = out[1].error
    assert err["error_type"] == "NonFiniteLogitsError" and err["rule"] == "non-finite logits"
    assert err["record_id"] == "bad" and err["field"] in QUESTIONS and out[1].answers == {}
    ref = Engine.from_model(tiny_qwen2, tiny_tokenizer).decide(GOOD)
    for field, answer in ref.answers.items():
        for label, p in answer.probabilities.items():
            assert out[0].answers[field].probabilities[label] == pytest.approx(p, abs=1e-6)
    strict_loads(json.dumps([d.to_dict() for d in out], allow_nan=False))
    with pytest.raises(NonFiniteLogitsError):
        Engine.from_model(nan_model, tiny_tokenizer).decide(BAD)  # the single-request API raises


def test_cli_decide_writes_an_error_row_never_nan(nan_model, tiny_tokenizer, monkeypatch, tmp_path, capsys):
    from noulengine import cli

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(nan_model, tiny_tokenizer))
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(GOOD) + "\n" + json.dumps(BAD) + "\n")
    assert cli.main(["decide", "--no-progress", "--input", str(src), "--output", str(dst)]) == 1
    rows = [strict_loads(line) for line in dst.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["good", "bad"] and rows[0]["error"] is None
    assert rows[1]["error"]["rule"] == "non-finite logits" and rows[1]["error"]["line"] == 2
    assert "1 answered, 1 error rows" in capsys.readouterr().err


def test_http_answers_500_json_and_keeps_serving(nan_model, tiny_tokenizer):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from noulengine.serve.app import create_app

    with TestClient(create_app(Engine.from_model(nan_model, tiny_tokenizer))) as client:
        for path, body in (("/v1/decide", BAD), ("/v1/systemone", {k: BAD[k] for k in ("state", "questions")})):
            r = client.post(path, json=body)
            assert r.status_code == 500
            detail = strict_loads(r.text)["detail"]
            assert detail["error_type"] == "non_finite_logits" and "non-finite" in detail["message"]
        r = client.post("/v1/decide", json=GOOD)
        assert r.status_code == 200 and strict_loads(r.text)["error"] is None


def test_eval_completes_and_counts_nan_rows(tiny_qwen2, tiny_tokenizer, tmp_path):
    from noulengine.eval.runner import EvalConfig, run_eval
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "jevbench").is_dir():
        pytest.skip("shared data not present")
    model = copy.deepcopy(tiny_qwen2)
    with torch.no_grad():
        model.get_input_embeddings().weight.fill_(float("nan"))  # every request is non-finite
    cfg = EvalConfig(tasks=["jevbench_easy"], limit=3, output=str(tmp_path), progress=False, plots=False)
    (res,) = run_eval(Engine.from_model(model, tiny_tokenizer), cfg)
    rows = [strict_loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["error"]["error_type"] == "NonFiniteLogitsError" for r in rows)
    counts = res.metrics["counts"]
    assert counts["errors"] == counts["decisions"] == 3 and counts["scored"] == 0
    json.dumps(res.metrics, allow_nan=False)
