"""Bounded load test of the HTTP service: dynamic batching on vs off, measured in one run.

Starts the app in-process with uvicorn on a free 127.0.0.1 port (loopback only, nothing else is
contacted), sends a fixed number of distinct /v1/decide requests with fixed concurrency, once with
batching off (``max_batch_tokens=1``: one request per forward pass) and once on, and reports
throughput and p50/p95/p99 latency for both, their ratios, batch sizes, and how far answers moved
between the two modes. Fails (exit 1) on any error, any lost request, or a run over ``--duration-s``.

    python scripts/load_test.py --requests 48 --concurrency 16          # default model
    python scripts/load_test.py --tiny --requests 400 --concurrency 32  # tiny random model (fast)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time

QUESTIONS = {
    "flag": {"type": "noul", "instructions": "Should a human look at this event?"},
    "topic": {"type": "choice", "instructions": "Which topic is it?",
              "criteria": {"security": "Logins, access, attacks", "billing": "Payments, invoices", "other": None}},
    "risk": {"type": "score", "instructions": "How risky is it?", "criteria": ["none", "low", "medium", "high"]},
}
EVENTS = ["rejected logins from a new country", "a refund request for a double charge", "a password reset",
          "an outage report from three customers", "a new admin account created at night", "a routine invoice"]


def make_requests(n: int) -> list[dict]:
    """n distinct requests of varying length (same three questions)."""
    return [{"id": f"r{i}", "state": f"Event {i}: " + ", then ".join(EVENTS[(i + k) % len(EVENTS)] for k in range(1 + i % 4)),
             "questions": QUESTIONS} for i in range(n)]


def tiny_engine():
    """A 2-layer random Llama with a tiny trained BPE tokenizer (like the test fixtures)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from noulengine import Engine

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = [" ".join(EVENTS), json.dumps(QUESTIONS), "Answer yes no Yes No A B C D 0 1 2 3"] * 20
    tk.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=4096, attn_implementation="sdpa")).eval()
    return Engine.from_model(model, tok, use_chat_template=False)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """uvicorn in a thread, bound to 127.0.0.1 only."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


async def fire(url: str, requests: list[dict], concurrency: int, duration_s: float) -> dict:
    """Send every request once with at most `concurrency` in flight; stop at the deadline."""
    import httpx

    sem = asyncio.Semaphore(concurrency)
    latencies, statuses, answers = [], {}, {}

    async def one(client, req):
        async with sem:
            t0 = time.perf_counter()
            r = await client.post(url + "/v1/decide", json=req)
            latencies.append(time.perf_counter() - t0)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 200:
                answers[req["id"]] = r.json()["answers"]

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=duration_s, limits=limits) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(client, r)) for r in requests]
        done, pending = await asyncio.wait(tasks, timeout=duration_s)
        for t in pending:
            t.cancel()
        wall = time.perf_counter() - t0
    errors = sum(n for s, n in statuses.items() if s != 200) + sum(1 for t in done if t.exception())
    return {"wall_s": wall, "latencies": latencies, "statuses": statuses, "errors": errors,
            "lost": len(requests) - len(answers) - errors, "answers": answers, "timed_out": bool(pending)}


def run_mode(engine, name: str, batch_tokens: int, args, requests) -> dict:
    from noulengine.serve.app import create_app
    from noulengine.serve.config import ServeConfig

    app = create_app(engine, ServeConfig(model_name="load-test", max_batch_tokens=batch_tokens,
                                         max_wait_ms=args.max_wait_ms, max_queue=max(args.concurrency, 1) * 2))
    with Server(app) as url:
        import httpx

        httpx.post(url + "/v1/decide", json=requests[0], timeout=600)  # warm-up (not counted)
        out = asyncio.run(fire(url, requests, args.concurrency, args.duration_s))
        sizes = app.state.metrics.batch_sizes
        out["mean_batch"] = (sizes.sum - 1) / max(sizes.total - 1, 1)  # minus the warm-up call
    lat = out["latencies"] or [float("nan")]
    out.update(mode=name, batch_tokens=batch_tokens, throughput=len(out["answers"]) / out["wall_s"],
               p50=pct(lat, 50), p95=pct(lat, 95), p99=pct(lat, 99), mean=statistics.fmean(lat))
    print(f"  {name:>3}: {len(out['answers'])}/{len(requests)} ok in {out['wall_s']:.2f}s  "
          f"{out['throughput']:.2f} req/s  p50 {out['p50'] * 1000:.0f} ms  p95 {out['p95'] * 1000:.0f} ms  "
          f"p99 {out['p99'] * 1000:.0f} ms  mean batch {out['mean_batch']:.1f}  statuses {out['statuses']}", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model path (default: the embedded default model)")
    p.add_argument("--tiny", action="store_true", help="use a tiny random model instead (fast; CPU)")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration-s", type=float, default=900, help="hard limit per mode")
    p.add_argument("--batch-tokens", type=int, default=8192, help="budget with batching on")
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--json", help="write the measurements here")
    args = p.parse_args(argv)
    if args.requests < 1 or args.requests > 100_000 or args.concurrency < 1:
        p.error("--requests must be 1..100000 and --concurrency >= 1")

    from noulengine import Engine

    t0 = time.perf_counter()
    engine = tiny_engine() if args.tiny else Engine.from_pretrained(args.model)
    print(f"model loaded in {time.perf_counter() - t0:.1f}s; {args.requests} requests, concurrency {args.concurrency}",
          flush=True)
    reqs = make_requests(args.requests)
    off = run_mode(engine, "off", 1, args, reqs)
    on = run_mode(engine, "on", args.batch_tokens, args, reqs)
    diffs = [abs(pa - on["answers"][rid][f]["probabilities"][k])
             for rid, ans in off["answers"].items() if rid in on["answers"]
             for f, a in ans.items() for k, pa in a["probabilities"].items()]
    flips = sum(a["label"] != on["answers"][rid][f]["label"] for rid, ans in off["answers"].items()
                if rid in on["answers"] for f, a in ans.items())
    ratios = {"throughput_on_over_off": on["throughput"] / off["throughput"], "p50_off_over_on": off["p50"] / on["p50"],
              "p95_off_over_on": off["p95"] / on["p95"], "p99_off_over_on": off["p99"] / on["p99"]}
    print("ratios: " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print(f"answers on vs off: max |dp| {max(diffs) if diffs else 0:.2e}, argmax flips {flips}")
    if args.json:
        keep = ("mode", "batch_tokens", "wall_s", "throughput", "p50", "p95", "p99", "mean", "mean_batch",
                "statuses", "errors", "lost")
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "off": {k: off[k] for k in keep}, "on": {k: on[k] for k in keep},
                       "ratios": ratios, "max_abs_dp": max(diffs) if diffs else 0, "argmax_flips": flips}, fh, indent=1)
    bad = [f"{m['mode']}: {m['errors']} errors, {m['lost']} lost, timed out={m['timed_out']}"
           for m in (off, on) if m["errors"] or m["lost"] or m["timed_out"]]
    if bad:
        print("FAIL: " + "; ".join(bad))
        return 1
    print("OK: zero errors, zero lost requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
