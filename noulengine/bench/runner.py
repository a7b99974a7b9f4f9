"""``noulengine bench``: the engine against the two baselines a user would write by hand.

Variants, run interleaved (rotating order) on the same model and the same compiled prompts:

* ``naive``: one transformers forward per question prompt (prefix + that question's branch),
  full-vocabulary head at every position, ``log_softmax`` at the read position;
* ``batched``: the same prompts, left-padded into batches (2D attention mask, position ids from
  the mask), full head on the trailing read positions only (``logits_to_keep``);
* ``engine``: :meth:`Engine.decide_batch` (one packed pass per request batch; its causal path,
  prefix KV cache and cross-request prefix caching on, the store emptied of all but the pinned
  frame head before every timed run, so each run sees fresh requests);
* ``engine_tree``: the engine with those three off (every request through the dense tree mask);
* ``peer`` (AG News only, when installed): anyjev from PyPI on the same model and rows
  (:mod:`noulengine.bench.peer`); its prompts are its own, so it is compared by speed and by
  accuracy against the gold labels, not by probabilities.

The pieces: :mod:`~noulengine.bench.variants` (the baselines and the engine on the same prompts),
:mod:`~noulengine.bench.workloads`, :mod:`~noulengine.bench.roofline` (peak memory, matmul peak,
parameters), :mod:`~noulengine.bench.report` (the Markdown table), :mod:`~noulengine.bench.cli`
(the flags, free of torch); this module loads the engine, measures each workload and writes the
result.

Units: seconds (``time.perf_counter``, CUDA synchronised), tokens, bytes, FLOP/s. ``tokens/s``
counts the prompt tokens a variant served; achieved FLOP/s counts 2 x non-embedding parameters x
the tokens it computed (served minus prefix-cache hits; no attention or head FLOPs), as a share
of a square-matmul peak measured in the same run, dtype and device.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from noulengine.bench.configs import MODEL_CONFIGS, WORKLOAD_NAMES
from noulengine.bench.report import markdown
from noulengine.bench.roofline import PeakMemory, matmul_peak, non_embedding_params
from noulengine.bench.variants import (VARIANTS, Prepared, _sync, baseline_prompts, max_prob_diff, run_batched,
                                       run_engine, run_naive)
from noulengine.bench.workloads import Workload, build_workloads
from noulengine.records.schema import Request


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)



# --------------------------------------------------------------------------- engine construction
def load_engine(args):
    from noulengine import Engine
    from noulengine.engine.model_runner import pick_device, pick_dtype

    kw = {"batch_tokens": args.batch_tokens} if args.batch_tokens else {}
    if args.model_config is None:
        # calibration "none": the variants compare forward passes and readouts; a trained model's
        # shipped temperatures would apply to the engine variant only and read as a disagreement
        return Engine.from_pretrained(args.model, device=args.device, dtype=args.dtype, debias="none",
                                      calibration="none", **kw), "pretrained"
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from noulengine.models.loading import resolve_model

    directory, _ = resolve_model(args.model)  # the tokenizer only
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    dev = pick_device(args.device)
    dtype = pick_dtype(args.dtype, dev)
    cfg = LlamaConfig(**MODEL_CONFIGS[args.model_config], attn_implementation="sdpa")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.eval()
    return Engine.from_model(model, tokenizer, device=str(dev), debias="none", **kw), "random weights"


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------- the run
def accuracy(wl: Workload, answers: list) -> float | None:
    """Share of questions whose argmax is the gold label (None without golds)."""
    if wl.golds is None:
        return None
    hits = total = 0
    for it, gold, per_q in zip(wl.items, wl.golds, answers):
        for plan, probs in zip(it.compiled.questions, per_q):
            if plan.field in gold:
                total += 1
                hits += plan.labels[max(range(len(probs)), key=probs.__getitem__)] == gold[plan.field]
    return hits / total if total else None


def measure_workload(engine, wl: Workload, *, reps: int, device, n_params: int, peak: float, attn: str,
                     warmup: Request | None = None, peer=None, progress=None) -> dict:
    model = engine.runner.model
    pad_id = engine.pad_id
    budget = engine.config.batch_tokens
    store = engine.prefix_store
    wl.items = [Prepared(r, engine.compile(r), baseline_prompts(engine.compile(r))) for r in wl.requests]
    n_dec = sum(len(r.questions) for r in wl.requests)
    tokens = {"naive": sum(len(p.ids) for it in wl.items for p in it.prompts),
              "batched": sum(len(p.ids) for it in wl.items for p in it.prompts),
              "engine": sum(it.compiled.input_tokens for it in wl.items)}
    tokens["engine_tree"] = tokens["engine"]
    variants = VARIANTS + (("peer",) if peer is not None and wl.peer else ())
    if "peer" in variants:
        tokens["peer"] = peer.prompt_tokens(wl.requests)

    def run(variant, items):
        if variant == "peer":
            ans, lat = peer.run([it.request for it in items])
            return ans, lat, {}
        if variant == "naive":
            ans, lat = run_naive(model, items, device)
            return ans, lat, {}
        if variant == "batched":
            ans, lat, padded = run_batched(model, items, device, batch_tokens=budget, pad_id=pad_id)
            return ans, lat, {"padded_tokens": padded}
        if attn == "flex":
            from noulengine.engine.flex_attention import use_flex_attention

            use_flex_attention(engine, True)
        causal, cached = engine.config.causal_path, engine.config.prefix_cache
        engine.config.causal_path = causal and variant == "engine"
        engine.config.prefix_cache = cached and variant == "engine"
        engine.prefix_store = store if variant == "engine" else None
        if store is not None:
            store.clear(keep_pinned=True)  # fresh requests: only the frame head is cached
        before = (store.stats.query_tokens, store.stats.hit_tokens) if store is not None else (0, 0)
        try:
            ans, lat, share = run_engine(engine, items)
        finally:
            engine.config.causal_path, engine.config.prefix_cache = causal, cached
            engine.prefix_store = store
            if attn == "flex":
                use_flex_attention(engine, False)
        ex = {"padding_share": share}
        if variant == "engine" and store is not None:
            queried, hit = store.stats.query_tokens - before[0], store.stats.hit_tokens - before[1]
            ex["prefix_cache_hit_rate"] = hit / queried if queried else 0.0
            ex["computed_tokens"] = sum(it.compiled.input_tokens for it in items) - hit
        return ans, lat, ex

    if warmup:  # excluded from timing: one small request through every variant
        for v in variants:
            run(v, [Prepared(warmup, engine.compile(warmup), baseline_prompts(engine.compile(warmup)))])
    times = {v: [] for v in variants}
    lats = {v: [] for v in variants}
    mem = {v: 0 for v in variants}
    extra: dict = {v: {} for v in variants}
    answers = {}
    for rep in range(reps):
        k = rep % len(variants)
        order = variants[k:] + variants[:k]  # interleaved, rotating order
        for v in order:
            with PeakMemory(device) as pm:
                _sync(device)
                t0 = time.perf_counter()
                ans, lat, ex = run(v, wl.items)
                _sync(device)
                dt = time.perf_counter() - t0
            times[v].append(dt)
            if progress is not None:  # one line per variant and repetition: a long run shows where it is
                progress(f"bench: {wl.name} {v} rep {rep + 1}/{reps}: {dt:.1f} s, "
                         f"{sum(len(r.questions) for r in wl.requests) / dt:.2f} decisions/s")
            lats[v].extend(lat)
            mem[v] = max(mem[v], pm.peak)
            extra[v] = ex
            answers[v] = ans
    out = {"name": wl.name, "note": wl.note, "requests": len(wl.requests), "decisions": n_dec, "reps": reps,
           "variants": {}}
    for v in variants:
        t = statistics.median(times[v])
        # FLOPs count the tokens the model computed: prefix-cache hits are served, not computed
        computed = extra[v].pop("computed_tokens", tokens[v])
        out["variants"][v] = {
            "seconds_median": t, "seconds_all": times[v], "decisions_per_s": n_dec / t,
            "requests_per_s": len(wl.requests) / t, "tokens": tokens[v], "tokens_per_s": tokens[v] / t,
            "latency_p50_s": percentile(lats[v], 0.5), "latency_p95_s": percentile(lats[v], 0.95),
            "peak_memory_bytes": mem[v], "computed_tokens": computed,
            "achieved_flops": 2 * n_params * computed / t, "share_of_matmul_peak": 2 * n_params * computed / t / peak,
            "accuracy": accuracy(wl, answers[v]), **extra[v]}
    e = out["variants"]
    if "peer" in e:
        out["ratio_vs_peer"] = e["engine"]["decisions_per_s"] / e["peer"]["decisions_per_s"]
        out["peer_version"] = peer.version
    out["decisions_per_s"] = e["engine"]["decisions_per_s"]
    out["ratio_vs_naive"] = e["engine"]["decisions_per_s"] / e["naive"]["decisions_per_s"]
    out["ratio_vs_batched"] = e["engine"]["decisions_per_s"] / e["batched"]["decisions_per_s"]
    out["ratio_vs_tree_path"] = e["engine"]["decisions_per_s"] / e["engine_tree"]["decisions_per_s"]
    out["padding_share"] = e["engine"].get("padding_share", 0.0)
    out["prefix_cache_hit_rate"] = e["engine"].get("prefix_cache_hit_rate")
    if wl.golds is not None:
        labels = [g for gold in wl.golds for g in gold.values()]
        out["gold_majority"] = max(labels.count(x) for x in set(labels)) / len(labels)
        out["chance"] = statistics.mean(1 / plan.num_candidates for it in wl.items for plan in it.compiled.questions)
    out["max_prob_diff"] = max(max_prob_diff(answers["engine"], answers["naive"]),
                               max_prob_diff(answers["engine"], answers["batched"]),
                               max_prob_diff(answers["engine"], answers["engine_tree"]),
                               max_prob_diff(answers["naive"], answers["batched"]))
    return out


def order_probe(engine, wl: Workload, probe: str = "reverse") -> dict:
    """Untimed: every request of ``wl`` with its probe requests in the same ``decide_batch`` call
    (:mod:`noulengine.eval.probe`); returns the change share over its choice questions (and the
    accuracies in order and reversed where the workload has gold labels)."""
    from noulengine.eval.probe import change_summary, decide_with_probe

    rows = decide_with_probe(engine, wl.requests, probe)
    golds = wl.golds or [{} for _ in wl.requests]
    items = [(req, {q.field: gold.get(q.field) for q in req.questions}, row)
             for req, gold, row in zip(wl.requests, golds, rows)]
    if engine.prefix_store is not None:
        engine.prefix_store.clear(keep_pinned=True)  # what the probe cached never serves a timed run
    return change_summary(items, probe)


def cost_by_questions(engine, longs: dict[int, Request], reps: int, device) -> dict:
    """Engine seconds per request for 1, 16 and 32 questions on the same long state.

    Each request runs alone (``engine.decide``), synchronised on CUDA, ``reps`` times, interleaved
    so that drift in machine load hits every count alike; the median is reported.

    Returns:
        ``{"counts": {n: {"seconds", "tokens", "time_ratio", "token_ratio"}}, "reps",
        "marginal_seconds_per_question"}``: ratios are against the 1-question request; the marginal
        cost is (t(32) - t(16)) / 16, the price of one more question once a request has many.
    """
    engine.decide_batch(list(longs.values()))  # warm-up
    times: dict[int, list[float]] = {n: [] for n in longs}
    for _ in range(reps):
        for n, req in longs.items():
            if engine.prefix_store is not None:
                engine.prefix_store.clear(keep_pinned=True)  # the same state again: a fresh request
            _sync(device)
            t0 = time.perf_counter()
            engine.decide(req)
            _sync(device)
            times[n].append(time.perf_counter() - t0)
    tokens = {n: engine.compile(req).input_tokens for n, req in longs.items()}
    med = {n: statistics.median(t) for n, t in times.items()}
    base = min(longs)
    counts = {n: {"seconds": med[n], "tokens": tokens[n], "time_ratio": med[n] / med[base],
                  "token_ratio": tokens[n] / tokens[base]} for n in sorted(longs)}
    hi = sorted(longs)[-2:]
    marginal = (med[hi[1]] - med[hi[0]]) / (hi[1] - hi[0]) if len(hi) == 2 else None
    return {"counts": counts, "reps": reps, "marginal_seconds_per_question": marginal}



def run(args) -> int:
    """Run the bench for parsed flags; returns the exit status."""
    from noulengine.threads import cli_threads

    if args.threads is not None and args.threads < 1:
        print(f"bench: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
        threads_source = "--threads"
    else:
        threads_source = cli_threads()["source"]  # NOULENGINE_THREADS, else the usable physical cores
    reps = args.reps or (1 if args.quick else 2)
    if args.batch_tokens is not None and args.batch_tokens < 1:
        print(f"bench: --batch-tokens must be >= 1, got {args.batch_tokens}", file=sys.stderr)
        return 2
    if args.output is None:
        args.output = ("bench-results/layouts.json" if getattr(args, "layouts", False) else
                       "bench-results/adapters.json" if getattr(args, "adapters", False) else "bench-results/bench.json")
    if getattr(args, "adapters", False):
        from noulengine.bench.adapters import run_adapters

        return run_adapters(args, threads_source)
    if getattr(args, "layouts", False):
        from noulengine.bench.layouts import LAYOUT_WORKLOADS, run_layouts

        unknown = sorted({w.strip() for w in (args.workloads or "").split(",") if w.strip()} - set(LAYOUT_WORKLOADS))
        if unknown:  # refused before the model loads
            print(f"bench: unknown layout workloads {unknown}; choose from {list(LAYOUT_WORKLOADS)}", file=sys.stderr)
            return 2
        engine, weights = load_engine(args)
        print(f"bench: model weights: {weights}; device {engine.runner.device}, dtype {engine.runner.dtype}, "
              f"threads {torch.get_num_threads()} ({threads_source})", flush=True)
        return run_layouts(args, engine, weights, threads_source)
    wanted = [w.strip() for w in (args.workloads or "").split(",") if w.strip()]
    unknown = sorted(set(wanted) - set(WORKLOAD_NAMES))
    if unknown:  # refused before the model loads
        print(f"bench: unknown workloads {unknown}; choose from {list(WORKLOAD_NAMES)}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    engine, weights = load_engine(args)
    device, dtype = engine.runner.device, engine.runner.dtype
    tol = args.tolerance if args.tolerance is not None else (1e-4 if dtype == torch.float32 else 2e-2)
    print(f"bench: model weights: {weights}; device {device}, dtype {dtype}, threads {torch.get_num_threads()} "
          f"({threads_source})", flush=True)
    from noulengine.bench.peer import start_peer

    peer, peer_skipped, refused = start_peer(args.peer, engine)
    if refused:
        return 2
    peak = matmul_peak(device, dtype)
    n_params = non_embedding_params(engine.runner.model)
    workloads, longs = build_workloads(args.quick)
    if wanted:
        workloads = [w for w in workloads if w.name in wanted]
    result = {"config": {"quick": args.quick, "reps": reps, "model": args.model or "default",
                         "model_config": args.model_config, "attn": args.attn,
                         "batch_tokens": engine.config.batch_tokens, "tolerance": tol, "probe": args.probe},
              "git_revision": git_revision(), "torch": torch.__version__, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
              "threads_source": threads_source, "weights": weights,
              "matmul_peak_flops": peak, "non_embedding_params": n_params, "peer_skipped": peer_skipped,
              "workloads": []}
    for i, wl in enumerate(workloads):
        print(f"bench: {wl.name} ({wl.note}) ...", flush=True)
        result["workloads"].append(measure_workload(engine, wl, reps=reps, device=device, n_params=n_params,
                                                    peak=peak, attn=args.attn,
                                                    warmup=wl.requests[0] if wl.peer and peer is not None
                                                    else workloads[0].requests[0] if i == 0 or args.attn == "flex"
                                                    else None, peer=peer,
                                                    progress=lambda line: print(line, flush=True)))
        w = result["workloads"][-1]
        if args.probe:
            w["order_probe"] = order_probe(engine, wl, args.probe)
        vs_peer = f", {w['ratio_vs_peer']:.2f}x peer" if "ratio_vs_peer" in w else ""
        print(f"bench: {wl.name}: engine {w['decisions_per_s']:.2f} decisions/s, {w['ratio_vs_naive']:.2f}x naive, "
              f"{w['ratio_vs_batched']:.2f}x batched{vs_peer}, max prob diff {w['max_prob_diff']:.1e}"
              + (f", reversal changed {w['order_probe']['changed']} of {w['order_probe']['items']} choice answers"
                 if args.probe else ""), flush=True)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2))  # partial results survive a kill
    if peer is not None:
        peer.close()
    result["cost_by_questions"] = cost_by_questions(engine, longs, max(reps, 2), device)
    result["wall_seconds"] = time.perf_counter() - t_start
    worst = max(w["max_prob_diff"] for w in result["workloads"])
    result["agreement_ok"] = worst <= tol
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    table = markdown(result)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"bench: wrote {out} and {out.with_suffix('.md')} ({result['wall_seconds']:.0f} s)")
    if not result["agreement_ok"]:
        print(f"bench: FAIL: variants disagree by {worst:.2e} > {tol:.0e}", file=sys.stderr)
        return 1
    return 0

