"""Engine API behaviour: loading, per-request errors, modalities, output fields."""

from __future__ import annotations

import base64
import io
import json

import pytest

from noulengine import Engine
from noulengine.models.loading import ModelNotFoundError
from noulengine.records import UnsupportedModalityError
from tests.conftest import three_question_request


def _png_b64():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_from_pretrained_local_directory(tiny_llama, tiny_tokenizer, tmp_path):
    tiny_llama.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    engine = Engine.from_pretrained(str(tmp_path), device="cpu")
    ref = Engine.from_model(tiny_llama, tiny_tokenizer)
    a, b = engine.decide(three_question_request()), ref.decide(three_question_request())
    assert a.answers["topic"].probabilities == pytest.approx(b.answers["topic"].probabilities, abs=1e-6)
    assert engine.identity.sha256 and len(engine.identity.sha256) == 64
    with pytest.raises(ModelNotFoundError, match="not found"):
        Engine.from_pretrained(str(tmp_path / "missing"))


def test_bad_requests_become_error_decisions_and_never_lose_others(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, max_positions=200)
    good = three_question_request()
    reqs = [good, {"id": "empty", "state": "x", "questions": {}},
            {"id": "long", **three_question_request(state="word " * 400)},
            {"id": "img", **good, "images": [{"type": "image/png", "data": _png_b64()}]}, "not an object", good]
    out = engine.decide_batch(reqs)
    assert [d.ok for d in out] == [True, False, False, False, False, True]
    assert out[1].error["field"] == "questions" and "must not be empty" in out[1].error["message"]
    assert out[2].error["error_type"] == "OverlengthError" and "the limit is 200" in out[2].error["message"]
    assert out[3].error["error_type"] == "UnsupportedModalityError" and "text-only" in out[3].error["message"]
    # every error row has the same keys, with the record id and field where known
    assert all(set(d.error) == {"error_type", "message", "record_id", "field", "rule", "file", "line"} for d in out[1:5])
    assert (out[2].error["record_id"], out[2].error["field"]) == ("long", "state")
    assert (out[3].error["record_id"], out[3].error["field"]) == ("img", "images")
    assert out[0].answers["topic"].probabilities == out[5].answers["topic"].probabilities
    with pytest.raises(UnsupportedModalityError):
        engine.decide(reqs[3])


def test_output_fields_and_json(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    d = engine.decide({**three_question_request(), "id": "abc"})
    row = json.loads(json.dumps(d.to_dict(), allow_nan=False))
    assert row["id"] == "abc" and row["usage"]["input_tokens"] == d.input_tokens > 0 and row["latency_s"] > 0
    topic, risk, flag = (row["answers"][k] for k in ("topic", "risk", "flag"))
    assert list(topic["probabilities"]) == ["world", "business", "human_review", "observe"]
    assert topic["choice"] == topic["label"] == max(topic["probabilities"], key=topic["probabilities"].get)
    assert risk["score"] == pytest.approx(sum(i * p for i, p in enumerate(risk["probabilities"].values())))
    assert flag["noul"] == flag["probabilities"]["yes"] and list(flag["probabilities"]) == ["no", "yes"]
    for ans in (topic, risk, flag):
        assert ans["confidence"] == max(ans["probabilities"].values())
        assert 0 < ans["x_mass"] <= 1 and ans["temperature"] == 1.0


def test_plan_batches_bounds_tokens_rows_and_padding():
    from noulengine.engine.batching import plan_batches

    lengths = [100, 95, 90, 60, 58, 300, 10, 11, 12, 13]
    batches = plan_batches(lengths, batch_tokens=250, max_batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        width = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * width <= 250
        assert len(b) <= 3
        assert all(lengths[i] >= width * 0.875 for i in b)  # at most 1/8 of any row is padding
    assert [5] in batches  # over the budget alone: still answered, in a batch of its own


def test_score_answers_carry_their_level_texts(tiny_llama, tiny_tokenizer):
    import json

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    d = engine.decide({"state": "s", "questions": {
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", None]},
        "flag": {"type": "noul", "instructions": "Flag?"}}})
    a = d.answers["urgency"]
    assert a.level_texts == {"0": "can wait", "1": "this week", "2": None}
    assert a.level_text == a.level_texts[a.label]
    out = json.loads(json.dumps(d.to_dict()))
    assert out["answers"]["urgency"]["level_text"] == a.level_text and "level_texts" not in out["answers"]["flag"]


def test_boolean_engine_flags_parse_true_and_false():
    """`--causal-path false` must turn the path off (a string "false" would read as true)."""
    import argparse

    import pytest

    from noulengine.cli import _engine_kwargs, add_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    _, kw = _engine_kwargs(parser.parse_args(["--causal-path", "false", "--prefix-cache", "TRUE"]))
    assert kw["causal_path"] is False and kw["prefix_cache"] is True
    _, kw = _engine_kwargs(parser.parse_args([]))
    assert kw["causal_path"] is True and kw["prefix_cache"] is True and kw["prefix_cache_mb"] == 256
    with pytest.raises(SystemExit):
        parser.parse_args(["--causal-path", "no"])


def test_engine_flag_help_shows_each_default_once(capsys):
    from noulengine.cli import main

    with pytest.raises(SystemExit):
        main(["decide", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default True)" not in text and "(default true)" in text
