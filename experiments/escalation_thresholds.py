"""Experiment behind docs/escalation.md#measured-what-a-small-local-llm-adds ("Measured: what a small local LLM adds"); reproduce: `python experiments/escalation_thresholds.py --sample 20 --part table --output runs/escalation`.

Measure escalation on real rows: the threshold table and the stream's latency (issue #24).

Starts llama.cpp's OpenAI-compatible server on the embedded base model's GGUF (SmolLM2-135M-Instruct
Q4_1; the local LLM the tests use), then

1. runs ``python -m noulengine.eval`` with the default decision model on a fixed-seed sample of
   typed_decisions and the three Jevbench tiers, with ``--escalate-below`` at three thresholds:
   accuracy without and with escalation, share escalated, tokens per escalated field
   (``OUT/escalation.md``);
2. serves the default model with escalation (``/v1/decide``, ``"stream": true``) on a local port
   and times, per request, the first and the last server-sent event from the moment the request
   is sent (p50/p95 over the sampled typed_decisions rows, sent one at a time).

    python experiments/escalation_thresholds.py --sample 20 --output runs/escalation

Everything runs on this machine's CPU; the numbers are what this small local LLM adds, not what a
user's larger LLM would.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def stream_latency(url: str, sample: int, seed: int, below: float, llm_threads: int) -> dict:
    import httpx

    from noulengine import Engine
    from noulengine.escalate import EscalationConfig
    from noulengine.eval.runner import EvalConfig, selected_rows
    from noulengine.eval.suites import get_suite
    from noulengine.records.schema import request_to_json
    from noulengine.serve.app import create_app
    from noulengine.serve.config import ServeConfig
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.live_server import live_server

    rows = selected_rows("typed_decisions", get_suite("typed_decisions").load(), EvalConfig(sample=sample, seed=seed))
    engine = Engine.from_pretrained()
    app = create_app(engine, ServeConfig(escalation=EscalationConfig(url=url, below=below, max_concurrent=1,
                                                                     timeout_s=300.0, deadline_s=3600.0)))
    first, last, escalated = [], [], []
    with live_server(app) as base, httpx.Client(timeout=300) as client:
        for _, rec in rows:
            body = {**request_to_json(rec.request), "stream": True}
            t0 = time.perf_counter()
            t_first = None
            n = 0
            with client.stream("POST", f"{base}/v1/decide", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        t = time.perf_counter() - t0
                        if t_first is None:
                            t_first = t
                        if line == "event: answer":
                            n += 1
                        if line == "event: done":
                            last.append(t)
                    elif line.startswith("data: ") and '"source": "escalated"' in line:
                        escalated.append(1)
            first.append(t_first)
    return {"requests": len(first), "below": below, "escalated_fields": len(escalated),
            "first_event_s": {"p50": percentile(first, 0.5), "p95": percentile(first, 0.95),
                              "mean": statistics.fmean(first)},
            "last_event_s": {"p50": percentile(last, 0.5), "p95": percentile(last, 0.95),
                             "mean": statistics.fmean(last)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=int, default=20, help="rows per suite (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--thresholds", default="0.5,0.7,0.9")
    p.add_argument("--stream-below", type=float, default=0.7, help="threshold for the stream timing (default 0.7)")
    p.add_argument("--llm-threads", type=int, default=1)
    p.add_argument("--llm-timeout", type=float, default=300.0, help="seconds per LLM call (default 300)")
    p.add_argument("--llm-deadline", type=float, default=3600.0, help="seconds per request's escalations (default 3600)")
    p.add_argument("--output", default="runs/escalation")
    p.add_argument("--part", choices=("all", "table", "stream"), default="all",
                   help="run only the threshold table or only the stream timing (default both)")
    args = p.parse_args(argv)
    from noulengine.escalate.local_server import llama_server
    from noulengine.eval.__main__ import main as eval_main

    out = Path(args.output)
    with llama_server(threads=args.llm_threads) as url:
        if args.part in ("all", "table"):
            rc = eval_main(["--tasks", "typed_decisions,jevbench_easy,jevbench_original,jevbench_hard", "--sample",
                            str(args.sample), "--seed", str(args.seed), "--output", str(out), "--no-plots",
                            "--escalate-url", url, "--escalate-below", args.thresholds,
                            # llama-cpp-python's server answers one call at a time: more in flight only
                            # queue there and eat the timeouts; the budgets are generous for a CPU LLM
                            "--escalate-concurrency", "1", "--escalate-timeout", str(args.llm_timeout),
                            "--escalate-deadline", str(args.llm_deadline), "--escalate-max", "16"])
            if rc != 0 or args.part == "table":
                return rc
        lat = stream_latency(url, args.sample, args.seed, args.stream_below, args.llm_threads)
    (out / "stream_latency.json").write_text(json.dumps(lat, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(lat, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
