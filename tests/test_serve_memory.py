"""The server's memory is bounded by the prefix store's byte budget (issue #46 item 3): many
requests on distinct long states (each a prefix the store keeps) leave the resident set within the
budget plus a fixed allowance, and the store itself never holds more than its budget."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from noulengine import Engine  # noqa: E402
from noulengine.serve.app import create_app  # noqa: E402
from noulengine.serve.config import ServeConfig  # noqa: E402
from tests.conftest import three_question_request  # noqa: E402

STATM = "/proc/self/statm"
BUDGET_MB = 2
ALLOWANCE_MB = 48  # allocator and interpreter noise; one stored prefix here is ~0.7 MiB


def _rss_mb() -> float:
    return int(open(STATM).read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(STATM), reason="needs /proc/self/statm (Linux)")
def test_many_distinct_states_stay_within_the_prefix_budget(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, prefix_cache_mb=BUDGET_MB, prefix_cache_min_tokens=0)
    store = engine.prefix_store

    def request(i: int) -> dict:  # over a thousand tokens of a state no other request has
        return three_question_request(state=f"ticket {i}: " + f"w{i} " * 450)

    with TestClient(create_app(engine, ServeConfig(model_name="tiny"))) as client:
        for i in range(20):  # warm-up: allocator pools, the frame head, the first stored states
            assert client.post("/v1/decide", json=request(i)).status_code == 200
        before = _rss_mb()
        for i in range(20, 170):
            assert client.post("/v1/decide", json=request(i)).status_code == 200
            assert store.nbytes <= store.max_bytes
        grown = _rss_mb() - before
    assert store.stats.evictions > 100  # the budget was reached and enforced
    # unbounded, the 150 stored states would add ~100 MiB
    assert grown < BUDGET_MB + ALLOWANCE_MB, f"resident set grew {grown:.1f} MiB"
