"""Experiment behind docs/serving.md#chunked-scheduling-of-large-requests ("where the first run's 6.5 s went"); reproduce: `NOULENGINE_THREADS=1 python experiments/worker_head_of_line.py`.

The load test's head-of-line case without HTTP: the server's :class:`~noulengine.serve.worker.BatchWorker`
driven in-process on the default model, so every pass it runs can be timed.

1. The ten small requests of ``scripts/load_test.py`` alone on an idle engine: as one
   ``decide_batch`` (what the worker ran between two chunks before the small requests were split
   into passes) and one at a time.
2. The 254-option request through the worker, the ten sent 2 s after it: when each small request
   was answered (seconds after sending), the passes the worker ran for them (requests, start,
   seconds) and each step of the large request (seconds: one canonical chunk of at most
   ``chunk_tokens`` tokens, its prefix already stored by a warm-up, as in the load test).

Units: wall-clock seconds (``time.perf_counter``); CPU only (nothing here synchronises a GPU).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def main() -> int:
    from load_test import large_request, make_requests

    from noulengine import Engine
    from noulengine.records.schema import request_from_json
    from noulengine.serve.worker import BatchWorker

    engine = Engine.from_pretrained()
    large = request_from_json(large_request(254))
    small = [request_from_json(dict(r, id=f"s{i}")) for i, r in enumerate(make_requests(10))]
    print("small requests' packed tokens:", [engine.compile(r).input_tokens for r in small])
    engine.decide(small[0])
    engine.decide(large)  # warm-up: the large request's prefix is stored, as in the load test

    together, one_by_one = [], []
    for _ in range(3):
        t = time.perf_counter()
        engine.decide_batch(small)
        together.append(time.perf_counter() - t)
        t = time.perf_counter()
        for r in small:
            engine.decide(r)
        one_by_one.append(time.perf_counter() - t)
    print(f"the ten in one decide_batch: median {statistics.median(together):.2f} s; "
          f"one at a time: median {statistics.median(one_by_one):.2f} s (3 repetitions)")

    worker = BatchWorker(engine, max_wait_ms=5)
    t0 = time.perf_counter()
    passes, steps = [], []
    decide_batch, step_job = engine.decide_batch, worker._step_job

    def timed_batch(batch, **kw):
        batch = list(batch)
        t = time.perf_counter()
        out = decide_batch(batch, **kw)
        passes.append((len(batch), round(t - t0, 2), round(time.perf_counter() - t, 2)))
        return out

    def timed_step():
        t = time.perf_counter()
        step_job()
        steps.append(round(time.perf_counter() - t, 2))

    engine.decide_batch, worker._step_job = timed_batch, timed_step
    worker.start()
    try:
        big = worker.submit(large)
        time.sleep(2.0)
        sent = time.perf_counter()
        futures = [worker.submit(r) for r in small]
        answered = []
        for f in futures:
            f.result()
            answered.append(round(time.perf_counter() - sent, 2))
        big.result()
        print(f"large request: {time.perf_counter() - t0:.2f} s; small requests answered after {answered} s "
              f"(median {statistics.median(answered):.2f})")
    finally:
        worker.stop()
    print("passes for the small requests (requests, start s, seconds):", passes)
    print(f"the large request's steps ({len(steps)}), seconds each:", steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
