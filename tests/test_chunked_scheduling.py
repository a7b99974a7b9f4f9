"""Chunked scheduling of large requests (issue #56): a large request is computed in canonical chunks
(:func:`noulengine.engine.prefix_cache.chunked_hidden_steps`) one forward pass per scheduler step, and
other requests are answered between its chunks. Every answer must be the same bits as the request
answered alone (``torch.equal`` on the probabilities), for every readout and both layouts; the tree
path stays the reference (within float tolerance)."""

from __future__ import annotations

import string
import threading

import pytest
import torch

from noulengine import Engine
from noulengine.engine.prefix_store import canonical_cuts, drain
from tests.conftest import three_question_request

STATE = {"ticket": "My card was charged twice for order 4471 and nobody answers my emails."}
CHUNK = 64  # tiny-model chunk size: the large request below takes many steps
MIN_TOKENS = 400  # tiny-model requests of at least this many packed tokens are large (chunked)


def _large(state, n: int = 4) -> dict:
    """~850-1,100 packed tokens on the tiny tokenizer: in state-first most of them in the branches,
    in schema-first most in the static prefix; letter labels, readable by every readout."""
    return {"state": state, "questions": {
        f"q{j}": {"type": "choice", "instructions": f"Which team handles part {j}?",
                  "criteria": {x: f"Handles case {k} of queue {j}." for k, x in enumerate(string.ascii_uppercase[:8])}}
        for j in range(n)}}


def _many_options(state, n: int = 40) -> dict:
    return {"state": state, "questions": {"tool": {"type": "choice", "instructions": "Which tool handles this?",
                                                     "criteria": {f"tool_{k}": f"Handles case {k}." for k in range(n)}}}}


def _linear(state) -> dict:
    return {"state": state, "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for money "
                                                                                   "back?"}}}


def _probs(decision) -> dict[str, torch.Tensor]:
    assert decision.ok, decision.error
    return {f: torch.tensor(list(a.probabilities.values()), dtype=torch.float64) for f, a in decision.answers.items()}


def _same_bits(a, b) -> bool:
    pa, pb = _probs(a), _probs(b)
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _engine(model, tokenizer, **kw):
    """Large requests (>= MIN_TOKENS packed tokens) chunked every CHUNK tokens; small ones batched as before."""
    kw = {"chunk_min_tokens": MIN_TOKENS, "chunk_tokens": CHUNK, **kw}
    return Engine.from_model(model, tokenizer, **kw)


def _gate_large_requests(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Hold every large request before its first chunk: ``started`` is set when one is waiting,
    and its chunks run once ``release`` is set (so requests can be queued behind it first)."""
    import noulengine.engine.engine as engine_module

    started, release = threading.Event(), threading.Event()
    real = engine_module.chunked_hidden_steps

    def gated(*args, **kwargs):
        steps = real(*args, **kwargs)
        started.set()
        release.wait(60)
        return (yield from steps)

    monkeypatch.setattr(engine_module, "chunked_hidden_steps", gated)
    return started, release


def test_canonical_cuts_split_long_pieces_only():
    assert canonical_cuts([39, 600], 256) == [39, 295, 551, 600]
    assert canonical_cuts([0, 39, 39, 100], 256) == [39, 100]
    assert canonical_cuts([39, 600], 0) == [39, 600]  # chunking off: the cut points as given
    assert canonical_cuts([], 16) == []
    assert canonical_cuts([40], 16) == [16, 32, 40]


@pytest.mark.parametrize("layout", ["state-first", "schema-first"])
@pytest.mark.parametrize("readout", ["symbols", "label-token", "label-sequence"])
def test_chunked_request_matches_the_tree_path(tiny_llama, tiny_tokenizer, readout, layout):
    """The slow reference: a large request's chunked hidden states and answers against the dense tree
    path (within float tolerance)."""
    from noulengine.engine.batching import collate
    from noulengine.engine.prefix_cache import chunked_hidden_steps

    fast = _engine(tiny_llama, tiny_tokenizer, readout=readout, layout=layout)
    tree = Engine.from_model(tiny_llama, tiny_tokenizer, readout=readout, layout=layout, prefix_cache=False,
                             causal_path=False)
    request = _large(STATE)
    compiled = fast.compile(request)
    assert fast.is_chunked(request) and compiled.input_tokens > 3 * CHUNK
    with torch.inference_mode():
        ref = tree.runner.hidden_states(collate([compiled], [0]))  # (1, L, D)
        got = drain(chunked_hidden_steps(fast.runner, compiled, None, chunk=CHUNK))
    p = compiled.prefix_tokens
    assert got.shape == ref.shape
    assert float((got[:, p:] - ref[:, p:]).abs().max()) <= 1e-5  # every branch position (reads lie there)
    a, b = fast.decide(request), tree.decide(request)
    for fld, x in a.answers.items():
        assert max(abs(u - v) for u, v in zip(x.logprobs, b.answers[fld].logprobs)) <= 1e-5


@pytest.mark.parametrize("layout", ["state-first", "schema-first"])
@pytest.mark.parametrize("readout", ["symbols", "label-token", "label-sequence"])
def test_interleaved_answers_are_bit_identical_to_each_request_alone(tiny_llama, tiny_tokenizer, readout, layout):
    """A large request stepped chunk by chunk, with small requests (a tree one, a linear one, a batch
    of two) answered whole between its chunks on the same engine, gives the same bits as each
    request answered alone on a fresh engine, and so do the small ones."""
    large, small = _large(STATE), [three_question_request(state=STATE), _linear(STATE)]
    pair = [three_question_request(state="The parcel never arrived."), _linear({"ticket": "Where is my order?"})]

    alone_large = _engine(tiny_llama, tiny_tokenizer, readout=readout, layout=layout).decide(large)
    alone_small = [_engine(tiny_llama, tiny_tokenizer, readout=readout, layout=layout).decide(r) for r in small]
    alone_pair = _engine(tiny_llama, tiny_tokenizer, readout=readout, layout=layout).decide_batch(pair)

    engine = _engine(tiny_llama, tiny_tokenizer, readout=readout, layout=layout)
    assert engine.is_chunked(large) and not any(engine.is_chunked(r) for r in small + pair)
    job = engine.start_batch([large])
    assert job.step() and job.step()  # the prefix and a first chunk
    got_small = [engine.decide(small[0])]
    assert job.step() and not job.done
    pair_job = engine.start_batch(pair)  # a job of small requests, stepped in between too
    while pair_job.step():
        assert job.step()
    got_small.append(engine.decide(small[1]))
    while job.step():
        pass
    assert job.steps > 4  # it was computed in chunks
    assert _same_bits(job.decisions[0], alone_large)
    assert all(_same_bits(g, w) for g, w in zip(got_small, alone_small))
    assert all(_same_bits(g, w) for g, w in zip(pair_job.decisions, alone_pair))
    # and again, now that the store holds its state: the same bits
    assert _same_bits(engine.decide(large), alone_large)


def test_a_large_request_alone_equals_itself_in_a_batch(tiny_llama, tiny_tokenizer):
    """A chunked request runs alone whatever it is batched with: decide_batch of it beside others
    gives its bits alone; with chunking off the path is the unchunked one (within float rounding)."""
    large = _large(STATE)
    others = [three_question_request(state=STATE), _large({"ticket": "Where is my order?"}, 3)]
    alone = _engine(tiny_llama, tiny_tokenizer).decide(large)
    together = _engine(tiny_llama, tiny_tokenizer).decide_batch([others[0], large, others[1]])
    assert _same_bits(together[1], alone)
    unchunked = _engine(tiny_llama, tiny_tokenizer, chunk_tokens=0)
    assert not unchunked.is_chunked(large)
    for fld, x in unchunked.decide(large).answers.items():
        assert max(abs(u - v) for u, v in zip(x.logprobs, alone.answers[fld].logprobs)) <= 1e-5
    with pytest.raises(ValueError, match="chunk_tokens"):
        _engine(tiny_llama, tiny_tokenizer, chunk_tokens=-1)


def test_the_worker_answers_small_requests_between_the_chunks_of_a_large_one(tiny_llama, tiny_tokenizer,
                                                                              monkeypatch):
    """The server's worker: a small request sent while a large one is being computed is answered
    before it, and both answers are the bits each gets alone; /metrics reports the chunk setting."""
    from noulengine.records.schema import request_from_json
    from noulengine.serve.metrics import Metrics
    from noulengine.serve.worker import BatchWorker

    large, small = _large(STATE), three_question_request(state=STATE)
    want_large = _engine(tiny_llama, tiny_tokenizer).decide(large)
    want_small = _engine(tiny_llama, tiny_tokenizer).decide(small)

    started, release = _gate_large_requests(monkeypatch)
    engine = _engine(tiny_llama, tiny_tokenizer)
    metrics = Metrics()
    w = BatchWorker(engine, max_wait_ms=1, metrics=metrics)
    w.start()
    try:
        big = w.submit(request_from_json(large))
        assert started.wait(60)
        quick = w.submit(request_from_json(small))
        release.set()
        got_small = quick.result(60)
        assert not big.done()  # answered between the chunks, not after the large request
        got_large = big.result(60)
    finally:
        release.set()
        w.stop()
    assert _same_bits(got_small, want_small) and _same_bits(got_large, want_large)
    assert w.chunk_steps > 4
    text = metrics.render()
    assert f"noulengine_chunk_tokens {CHUNK}" in text
    assert "noulengine_max_batch_tokens 8192" in text
    assert f"noulengine_chunk_steps_total {w.chunk_steps}" in text


def test_requests_behind_a_large_one_are_answered_a_chunks_worth_per_step(tiny_llama, tiny_tokenizer, monkeypatch):
    """Sarathi's token budget per pass: small requests queued while a large one runs are all taken
    between two of its chunks (up to ``max_batch_tokens``, as before) and answered oldest first in
    passes of at most ``chunk_tokens`` estimated tokens (at least one request each), so the first is
    answered after its own pass; with no large request in flight they are one pass, as before.
    Answers are each request's bits alone."""
    from noulengine.records.schema import request_from_json
    from noulengine.serve.worker import BatchWorker, estimate_tokens

    large = _large(STATE)
    smalls = [_linear({"ticket": f"ticket {i}: please refund order {4400 + i}"}) for i in range(4)]
    reqs = [request_from_json(r) for r in smalls]
    assert all(estimate_tokens(r) * 2 > CHUNK for r in reqs)  # two never fit one step's budget
    want = [_engine(tiny_llama, tiny_tokenizer).decide(r) for r in smalls]

    started, release = _gate_large_requests(monkeypatch)
    engine = _engine(tiny_llama, tiny_tokenizer)
    w = BatchWorker(engine, max_wait_ms=1)
    assert w.step_tokens == CHUNK
    log = []  # (requests in the pass, the large request's chunks run so far) per pass
    real_decide = engine.decide_batch

    def recording(batch, **kw):
        batch = list(batch)
        log.append((len(batch), w.chunk_steps))
        return real_decide(batch, **kw)

    monkeypatch.setattr(engine, "decide_batch", recording)
    w.start()
    try:
        big = w.submit(request_from_json(large))
        assert started.wait(60)
        futures = [w.submit(r) for r in reqs]  # all queued before the worker takes its next step
        release.set()
        got = [f.result(60) for f in futures]
        assert not big.done()
        big.result(60)
    finally:
        release.set()
        w.stop()
    assert [n for n, _ in log] == [1, 1, 1, 1]  # one per step: a chunk's worth each
    assert len({c for _, c in log}) == 1  # all between the same two chunks: the large one waits no longer
    assert all(_same_bits(g, x) for g, x in zip(got, want))
    # no large request in flight: one gathered batch as before
    w2 = BatchWorker(_engine(tiny_llama, tiny_tokenizer), max_wait_ms=200)
    seen = []
    real2 = w2.engine.decide_batch
    monkeypatch.setattr(w2.engine, "decide_batch", lambda batch, **kw: (seen.append(len(list(batch))),
                                                                         real2(batch, **kw))[1])
    futures = [w2.submit(r) for r in reqs]
    w2.start()
    try:
        assert all(f.result(60).ok for f in futures)
    finally:
        w2.stop()
    assert seen == [4]


@pytest.mark.default_model
@pytest.mark.slow
def test_the_254_option_request_is_bit_identical_interleaved_on_the_default_model(default_engine):
    """The issue's repro on the real default model: a 254-option choice question computed in chunks
    with the README's refund request answered between two of its chunks; both answers are the bits
    each gets alone."""
    request = {"state": {"ticket": "My card was charged twice for order 4471."}, "questions": {
        "route": {"type": "choice", "instructions": "Which team handles this?", "criteria": {
            "billing": "Payments and refunds", "shipping": "Delivery problems", "tech": "Website or app errors"}},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}}
    large = _many_options(request["state"], 254)
    assert default_engine.is_chunked(large) and not default_engine.is_chunked(request)
    default_engine.reset_prefix_cache()
    alone_large = default_engine.decide(large)
    alone_small = default_engine.decide(request)
    default_engine.reset_prefix_cache()
    job = default_engine.start_batch([large])
    assert job.step() and job.step()
    between = default_engine.decide(request)
    while job.step():
        pass
    assert job.steps > 4
    assert _same_bits(job.decisions[0], alone_large) and _same_bits(between, alone_small)
