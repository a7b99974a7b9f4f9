"""Records have no question-count rule: a 40-question record goes everywhere records go.

The 16-question cap is a per-route service setting (``noulengine serve --max-questions``); the
service side is tested in test_serve.py. Here: JSONL loading, ``Engine.decide`` (equal to the
questions asked one by one), ``decide_batch``, ``noulengine decide``, the scorer that ``eval`` and
``score`` use, and the training loss.
"""

from __future__ import annotations

import json

import pytest

from noulengine import Engine
from noulengine.records.loader import load_records
from noulengine.records.schema import parse_record

N = 40


def forty_question_record(rid: str = "many") -> dict:
    """40 questions of all three types over one state, with a gold target for each."""
    kinds = [
        ({"type": "choice", "instructions": "Which topic?",
          "criteria": {"world": "World news.", "business": None, "sports": "Games.", "sci_tech": None}}, "sports"),
        ({"type": "score", "instructions": "How urgent?", "criteria": ["none", "low", "high"]}, "1"),
        ({"type": "noul", "instructions": "Should a human look at it?"}, "yes"),
    ]
    questions, targets = {}, {}
    for i in range(N):
        q, gold = kinds[i % 3]
        questions[f"q{i:02d}"] = {**q, "instructions": f"{q['instructions']} (check {i})"}
        targets[f"q{i:02d}"] = {"label": gold}
    return {"id": rid, "state": {"ticket": "The app crashes with error 500 since the update.", "tier": "pro"},
            "questions": questions, "targets": targets}


def one_question(obj: dict, field: str) -> dict:
    return {"id": f"{obj['id']}/{field}", "state": obj["state"], "questions": {field: obj["questions"][field]}}


def test_jsonl_loading_keeps_all_40_questions(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text(json.dumps(forty_question_record()) + "\n")
    result = load_records(path)
    result.raise_if_errors()
    (rec,) = result.records
    assert len(rec.request.questions) == N and len(rec.targets) == N


@pytest.mark.parametrize("readout", ["symbols", "label-sequence"])
def test_decide_40_questions_equals_one_by_one(tiny_model, tiny_tokenizer, readout):
    engine = Engine.from_model(tiny_model, tiny_tokenizer, readout=readout)
    obj = forty_question_record()
    packed = engine.decide(obj)
    assert packed.ok, packed.error
    assert list(packed.answers) == list(obj["questions"])
    singles = engine.decide_batch([one_question(obj, f) for f in obj["questions"]])  # one question per request
    for field, single in zip(obj["questions"], singles):
        assert single.ok, single.error
        a, b = packed.answers[field].probabilities, single.answers[field].probabilities
        assert list(a) == list(b)
        for label in a:
            assert a[label] == pytest.approx(b[label], abs=1e-4), (field, label)


def test_decide_batch_mixes_40_and_1_question_requests(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    obj = forty_question_record()
    small = one_question(obj, "q07")
    out = engine.decide_batch([obj, small, {**obj, "id": "again"}])
    assert [d.ok for d in out] == [True, True, True]
    assert len(out[0].answers) == N and len(out[2].answers) == N
    for label, p in out[1].answers["q07"].probabilities.items():
        assert out[0].answers["q07"].probabilities[label] == pytest.approx(p, abs=1e-4)
        assert out[2].answers["q07"].probabilities[label] == pytest.approx(out[0].answers["q07"].probabilities[label],
                                                                           abs=1e-4)


def test_overlong_many_question_request_is_refused_with_counts_not_truncated(tiny_llama, tiny_tokenizer):
    # positions stay within the window (prefix + one branch), but the packed tree of 40 branches
    # exceeds the packed-token limit max(batch_tokens, max_positions) = 2048
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, max_positions=2048, batch_tokens=1000)
    out = engine.decide_batch([forty_question_record("too-long"), one_question(forty_question_record(), "q00")])
    assert not out[0].ok and out[0].error["error_type"] == "OverlengthError" and out[0].id == "too-long"
    assert "2048" in out[0].error["message"]
    assert out[1].ok


def test_cli_decide_answers_a_40_question_line(tiny_llama, tiny_tokenizer, monkeypatch, tmp_path):
    from noulengine import cli

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    obj = forty_question_record()
    src.write_text(json.dumps({k: obj[k] for k in ("id", "state", "questions")}) + "\n")
    rc = cli.main(["decide", "--no-progress", "--input", str(src), "--output", str(dst)])
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert rc == 0 and len(rows) == 1 and not rows[0]["error"]
    assert len(rows[0]["answers"]) == N


def test_scorer_counts_40_decisions(tiny_llama, tiny_tokenizer):
    from noulengine.eval.score import to_answer_map
    from noulengine.metrics.scorer import Scorer

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    rec = parse_record(forty_question_record())
    decision = engine.decide(rec.request)
    scorer = Scorer()
    scorer.update(rec, to_answer_map(decision.to_dict(), rec))
    metrics = scorer.compute()
    assert metrics["counts"]["decisions"] == N and metrics["counts"]["errors"] == 0


def test_training_loss_of_40_questions_is_the_sum_of_single_questions(tiny_llama, tiny_tokenizer):
    import torch

    from noulengine.compile import Compiler, CompilerConfig
    from noulengine.engine.model_runner import ModelRunner
    from noulengine.train.data import TrainRow
    from noulengine.train.loss import batch_losses, compile_example

    compiler = Compiler(tiny_tokenizer, CompilerConfig(readout="symbols", max_positions=2048))

    def row(obj):
        rec = parse_record(obj)
        return TrainRow(rec, 1, tuple(rec.targets[q.field].label for q in rec.request.questions),
                        (None,) * len(rec.request.questions))

    obj = forty_question_record()
    runner = ModelRunner(tiny_llama)
    singles = [compile_example(compiler, row({**one_question(obj, f), "targets": {f: obj["targets"][f]}}))
               for f in obj["questions"]]
    with torch.no_grad():
        packed = torch.stack(batch_losses(runner, [compile_example(compiler, row(obj))], [0]).losses)
        parts = torch.stack(batch_losses(runner, singles, list(range(N))).losses)  # one padded batch of 40 rows
    assert packed.shape == parts.shape == (N,) and torch.isfinite(packed).all()
    torch.testing.assert_close(packed, parts, atol=1e-4, rtol=0)
