"""Cross-request prefix caching (issue #15): the LRU store, and answers against the tree path."""

from __future__ import annotations

import pytest
import torch

from noulengine import Engine
from noulengine.compile.compiler import Compiler, CompilerConfig
from noulengine.compile.layout import common_prefix_length
from noulengine.engine.prefix_store import PrefixEntry, PrefixKVStore
from noulengine.records.schema import request_from_json
from tests.conftest import three_question_request


def _entry(ids, nbytes_per_token=8, pinned=False) -> PrefixEntry:
    n = len(ids)
    k = torch.zeros(1, 1, n, nbytes_per_token // 8)  # float32: 4 bytes, keys + values
    return PrefixEntry(tuple(ids), [k], [k.clone()], pinned=pinned)


def _noul(state, field="q", text="Is it urgent?"):
    return {"state": state, "questions": {field: {"type": "noul", "instructions": text}}}


def _max_diff(a, b) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        assert x.ok and y.ok, (x.error, y.error)
        for fld, ans in x.answers.items():
            worst = max(worst, max(abs(u - v) for u, v in zip(ans.logprobs, y.answers[fld].logprobs)))
    return worst


# ------------------------------------------------------------------------------- the store
def test_lookup_returns_the_longest_matching_prefix_within_the_limit():
    store = PrefixKVStore(10_000, min_tokens=1)
    for ids in ([1, 2], [1, 2, 3, 4], [1, 2, 9], [5]):
        assert store.insert(_entry(ids))
    assert store.lookup([1, 2, 3, 4, 5], limit=10).ids == (1, 2, 3, 4)
    assert store.lookup([1, 2, 3, 4, 5], limit=3).ids == (1, 2)  # never past the limit
    assert store.lookup([1, 2, 9, 9], limit=10).ids == (1, 2, 9)
    assert store.lookup([1, 3], limit=10) is None  # ids must match exactly, not by length
    assert store.lookup([7, 1, 2], limit=10) is None


def test_lru_eviction_by_bytes_keeps_pinned_entries():
    store = PrefixKVStore(3 * 8 * 4, min_tokens=1)  # room for 12 tokens of 8 bytes (keys + values)
    head = _entry([0, 1, 2, 3], pinned=True)
    a, b = _entry([0, 1, 2, 3, 4, 5, 6, 7]), _entry([9, 9, 9, 9])
    assert store.insert(head) and store.insert(a)
    store.lookup([0, 1, 2, 3, 4, 5, 6, 7, 8], limit=20)  # a is now the most recent
    assert store.insert(b)  # evicts a (the only unpinned entry), never the pinned head
    assert store.lookup([0, 1, 2, 3, 4, 5, 6, 7], limit=20).ids == head.ids
    assert store.stats.evictions == 1 and len(store) == 2 and store.nbytes == head.nbytes + b.nbytes
    assert not store.insert(_entry(list(range(40))))  # larger than the whole budget: not stored
    assert len(store) == 2


def test_stats_count_tokens_like_vllm_hit_rate():
    store = PrefixKVStore(1000)
    store.record(100, 40)
    store.record(50, 0)
    s = store.stats.to_dict()
    assert (s["queries"], s["hits"], s["query_tokens"], s["hit_tokens"]) == (2, 1, 150, 40)
    assert s["token_hit_rate"] == pytest.approx(40 / 150) and s["request_hit_rate"] == 0.5


def test_bad_budgets_are_refused(tiny_llama, tiny_tokenizer):
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixKVStore(-1)
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_mb=-1)
    assert Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_mb=0).prefix_store is None


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4], 10) == 2
    assert common_prefix_length([1, 2, 3], [1, 2, 3], 2) == 2
    assert common_prefix_length([1], [2], 5) == 0


# ------------------------------------------------------------------------------- the frame head
@pytest.mark.parametrize("readout", ["symbols", "label-sequence"])
def test_frame_head_is_a_token_prefix_of_ordinary_requests(tiny_tokenizer, readout):
    compiler = Compiler(tiny_tokenizer, CompilerConfig(readout=readout))
    head = compiler.frame_head_ids()
    assert len(head) > 5
    for state in ({"text": "hello"}, "plain words", ["a", 1], 3.5, {"events": ["x"] * 30}):
        ids = compiler.compile(request_from_json(_noul(state))).token_ids
        assert tuple(ids[:len(head)]) == head


# ------------------------------------------------------------------------------- answers
def _pair(model, tokenizer, **kw):
    fast = Engine.from_model(model, tokenizer, prefix_cache_min_tokens=0, **kw)  # every tree request cached
    tree = Engine.from_model(model, tokenizer, causal_path=False, prefix_cache=False, **kw)
    return fast, tree


@pytest.mark.parametrize("readout", ["symbols", "label-token", "label-sequence"])
def test_linear_batches_reuse_the_head_and_their_shared_prefix(tiny_llama, tiny_qwen2, tiny_tokenizer, readout):
    """Linear requests sharing a long state prefix: the head is reused, the batch's longest common
    prefix is prefilled once for the batch (not stored: a piece of this batch, which would make a
    later request's bits depend on it), and every answer equals the tree path's within 1e-5."""
    long = " ".join(["the login failed again from a new device"] * 8)
    for model in (tiny_llama, tiny_qwen2):
        fast, tree = _pair(model, tiny_tokenizer, readout=readout)
        requests = [_noul(long + tail) for tail in (" today.", " yesterday.", " at noon.", " twice.")]
        assert _max_diff(fast.decide_batch(requests), tree.decide_batch(requests)) <= 1e-5
        stats = fast.prefix_store.stats
        head = len(fast.compiler.frame_head_ids())
        if readout != "label-sequence":  # linear requests only with single-token readouts
            assert stats.queries == 4 and stats.hits == 4
            assert stats.hit_tokens > 4 * head  # rows 2..4 reused the batch's shared prefix
            assert stats.inserts == 1  # the head only
        again = fast.decide_batch(requests[:1])  # a later request alone: the head only
        assert _max_diff(again, tree.decide_batch(requests[:1])) <= 1e-5


@pytest.mark.parametrize("debias", ["none", "permute"])
def test_a_repeated_state_reuses_its_whole_prefix(tiny_llama, tiny_qwen2, tiny_tokenizer, debias):
    for model in (tiny_llama, tiny_qwen2):
        fast, tree = _pair(model, tiny_tokenizer, debias=debias)
        first = three_question_request(state={"events": ["login", "reset"] * 20})
        second = three_question_request(state={"events": ["login", "reset"] * 20})
        second["questions"]["risk"]["instructions"] = "How risky is it now?"
        assert _max_diff(fast.decide_batch([first]), tree.decide_batch([first])) <= 1e-5
        before = fast.prefix_store.stats.hit_tokens
        assert _max_diff(fast.decide_batch([second]), tree.decide_batch([second])) <= 1e-5
        assert fast.prefix_store.stats.hit_tokens - before == fast.compile(second).prefix_tokens


def test_cached_entries_are_never_modified(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0)
    engine.decide(three_question_request())
    entries = list(engine.prefix_store._entries.values())
    snapshot = [[k.clone() for k in e.keys] for e in entries]
    engine.decide_batch([three_question_request(), _noul("x"), _noul("a longer state with more words")])
    for e, keys in zip(entries, snapshot):
        assert all(torch.equal(a, b) for a, b in zip(e.keys, keys))


def test_a_tiny_budget_evicts_and_stays_exact(tiny_llama, tiny_tokenizer):
    fast, tree = _pair(tiny_llama, tiny_tokenizer)
    fast.decide(_noul("x"))  # seeds the pinned frame head
    store = fast.prefix_store
    head = next(iter(store._entries.values()))
    per_token = head.nbytes // len(head)
    store.max_bytes = head.nbytes + 80 * per_token  # room for about two of the prefixes below
    requests = [three_question_request(state=f"event {i} " * (10 + i)) for i in range(6)]
    assert _max_diff(fast.decide_batch(requests), tree.decide_batch(requests)) <= 1e-5
    assert store.nbytes <= store.max_bytes and store.stats.evictions >= 1
    assert (0, head.ids) in store._entries  # pinned (keyed by adapter slot and ids)


def test_sliding_window_models_have_no_store(tiny_gemma3, tiny_tokenizer):
    engine = Engine.from_model(tiny_gemma3, tiny_tokenizer)
    assert engine.prefix_store is None
    assert engine.decide(_noul("x")).ok


def test_a_context_window_too_small_for_the_head_probes_still_answers(tiny_llama, tiny_tokenizer):
    """The frame head is computed from probe requests; if they cannot compile, nothing is seeded."""
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    fits = len(engine.compile(_noul("x")).token_ids)
    small = Engine.from_model(tiny_llama, tiny_tokenizer, max_positions=fits)
    assert small.decide(_noul("x")).ok
    assert len(small.prefix_store) == 0  # the probes ("{"a": 1}", ...) do not fit: no head entry


def test_the_tiny_head_is_long_enough_to_be_seeded(tiny_llama, tiny_tokenizer):
    """Keeps the test above meaningful: with room, the tiny tokenizer's frame head is seeded."""
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    assert len(engine.compiler.frame_head_ids()) >= engine.prefix_store.min_tokens
    engine.decide(_noul("x"))
    assert len(engine.prefix_store) == 1


def test_stored_prefixes_own_their_memory(tiny_llama, tiny_tokenizer):
    """An entry's tensors are copies: their storage is what nbytes counts (a view of the batch's
    cache would keep every row alive; found by review)."""
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0)
    requests = [three_question_request(state="word " * (5 + 7 * i)) for i in range(4)]
    assert all(d.ok for d in engine.decide_batch(requests))
    store = engine.prefix_store
    assert len(store) >= 4
    for entry in store._entries.values():
        held = sum(t.untyped_storage().nbytes() for t in (*entry.keys, *entry.values))
        assert held == entry.nbytes


def test_weights_changed_in_place_need_reset_prefix_cache(tiny_llama, tiny_tokenizer):
    import copy

    model = copy.deepcopy(tiny_llama)
    engine = Engine.from_model(model, tiny_tokenizer)
    request = _noul("The login failed again.")
    engine.decide(request)  # seeds the frame head with the current weights
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.reset_prefix_cache()
    fresh = Engine.from_model(model, tiny_tokenizer, causal_path=False, prefix_cache=False)
    assert _max_diff([engine.decide(request)], [fresh.decide(request)]) <= 1e-5


def test_mistral_style_sliding_window_models_keep_the_tree_path(tiny_tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, sliding_window=16,
                        attn_implementation="sdpa")
    engine = Engine.from_model(MistralForCausalLM(cfg).eval(), tiny_tokenizer, prefix_cache_min_tokens=0)
    assert engine.prefix_store is None  # the cache would keep only the last 16 keys
    long = three_question_request(state="the login failed again from a new device " * 4)
    assert all(d.ok for d in engine.decide_batch([long, _noul("x")], on_error="raise"))


def test_int8_models_get_no_prefix_store(tiny_llama, tiny_tokenizer):
    import copy

    from noulengine.models.quantize import quantize_int8_dynamic

    engine = Engine.from_model(quantize_int8_dynamic(copy.deepcopy(tiny_llama)), tiny_tokenizer)
    assert engine.prefix_store is None
    assert engine.decide(_noul("x")).ok
