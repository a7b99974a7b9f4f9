"""The prefix KV cache path (issue #15) against the dense tree path, its reference."""

from __future__ import annotations

import copy

import pytest
import torch

from noulengine import Engine
from noulengine.engine.batching import collate
from noulengine.engine.prefix_cache import prefix_cache_unsupported, prefix_cached_hidden
from tests.conftest import three_question_request


def _engines(model, tokenizer, **kw):
    cached = Engine.from_model(model, tokenizer, prefix_cache_min_tokens=0, **kw)  # every tree request cached
    tree = Engine.from_model(model, tokenizer, prefix_cache=False, causal_path=False, **kw)
    return cached, tree


@pytest.mark.parametrize("debias", ["none", "permute"])
@pytest.mark.parametrize("readout", ["symbols", "label-token", "label-sequence", "auto"])
def test_prefix_cache_equals_tree_path(tiny_llama, tiny_qwen2, tiny_tokenizer, readout, debias):
    for model in (tiny_llama, tiny_qwen2):
        cached, tree = _engines(model, tiny_tokenizer, readout=readout, debias=debias)
        assert prefix_cache_unsupported(cached.runner) is None
        requests = [three_question_request(), three_question_request(state="Short."),
                    three_question_request(state={"events": ["login", "reset"] * 20})]
        compiled = cached.compile(requests[2])
        with torch.inference_mode():  # the hidden states themselves, every packed position
            ref = tree.runner.hidden_states(collate([compiled], [0]))
            got = prefix_cached_hidden(cached.runner, compiled)
        assert got.shape == ref.shape and float((got - ref).abs().max()) <= 1e-5
        for a, b in zip(cached.decide_batch(requests), tree.decide_batch(requests)):
            for fld, x in a.answers.items():
                assert max(abs(u - v) for u, v in zip(x.logprobs, b.answers[fld].logprobs)) <= 1e-5


@pytest.mark.parametrize("readout", ["symbols", "label-sequence"])
def test_a_batch_of_tree_requests_equals_each_alone(tiny_llama, tiny_qwen2, tiny_tokenizer, readout):
    """Several tree requests with prefixes of different lengths in one cached batch: every packed
    hidden state equals the tree path's for that request alone (the prefix padding is masked)."""
    from noulengine.engine.prefix_cache import prefix_cached_hidden_batch

    for model in (tiny_llama, tiny_qwen2):
        cached, tree = _engines(model, tiny_tokenizer, readout=readout)
        requests = [three_question_request(state="Short."), three_question_request(),
                    three_question_request(state={"events": ["login", "reset"] * 20})]
        compiled = [cached.compile(r) for r in requests]
        with torch.inference_mode():
            got = prefix_cached_hidden_batch(cached.runner, compiled, [2, 0, 1])
            for row, i in enumerate([2, 0, 1]):
                ref = tree.runner.hidden_states(collate(compiled, [i]))[0]
                n = compiled[i].input_tokens
                assert float((got[row, :n] - ref[:n]).abs().max()) <= 1e-5


def test_cached_batches_keep_each_answer_independent_of_its_neighbours(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_mb=0, prefix_cache_min_tokens=0)
    target = three_question_request(state="The target state.")
    alone = engine.decide(target)
    for neighbours in ([three_question_request(state="x " * 30)], [three_question_request(), three_question_request(
            state="Another state entirely, somewhat longer than the others.")]):
        together = engine.decide_batch([*neighbours, target])[-1]
        for fld, ans in alone.answers.items():
            assert max(abs(u - v) for u, v in zip(ans.logprobs, together.answers[fld].logprobs)) <= 1e-5


def test_cached_branches_stay_isolated(tiny_llama, tiny_tokenizer):
    """Changing one branch leaves every other branch's answer bit-identical (they are separate rows)."""
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0)
    a = three_question_request()
    b = copy.deepcopy(a)
    b["questions"]["risk"]["instructions"] = "How risky!"
    da, db = engine.decide(a), engine.decide(b)
    for fld in ("topic", "flag"):
        assert da.answers[fld].logprobs == db.answers[fld].logprobs
    assert da.answers["risk"].logprobs != db.answers["risk"].logprobs


def test_sliding_window_models_keep_the_tree_path(tiny_gemma3, tiny_tokenizer, monkeypatch):
    engine = Engine.from_model(tiny_gemma3, tiny_tokenizer)
    assert "sliding-window" in prefix_cache_unsupported(engine.runner)
    import noulengine.engine.engine as engine_module

    def refuse(*args, **kwargs):
        raise AssertionError("the prefix cache path must not run for a sliding-window model")

    monkeypatch.setattr(engine_module, "prefix_cached_hidden_batch", refuse)
    assert engine.decide(three_question_request()).ok


def test_short_tree_requests_keep_the_tree_path_even_when_their_prefix_is_stored(tiny_llama, tiny_tokenizer,
                                                                                 monkeypatch):
    """The path is chosen from the request alone (issue #46): a short request whose state a long
    one stored still takes the tree path, so its answer does not depend on what came before."""
    import noulengine.engine.engine as engine_module

    seen = []
    real = engine_module.prefix_cached_hidden_batch
    monkeypatch.setattr(engine_module, "prefix_cached_hidden_batch",
                        lambda runner, compiled, indices, store=None, **kw: (
                            seen.extend(compiled[i].input_tokens for i in indices),
                            real(runner, compiled, indices, store, **kw))[1])
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=200)
    short, long = three_question_request(state="Short."), three_question_request(state="many words here " * 60)
    assert engine.compile(short).input_tokens < 200 <= engine.compile(long).input_tokens
    assert all(d.ok for d in engine.decide_batch([short, long]))
    assert seen == [engine.compile(long).input_tokens]  # only the long one took the cached path
    again = three_question_request(state="many words here " * 60)
    again["questions"]["risk"]["instructions"] = "Risk now?"
    seen.clear()
    engine.config.prefix_cache_min_tokens = 10_000
    assert engine.decide(again).ok and seen == []  # short of the threshold: the tree path, stored prefix or not
    with pytest.raises(ValueError, match="prefix_cache_min_tokens"):
        Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_paths_on_cuda_match_the_tree_path(tiny_llama, tiny_tokenizer, dtype):
    """The causal path and the prefix cache on CUDA against the dense tree path on CUDA."""
    model = copy.deepcopy(tiny_llama).to("cuda", dtype=dtype)
    fast = Engine.from_model(model, tiny_tokenizer, prefix_cache_min_tokens=0)  # every tree request cached
    tree = Engine.from_model(model, tiny_tokenizer, prefix_cache=False, causal_path=False)
    requests = [three_question_request(), {"state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}]
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for a, b in zip(fast.decide_batch(requests), tree.decide_batch(requests)):
        assert a.ok and b.ok
        for fld, x in a.answers.items():
            assert max(abs(u - v) for u, v in zip(x.logprobs, b.answers[fld].logprobs)) <= tol
