"""The linear causal path (issue #15): one-chain requests run through the model's own causal
attention with no dense mask, and agree with the tree path (the reference) within 1e-5 in float32."""

from __future__ import annotations

import pytest
import torch

from noulengine import Engine
from noulengine.engine.batching import collate
from tests.conftest import three_question_request


def _single_question_requests():
    full = three_question_request()
    out = []
    for i, (field, q) in enumerate(full["questions"].items()):
        for j, state in enumerate(["short", "a somewhat longer state " * (3 + 4 * i), {"k": [1, 2, 3], "t": "x" * (i + 1)}]):
            out.append({"id": f"{field}-{j}", "state": state, "questions": {field: q}})
    return out


@pytest.mark.parametrize("readout", ["symbols", "label-token", "auto"])
def test_causal_path_equals_tree_path(tiny_model, tiny_tokenizer, readout):
    requests = _single_question_requests()
    fast = Engine.from_model(tiny_model, tiny_tokenizer, readout=readout)
    tree = Engine.from_model(tiny_model, tiny_tokenizer, readout=readout, causal_path=False)
    assert all(fast.compile(r).is_linear for r in requests)
    got, want = fast.decide_batch(requests), tree.decide_batch(requests)
    for g, w in zip(got, want):
        assert g.ok and w.ok
        for field, a in g.answers.items():
            b = w.answers[field]
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5, (g.id, a.logprobs, b.logprobs)
            assert a.label == b.label


def test_causal_batches_hold_no_dense_mask_and_tree_requests_keep_theirs(tiny_llama, tiny_tokenizer, monkeypatch):
    # tree requests: dense batches; no cross-request prefix caching, so every batch goes through
    # runner.hidden_states (with it, causal batches run their tokens after the cached head)
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache=False, prefix_cache_mb=0)
    seen = []
    original = engine.runner.hidden_states
    monkeypatch.setattr(engine.runner, "hidden_states", lambda batch: (seen.append(batch), original(batch))[1])
    linear = _single_question_requests()[:4]
    tree = [three_question_request(), {"state": "s", "questions": {"q": {"type": "choice", "instructions": "x",
                                                                       "criteria": {"a b": None, "a c": None}}}}]
    engine.config.readout = "auto"
    decisions = engine.decide_batch(linear + tree)
    assert all(d.ok for d in decisions)
    causal = [b for b in seen if b.causal]
    dense = [b for b in seen if not b.causal]
    assert sum(len(b.indices) for b in causal) == 4 and all(b.mask is None for b in causal)
    assert {i for b in dense for i in b.indices} == {4, 5}  # the tree requests (and the label-sequence one)


def test_a_causal_batch_refuses_a_tree_request(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    compiled = [engine.compile(three_question_request())]
    with pytest.raises(ValueError, match="non-linear"):
        collate(compiled, [0], causal=True)


def test_padding_never_reaches_a_real_token(tiny_llama, tiny_tokenizer):
    """Right padding in a causal batch: a short request's answer is the same alone and beside a
    much longer one (the pads after it are never attended by its real tokens)."""
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    short, long = _single_question_requests()[0], _single_question_requests()[1]
    alone = engine.decide(short).answers
    together = engine.decide_batch([long, short])[1].answers
    for field in alone:
        assert torch.allclose(torch.tensor(alone[field].logprobs), torch.tensor(together[field].logprobs), atol=1e-5)
