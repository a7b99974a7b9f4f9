"""Same request, same answer, whatever the engine answered before (issue #46 item 1).

The fault it guards against: a short request's state was stored by a longer request (a 254-option
question) computed inside another pass; the short request then took the prefix-cache path and
reused those keys and values, so its probabilities moved (by up to 2.4e-6 on the default model) and
stayed moved. Now a request's path depends on the request alone and every stored prefix is computed
in one canonical shape (:func:`noulengine.engine.prefix_store.prefix_chain`): the bits are the same
before and after any history. Each check compares exact float equality of the log-probabilities."""

from __future__ import annotations

import pytest

from noulengine import Engine
from tests.conftest import three_question_request

STATE = {"ticket": "My card was charged twice for order 4471 and nobody answers my emails."}


def _many_options(state, n: int = 254) -> dict:
    return {"state": state, "questions": {"tool": {"type": "choice", "instructions": "Which tool handles this?",
                                                     "criteria": {f"tool_{k}": f"Handles case {k}." for k in range(n)}}}}


def _bits(decision) -> dict:
    assert decision.ok, decision.error
    return {f: tuple(a.logprobs) for f, a in decision.answers.items()}


def _short(state) -> dict:
    return three_question_request(state=state)


def _linear(state) -> dict:
    return {"state": state, "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for money "
                                                                                   "back?"}}}


@pytest.mark.parametrize("layout", ["state-first", "schema-first"])
def test_a_request_is_bit_identical_before_and_after_a_long_request_on_its_state(tiny_llama, tiny_tokenizer, layout):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, layout=layout, prefix_cache_min_tokens=300)
    long = engine.compile(_many_options(STATE, 60))
    assert long.input_tokens >= 300 > engine.compile(_short(STATE)).input_tokens  # one cached, one tree
    first_short, first_linear = _bits(engine.decide(_short(STATE))), _bits(engine.decide(_linear(STATE)))
    # stores the state's whole prefix, computed beside a longer state in one call (a server's batch)
    other = {"ticket": STATE["ticket"] + " I also want to close my account and delete every saved card today."}
    assert all(d.ok for d in engine.decide_batch([_many_options(STATE, 60), _many_options(other, 60)]))
    assert engine.prefix_store.stats.inserts >= 2
    for _ in range(2):
        assert _bits(engine.decide(_short(STATE))) == first_short
        assert _bits(engine.decide(_linear(STATE))) == first_linear


@pytest.mark.parametrize("layout", ["state-first", "schema-first"])
def test_a_cached_path_request_gets_the_same_bits_cold_and_warm_and_after_others(tiny_llama, tiny_tokenizer, layout):
    """Long requests take the prefix-cache path; their stored prefixes (the state, the schema-first
    questions) are computed in the canonical shape, so the first answer (computing them), later ones
    (reusing them) and an engine whose store was filled by other requests all agree bit for bit."""
    def engine():
        return Engine.from_model(tiny_llama, tiny_tokenizer, layout=layout, prefix_cache_min_tokens=0)

    a, b = _short(STATE), _many_options(STATE, 12)
    other = _short({"ticket": "The parcel never arrived."})
    cold = engine()
    want = _bits(cold.decide(a))
    assert _bits(cold.decide(a)) == want  # its own stored prefix
    warm = engine()
    warm.decide(b)
    warm.decide(other)
    warm.decide(other)  # seen twice: the schema-first questions are now stored too
    assert _bits(warm.decide(a)) == want
    assert _bits(warm.decide(a)) == want


def test_without_a_prefix_store_the_same_paths_give_the_same_bits(tiny_llama, tiny_tokenizer):
    """The store only saves work: an engine with none computes the same canonical pieces."""
    with_store = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0)
    without = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0, prefix_cache_mb=0)
    assert without.prefix_store is None
    for req in (_short(STATE), _linear(STATE), _many_options(STATE, 8)):
        with_store.decide(req)
        assert _bits(with_store.decide(req)) == _bits(without.decide(req))


@pytest.mark.default_model
@pytest.mark.slow
def test_the_default_model_answers_the_same_after_a_254_option_question(default_engine):
    """The repro of issue #46 on the real default model: the README's refund question, then a
    254-option question on the same state, then the refund question again."""
    default_engine.reset_prefix_cache()
    request = {"state": {"ticket": "My card was charged twice for order 4471."}, "questions": {
        "route": {"type": "choice", "instructions": "Which team handles this?", "criteria": {
            "billing": "Payments and refunds", "shipping": "Delivery problems", "tech": "Website or app errors"}},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}}
    before = _bits(default_engine.decide(request))
    assert default_engine.compile(_many_options(request["state"])).input_tokens >= \
        default_engine.config.prefix_cache_min_tokens  # the long request takes the prefix-cache path
    assert default_engine.decide(_many_options(request["state"])).ok
    assert _bits(default_engine.decide(request)) == before
