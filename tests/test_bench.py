"""The benchmark's baselines evaluate the engine's own prompts and agree with it (tiny models, CPU)."""

from __future__ import annotations

import pytest
import torch

from noulengine import Engine
from noulengine.bench.configs import MODEL_CONFIGS
from noulengine.bench.report import markdown
from noulengine.bench.roofline import non_embedding_params
from noulengine.bench.runner import percentile
from noulengine.bench.variants import Prepared, baseline_prompts, max_prob_diff, run_batched, run_engine, run_naive
from noulengine.records.schema import request_from_json
from tests.conftest import three_question_request


def _items(engine, requests):
    out = []
    for r in requests:
        req = request_from_json(r)
        out.append(Prepared(req, engine.compile(req), baseline_prompts(engine.compile(req))))
    return out


def test_prompts_are_prefix_plus_branch(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    c = engine.compile(request_from_json(three_question_request()))
    prompts = baseline_prompts(c)
    prefix = [t for t, s in zip(c.token_ids, c.segment_ids) if s == 0]
    branches = [s for s, p in enumerate(c.parents) if p == 0]
    assert len(prompts) == len(branches) == 3
    for pr, seg in zip(prompts, branches):
        assert pr.ids == prefix + [t for t, s in zip(c.token_ids, c.segment_ids) if s == seg]
        assert all(pos == len(pr.ids) - 1 for pos, _, _ in pr.reads)  # single-token readouts: last position


def test_variants_agree(tiny_model, tiny_tokenizer):
    engine = Engine.from_model(tiny_model, tiny_tokenizer)
    items = _items(engine, [three_question_request(), three_question_request(state="short"),
                            three_question_request(state="a much longer state " * 20)])
    naive, lat_n = run_naive(tiny_model, items, torch.device("cpu"))
    batched, lat_b, padded = run_batched(tiny_model, items, torch.device("cpu"), batch_tokens=256, pad_id=engine.pad_id)
    eng, lat_e, share = run_engine(engine, items)
    assert len(lat_n) == len(lat_b) == len(lat_e) == 3 and padded > 0 and 0 <= share < 1
    assert max_prob_diff(naive, eng) < 1e-4
    assert max_prob_diff(batched, eng) < 1e-4
    assert abs(sum(eng[0][0]) - 1) < 1e-9


def test_label_sequence_prompts_agree(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, readout="label-sequence")
    items = _items(engine, [three_question_request()])
    naive, _ = run_naive(tiny_llama, items, torch.device("cpu"))
    batched, _, _ = run_batched(tiny_llama, items, torch.device("cpu"), batch_tokens=4096, pad_id=engine.pad_id)
    eng, _, _ = run_engine(engine, items)
    assert max_prob_diff(naive, eng) < 1e-4 and max_prob_diff(batched, eng) < 1e-4


def test_helpers():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.95) == 5.0
    assert set(MODEL_CONFIGS) == {"smollm2-135m", "llama-0.5b", "llama-8b"}


def test_non_embedding_params_counts_tied_head_once(tiny_llama):
    total = sum(p.numel() for p in tiny_llama.parameters())
    assert non_embedding_params(tiny_llama) == total - tiny_llama.get_input_embeddings().weight.numel()


def test_markdown_renders():
    v = {"decisions_per_s": 2.0, "requests_per_s": 1.0, "tokens_per_s": 100.0, "latency_p50_s": 0.5,
         "latency_p95_s": 0.9, "peak_memory_bytes": 2 ** 30, "share_of_matmul_peak": 0.25}
    tree = {**v, "decisions_per_s": 1.6}
    result = {"workloads": [{"name": "w", "variants": {"naive": v, "batched": v, "engine": v, "engine_tree": tree},
                             "max_prob_diff": 1e-6, "padding_share": 0.1, "ratio_vs_tree_path": 1.25}],
              "cost_by_questions": {"counts": {1: {"seconds": 0.8, "tokens": 5, "time_ratio": 1.0, "token_ratio": 1.0},
                                               16: {"seconds": 1.0, "tokens": 10, "time_ratio": 1.25,
                                                    "token_ratio": 2.0},
                                               32: {"seconds": 1.2, "tokens": 15, "time_ratio": 1.5,
                                                    "token_ratio": 3.0}},
                                    "reps": 2, "marginal_seconds_per_question": 0.0125},
              "matmul_peak_flops": 1.5e11, "dtype": "float32", "device": "cpu", "threads": 2,
              "non_embedding_params": 1e8, "weights": "pretrained"}
    table = markdown(result)
    assert "| w | engine | 2.00 |" in table and "| 16 | 1.000 | 10 | 1.25x | 2.00x |" in table
    assert "| w | engine_tree | 1.60 |" in table and "| 0.100 | 1.25x |" in table
    assert "| 32 | 1.200 | 15 | 1.50x | 3.00x |" in table and "12.5 ms" in table


def test_long_state_requests_share_one_state_and_grow_by_questions():
    import pytest

    from noulengine.bench.workloads import long_state_requests
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "wildjailbreak").is_dir():
        pytest.skip("shared data not present")
    longs = long_state_requests(1000)
    assert sorted(longs) == [1, 16, 32]
    assert len({json_state(r) for r in longs.values()}) == 1
    fields = [q.field for q in longs[32].questions]
    assert len(fields) == len(set(fields)) == 32 and [q.field for q in longs[16].questions] == fields[:16]


def json_state(req):
    import json

    return json.dumps(req.state, sort_keys=True)


def test_matmul_peak_is_positive_and_finite_on_cpu():
    import math

    import torch

    from noulengine.bench.roofline import matmul_peak

    peak = matmul_peak(torch.device("cpu"), torch.float32, sizes=(64, 96), reps=2)
    assert math.isfinite(peak) and peak > 0


def test_peer_variant_runs_on_the_same_weights(tiny_llama, tiny_tokenizer):
    """The peer (anyjev, the `bench` extra) answers AG News-shaped requests on the engine's own model."""
    from noulengine.bench.peer import Peer, peer_unavailable

    why = peer_unavailable()
    if why:
        pytest.skip(why)
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    criteria = {"world": "World news.", "sports": "Sports.", "business": "Business.", "sci_tech": "Science."}
    requests = [request_from_json({"state": {"text": t}, "questions": {
        "decision": {"type": "choice", "instructions": "Which topic?", "criteria": criteria}}})
        for t in ("Stocks fell.", "The team won.", "A new chip.")]
    peer = Peer(engine)
    try:
        answers, latency = peer.run(requests)
        tokens = peer.prompt_tokens(requests)
    finally:
        peer.close()
    assert len(answers) == 3 and len(latency) == 3 and all(t > 0 for t in latency)
    for per_q in answers:
        assert len(per_q) == 1 and len(per_q[0]) == 4 and abs(sum(per_q[0]) - 1) < 1e-6
    assert len(set(tuple(a[0]) for a in answers)) > 1  # the states are really read
    assert tokens > 3 * 10


def test_workload_names_match_the_builder_and_unknown_ones_exit_2():
    from noulengine.bench import WORKLOAD_NAMES, build_workloads, main  # the package re-exports its parts

    workloads, _ = build_workloads(quick=True)
    assert tuple(w.name for w in workloads) == WORKLOAD_NAMES
    assert main(["--workloads", "agnews_1q,typo"]) == 2


def test_probe_reverse_reports_the_change_share_per_workload(tiny_llama, tiny_tokenizer):
    """`noulengine bench --probe reverse`: each workload answered again with its options reversed
    (untimed); a model that answers by slot changes every choice answer."""
    from noulengine.bench.runner import order_probe
    from noulengine.bench.workloads import Workload
    from tests.conftest import biased_head_engine, topic_request

    engine = biased_head_engine(tiny_llama, tiny_tokenizer, readout="symbols", label="world")
    states = ["Stocks fell.", "The team won.", "A new chip."]
    wl = Workload("agnews_like", [request_from_json(topic_request(s)) for s in states], golds=[{"topic": "world"}] * 3)
    p = order_probe(engine, wl)
    assert (p["items"], p["changed"], p["change_share"]) == (3, 3, 1.0)
    assert p["accuracy_in_order"] == 1.0 and p["accuracy_reversed"] == 0.0
    typed = Workload("typed", [request_from_json(three_question_request())])  # no golds: the share alone
    q = order_probe(engine, typed)
    assert q["items"] == 1 and q["gold_items"] == 0 and q["accuracy_in_order"] is None


def test_markdown_shows_the_probe_table():
    v = {"decisions_per_s": 2.0, "requests_per_s": 1.0, "tokens_per_s": 100.0, "latency_p50_s": 0.5,
         "latency_p95_s": 0.9, "peak_memory_bytes": 2 ** 30, "share_of_matmul_peak": 0.25}
    probe = {"probe": "reverse", "items": 24, "changed": 6, "change_share": 0.25, "errors": 0, "missing": 0,
             "gold_items": 24, "accuracy_in_order": 0.5, "accuracy_reversed": 0.375}
    result = {"workloads": [{"name": "agnews_1q", "variants": {"naive": v, "batched": v, "engine": v, "engine_tree": v},
                             "max_prob_diff": 1e-6, "padding_share": 0.1, "ratio_vs_tree_path": 1.0,
                             "order_probe": probe}],
              "cost_by_questions": {"counts": {}, "reps": 1, "marginal_seconds_per_question": None},
              "matmul_peak_flops": 1.5e11, "dtype": "float32", "device": "cpu", "threads": 2,
              "non_embedding_params": 1e8, "weights": "pretrained"}
    assert "| agnews_1q | 24 | 6 | 0.250 | 50.0% | 37.5% |" in markdown(result)
