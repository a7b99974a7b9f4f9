"""Bounded load test of the HTTP service: dynamic batching on vs off, measured in one run.

Starts the app in-process with uvicorn on a free 127.0.0.1 port (loopback only, nothing else is
contacted), sends a fixed number of distinct /v1/decide requests with fixed concurrency, once with
batching off (``max_batch_tokens=1``: one request per forward pass) and once on, and reports
throughput and p50/p95/p99 latency for both, their ratios, batch sizes, and how far answers moved
between the two modes. Fails (exit 1) on any error, any lost request, or a run over ``--duration-s``.

    python scripts/load_test.py --requests 48 --concurrency 16          # default model
    python scripts/load_test.py --tiny --requests 400 --concurrency 32  # tiny random model (fast)

``--head-of-line`` measures chunked scheduling instead (issue #56): a large request (one choice
question with ``--options`` options, 254 by default) is timed alone, then sent again with ``--small``
small requests sent ``--delay-s`` after it; reported per mode (chunking on with ``--chunk-tokens``,
and off): the large request's time alone and with the small ones, the small ones' median latency,
how many finished before the large one, and the issue's two targets (small median <= 1/4 of the
large request's time; large request <= 1.3x its time alone):

    NOULENGINE_THREADS=1 python scripts/load_test.py --head-of-line --json hol.json   # default model
    python scripts/load_test.py --tiny --head-of-line --options 40 --chunk-tokens 64 --chunk-min-tokens 400
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


def large_request(options: int) -> dict:
    """The issue's large request: one choice question with ``options`` options (254: the repro)."""
    return {"id": "large", "state": {"ticket": "My card was charged twice for order 4471."}, "questions": {
        "tool": {"type": "choice", "instructions": "Which tool handles this?",
                 "criteria": {f"tool_{k}": f"Handles case {k}." for k in range(options)}}}}


async def head_of_line_round(url: str, large: dict, small: list[dict], delay_s: float, timeout: float) -> dict:
    """One round: ``large`` alone, then ``large`` again with ``small`` sent ``delay_s`` after it.
    Latencies are client-side wall seconds (send to answer)."""
    import httpx

    async with httpx.AsyncClient(timeout=timeout) as client:
        async def timed(req):
            t0 = time.perf_counter()
            r = await client.post(url + "/v1/decide", json=req)
            return t0, time.perf_counter(), r.status_code

        t0, t1, status = await timed(large)
        alone = t1 - t0
        big = asyncio.create_task(timed(large))
        await asyncio.sleep(delay_s)
        smalls = await asyncio.gather(*(timed(r) for r in small))
        b0, b1, b_status = await big
    lat = [e - s for s, e, _ in smalls]
    return {"large_alone_s": alone, "large_with_small_s": b1 - b0, "small_latency_s": lat,
            "small_p50_s": statistics.median(lat), "small_before_large": sum(e < b1 for _, e, _ in smalls),
            "statuses": [status, b_status] + [c for _, _, c in smalls]}


def head_of_line(engine, args) -> int:
    """The ``--head-of-line`` benchmark (chunking on, then off, on one warm engine)."""
    from noulengine.serve.app import create_app
    from noulengine.serve.config import ServeConfig

    large = large_request(args.options)
    small = [dict(r, id=f"s{i}") for i, r in enumerate(make_requests(args.small))]
    print(f"large request: {engine.compile(large).input_tokens} packed tokens; small: "
          f"{statistics.median(engine.compile(r).input_tokens for r in small):.0f} (median); "
          f"chunk_min_tokens {engine.config.chunk_min_tokens}", flush=True)
    results, bad = {}, []
    for mode, chunk in (("chunked", args.chunk_tokens), ("unchunked", 0)):
        engine.config.chunk_tokens = chunk
        engine.reset_prefix_cache()
        app = create_app(engine, ServeConfig(model_name="load-test", max_batch_tokens=args.batch_tokens,
                                             max_wait_ms=args.max_wait_ms, max_queue=4 * (args.small + 2)))
        with Server(app) as url:
            import httpx

            for warm in (small[0], large):  # warm-up (not counted): the large one's state is then stored,
                httpx.post(url + "/v1/decide", json=warm, timeout=600)  # as for every timed run after it
            rounds = [asyncio.run(head_of_line_round(url, large, small, args.delay_s, args.duration_s))
                      for _ in range(args.reps)]
            steps = app.state.worker.chunk_steps
        med = {k: statistics.median(r[k] for r in rounds) for k in
               ("large_alone_s", "large_with_small_s", "small_p50_s", "small_before_large")}
        med.update(chunk_tokens=chunk, chunk_steps=steps, rounds=rounds,
                   small_over_large=med["small_p50_s"] / med["large_with_small_s"],
                   large_slowdown=med["large_with_small_s"] / med["large_alone_s"])
        results[mode] = med
        print(f"  {mode:>9} (chunk_tokens {chunk}): large alone {med['large_alone_s']:.2f}s, with {args.small} small "
              f"{med['large_with_small_s']:.2f}s ({med['large_slowdown']:.2f}x); small p50 {med['small_p50_s']:.2f}s "
              f"({med['small_over_large']:.2f} of the large); {med['small_before_large']:.0f}/{args.small} finished "
              f"before it; {steps} chunks", flush=True)
        bad += [f"{mode}: status {c}" for r in rounds for c in r["statuses"] if c != 200]
    engine.config.chunk_tokens = args.chunk_tokens
    on = results["chunked"]
    targets = {"small_before_large": on["small_before_large"] == args.small,
               "small_p50_le_quarter_of_large": on["small_over_large"] <= 0.25,
               "large_le_1.3x_alone": on["large_slowdown"] <= 1.3}
    print("targets (chunked): " + "  ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in targets.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results, "targets": targets}, fh, indent=1)
    if bad:
        print("FAIL: " + "; ".join(bad))
        return 1
    return 0


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
    p.add_argument("--head-of-line", action="store_true",
                   help="measure chunked scheduling: small requests sent while a large one runs (issue #56)")
    p.add_argument("--options", type=int, default=254, help="--head-of-line: options of the large request")
    p.add_argument("--small", type=int, default=10, help="--head-of-line: small requests sent during it")
    p.add_argument("--delay-s", type=float, default=2.0, help="--head-of-line: seconds before the small ones")
    p.add_argument("--reps", type=int, default=1, help="--head-of-line: rounds (medians reported)")
    p.add_argument("--chunk-tokens", type=int, default=None,
                   help="--head-of-line: the engine's chunk_tokens with chunking on (default: the engine's)")
    p.add_argument("--chunk-min-tokens", type=int, default=None,
                   help="--head-of-line: the engine's chunk_min_tokens (default: the engine's)")
    args = p.parse_args(argv)
    if args.requests < 1 or args.requests > 100_000 or args.concurrency < 1:
        p.error("--requests must be 1..100000 and --concurrency >= 1")

    from noulengine import Engine

    t0 = time.perf_counter()
    engine = tiny_engine() if args.tiny else Engine.from_pretrained(args.model)
    print(f"model loaded in {time.perf_counter() - t0:.1f}s; {args.requests} requests, concurrency {args.concurrency}",
          flush=True)
    if args.head_of_line:
        if args.chunk_tokens is None:
            args.chunk_tokens = engine.config.chunk_tokens
        if args.chunk_min_tokens is not None:
            engine.config.chunk_min_tokens = args.chunk_min_tokens
        if args.chunk_tokens < 1 or args.small < 1 or args.reps < 1 or args.options < 2:
            p.error("--head-of-line needs --chunk-tokens >= 1, --small >= 1, --reps >= 1, --options >= 2")
        return head_of_line(engine, args)
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
