"""Readout kernels and the flex-attention tree mask.

CPU: the torch reference against a direct ``log_softmax(h @ W.T)`` (float32, atol 1e-5 on
log-probabilities: the only difference is summation order over D and over vocabulary chunks),
with bias, soft-cap and odd chunk sizes; the flex mask_mods evaluated densely against
``collate``'s boolean tree mask (exact equality).
GPU (``@pytest.mark.gpu``, skipped without CUDA): Triton against the reference; the engine with
flex attention against the engine with sdpa.
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch

from noulengine.compile.layout import CompiledRequest, SequenceBuilder
from noulengine.engine.batching import collate
from noulengine.engine.flex_attention import batch_mask_mod, dense_mask, tree_tensors
from noulengine.kernels import term_logprobs
from noulengine.kernels.reference import term_logprobs_reference

ATOL = 1e-5
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _direct(h, w, pos, tok, bias=None, softcap=None):
    logits = h.double() @ w.double().T
    if bias is not None:
        logits = logits + bias.double()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logp = torch.log_softmax(logits, dim=-1)
    return logp[pos, tok], torch.logsumexp(logits, dim=-1)


def _case(p=5, d=24, v=301, t=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(p, d, generator=g)
    w = torch.randn(v, d, generator=g) * 0.5
    pos = torch.randint(0, p, (t,), generator=g)
    tok = torch.randint(0, v, (t,), generator=g)
    return h, w, pos, tok, g


@pytest.mark.parametrize("chunk", [16384, 64, 7, 1])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_reference_matches_direct_log_softmax(chunk, softcap, with_bias):
    h, w, pos, tok, g = _case()
    bias = torch.randn(w.shape[0], generator=g) if with_bias else None
    got, lse = term_logprobs_reference(h, w, pos, tok, bias=bias, softcap=softcap, vocab_chunk=chunk)
    want, want_lse = _direct(h, w, pos, tok, bias, softcap)
    assert got.dtype == torch.float32 and got.shape == pos.shape and lse.shape == (h.shape[0],)
    torch.testing.assert_close(got.double(), want, atol=ATOL, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=ATOL, rtol=0)


def test_reference_accepts_bf16_inputs():
    h, w, pos, tok, _ = _case()
    got, _ = term_logprobs_reference(h.bfloat16(), w.bfloat16(), pos, tok)
    want, _ = _direct(h.bfloat16().float(), w.bfloat16().float(), pos, tok)
    torch.testing.assert_close(got.double(), want, atol=ATOL, rtol=0)  # float32 math on bf16 values


def test_dispatcher_uses_reference_on_cpu():
    h, w, pos, tok, _ = _case()
    a, _ = term_logprobs(h, w, pos, tok, softcap=2.0)
    b, _ = term_logprobs_reference(h, w, pos, tok, softcap=2.0)
    assert torch.equal(a, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA import guard")
def test_triton_module_import_fails_cleanly_without_cuda():
    with pytest.raises(ImportError):
        importlib.import_module("noulengine.kernels.triton_readout")


# --------------------------------------------------------------------------- tree masks
def _random_tree(rng: random.Random) -> CompiledRequest:
    b = SequenceBuilder()
    root = b.add(list(range(rng.randint(1, 9))), -1)
    for _ in range(rng.randint(1, 4)):
        seg = b.add(list(range(rng.randint(0, 5))), root)  # empty branches are allowed (read points)
        for _ in range(rng.randint(0, 2)):
            b.add(list(range(rng.randint(1, 3))), seg)
    return CompiledRequest(b.token_ids, b.position_ids, b.segment_ids, b.parents, [])


@pytest.mark.parametrize("seed", range(6))
def test_flex_tree_mask_equals_collate_mask(seed):
    rng = random.Random(seed)
    reqs = [_random_tree(rng) for _ in range(rng.randint(1, 4))]
    batch = collate(reqs, list(range(len(reqs))))
    t = tree_tensors(reqs, batch)
    assert torch.equal(dense_mask(t), batch.mask)
    window = 3
    pos = batch.position_ids
    near = (pos[:, :, None] - pos[:, None, :]) < window
    assert torch.equal(dense_mask(t, window), batch.mask & near[:, None])  # the runner's sliding mask


@pytest.mark.parametrize("seed", range(3))
def test_runner_mask_mod_equals_collate_mask(seed):
    rng = random.Random(100 + seed)
    reqs = [_random_tree(rng) for _ in range(3)]
    batch = collate(reqs, [2, 0, 1])
    b, width = batch.input_ids.shape
    bi, qi, ki = (torch.arange(b)[:, None, None], torch.arange(width)[None, :, None], torch.arange(width)[None, None, :])
    assert torch.equal(batch_mask_mod(batch, "cpu")(bi, 0, qi, ki)[:, None], batch.mask)
    pos = batch.position_ids
    near = (pos[:, :, None] - pos[:, None, :]) < 2
    assert torch.equal(batch_mask_mod(batch, "cpu", 2)(bi, 0, qi, ki)[:, None], batch.mask & near[:, None])


def test_flex_create_mask_on_cpu_equals_collate_mask():
    """torch's own dense evaluation of the mask_mod (vmap), where this torch build supports it."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    rng = random.Random(7)
    reqs = [_random_tree(rng) for _ in range(3)]
    batch = collate(reqs, [0, 1, 2])
    t = tree_tensors(reqs, batch)
    b, width = batch.input_ids.shape
    from noulengine.engine.flex_attention import tree_mask_mod

    dense = fa.create_mask(tree_mask_mod(t), b, None, width, width, device="cpu")
    assert torch.equal(dense.expand(b, 1, width, width), batch.mask)


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("shape", [(3, 64, 1000, 11), (40, 576, 49152, 200), (5, 128, 131_000, 9)])
def test_triton_matches_reference(dtype, softcap, shape):
    tr = pytest.importorskip("noulengine.kernels.triton_readout")
    p, d, v, t = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(p, d, device="cuda", generator=g).to(dtype)
    w = (torch.randn(v, d, device="cuda", generator=g) * d ** -0.5).to(dtype)
    pos = torch.randint(0, p, (t,), device="cuda", generator=g)
    tok = torch.randint(0, v, (t,), device="cuda", generator=g)
    got, lse = tr.term_logprobs_triton(h, w, pos, tok, softcap=softcap)
    want, want_lse = term_logprobs_reference(h, w, pos, tok, softcap=softcap)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)  # both float32 math on the same inputs
    torch.testing.assert_close(lse, want_lse, atol=2e-4, rtol=0)


@pytest.mark.gpu
@needs_cuda
def test_flex_engine_matches_sdpa_engine(tiny_llama, tiny_tokenizer):
    from noulengine import Engine
    from noulengine.engine.flex_attention import use_flex_attention
    from tests.conftest import three_question_request

    model = tiny_llama.to("cuda")
    engine = Engine.from_model(model, tiny_tokenizer)
    reqs = [three_question_request(), three_question_request(state="short"),
            three_question_request(state="x " * 300)]
    ref = engine.decide_batch(reqs, on_error="raise")
    use_flex_attention(engine, True)
    try:
        got = engine.decide_batch(reqs, on_error="raise")
    finally:
        use_flex_attention(engine, False)
        tiny_llama.to("cpu")
    for a, b in zip(ref, got):
        for key in a.answers:
            for label, p in a.answers[key].probabilities.items():
                assert abs(p - b.answers[key].probabilities[label]) < 1e-4
