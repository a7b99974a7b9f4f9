"""``noulengine bench --adapters``: the same rows split over 1, 2 and 4 LoRA adapters in mixed
batches, against the adapter merged into the model, interleaved in one run.

The model is the default base (SmolLM2-135M-Instruct) with the shipped default adapter: the
``merged`` variant is ``Engine.from_pretrained()`` (the adapter merged into the weights, as the
default serves); the others load the base once and the same adapter folder under 1, 2 or 4 names
(copies of the folder: the cost of a slot does not depend on its weights), and route the rows
round-robin over them, so every batch mixes adapters. Every row's answer must equal the merged
model's within ``--tolerance`` (each slot holds the same adapter): a speed that changes answers
is not reported as a win.

Variants run interleaved, rotating their order every repetition; the median of the repetitions is
reported, with decisions per second and the ratio to ``merged``. Memory: the adapters' factor bytes
and the process's resident set before and after loading them.

Units: seconds (``time.perf_counter``, CUDA synchronised), decisions per second, bytes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ADAPTER_COUNTS = (1, 2, 4)
ADAPTER_WORKLOADS = ("agnews_1q", "tickets_3q")


def _rss_bytes() -> int | None:
    try:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _max_diff(a, b) -> float:
    return max(abs(x.answers[f].probabilities[k] - y.answers[f].probabilities[k])
               for x, y in zip(a, b) for f in x.answers for k in x.answers[f].probabilities)


def run_adapters(args, threads_source: str) -> int:
    """Load both engines, time every variant on each workload, write JSON and Markdown."""
    import json

    import torch

    from noulengine import Engine
    from noulengine.bench.layouts import layout_workloads
    from noulengine.eval.report import git_revision
    from noulengine.models.loading import DEFAULT_ADAPTER_DIR, ModelNotFoundError

    wanted = [w.strip() for w in (args.workloads or "").split(",") if w.strip()] or list(ADAPTER_WORKLOADS)
    unknown = sorted(set(wanted) - set(ADAPTER_WORKLOADS))
    if unknown:
        print(f"bench: unknown adapter workloads {unknown}; choose from {list(ADAPTER_WORKLOADS)}")
        return 2
    try:
        merged = Engine.from_pretrained(device=args.device, dtype=args.dtype)
        rss_base = _rss_bytes()
        base = Engine.from_pretrained("SmolLM2-135M-Instruct", device=args.device, dtype=args.dtype)
    except ModelNotFoundError as exc:
        print(f"bench: {exc}")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="noulengine-adapters-"))
    try:
        rss_before = _rss_bytes()
        for k in range(max(ADAPTER_COUNTS)):
            shutil.copytree(DEFAULT_ADAPTER_DIR, tmp / f"a{k}")
            base.load_adapter(f"a{k}", tmp / f"a{k}")
        rss_after = _rss_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    device = base.runner.device
    tol = args.tolerance if args.tolerance is not None else (1e-4 if base.runner.dtype == torch.float32 else 2e-2)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    reps = args.reps or (1 if args.quick else 3)
    adapter_bytes = sum(a.nbytes for a in base.adapters.adapters.values())
    result = {"device": str(device), "dtype": str(base.runner.dtype).replace("torch.", ""),
              "threads": torch.get_num_threads(), "threads_source": threads_source, "reps": reps,
              "git_revision": git_revision(), "torch": torch.__version__, "tolerance": tol,
              "memory": {"adapter_bytes_each": adapter_bytes // max(ADAPTER_COUNTS),
                         "adapters_loaded": max(ADAPTER_COUNTS), "adapter_bytes": adapter_bytes,
                         "rss_merged_model": rss_base, "rss_before_adapters": rss_before,
                         "rss_after_adapters": rss_after,
                         "rss_growth": (rss_after - rss_before) if rss_after and rss_before else None},
              "workloads": []}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    for wl in layout_workloads(args.quick, wanted):
        variants = {"merged": (merged, wl.requests)}
        for n in ADAPTER_COUNTS:
            routed = [dataclasses.replace(r, adapter=f"a{i % n}") for i, r in enumerate(wl.requests)]
            variants[f"{n} adapter{'s' if n > 1 else ''}"] = (base, routed)
        times: dict[str, list[float]] = {v: [] for v in variants}
        answers = {}
        names = list(variants)
        for rep in range(reps + 1):  # repetition 0 warms every variant up, untimed
            order = names[rep % len(names):] + names[:rep % len(names)]
            for v in order:
                engine, requests = variants[v]
                engine.reset_prefix_cache(keep_head=True)
                sync()
                t0 = time.perf_counter()
                decisions = engine.decide_batch(requests, on_error="raise")
                sync()
                if rep:
                    times[v].append(time.perf_counter() - t0)
                answers[v] = decisions
                print(f"bench: {wl.name} {v} rep {rep}{' (warm-up)' if not rep else ''}: "
                      f"{time.perf_counter() - t0:.2f} s", flush=True)
        decisions_n = sum(len(r.questions) for r in wl.requests)
        rows = []
        for v in names:
            median = statistics.median(times[v])
            rows.append({"variant": v, "seconds": median, "decisions_per_s": decisions_n / median,
                         "max_prob_diff_vs_merged": _max_diff(answers[v], answers["merged"]),
                         "times": times[v]})
        merged_rate = rows[0]["decisions_per_s"]
        for row in rows:
            row["ratio_to_merged"] = row["decisions_per_s"] / merged_rate
            row["ok"] = row["max_prob_diff_vs_merged"] <= tol
        result["workloads"].append({"name": wl.name, "note": wl.note, "requests": len(wl.requests),
                                    "decisions": decisions_n, "variants": rows})
    result["wall_s"] = time.perf_counter() - t_start
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md = adapters_markdown(result)
    out.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)
    bad = [(w["name"], r["variant"]) for w in result["workloads"] for r in w["variants"] if not r["ok"]]
    if bad:
        print(f"bench: answers differ from the merged model beyond {tol:g}: {bad}")
        return 1
    return 0


def adapters_markdown(result: dict) -> str:
    """The table: per workload and variant, seconds, decisions/s, ratio to merged, largest difference."""
    m = result["memory"]
    lines = [f"Device {result['device']}, {result['dtype']}, {result['threads']} threads ({result['threads_source']}); "
             f"median of {result['reps']} interleaved repetitions; git {result['git_revision']}.", "",
             "| workload | variant | s | decisions/s | vs merged | max |p - p_merged| |",
             "|---|---|---:|---:|---:|---:|"]
    for w in result["workloads"]:
        for r in w["variants"]:
            lines.append(f"| {w['name']} ({w['requests']} requests) | {r['variant']} | {r['seconds']:.2f} | "
                         f"{r['decisions_per_s']:.1f} | {r['ratio_to_merged']:.2f}x | {r['max_prob_diff_vs_merged']:.1e} |")
    mib = 2 ** 20
    growth = m["rss_growth"]
    lines += ["", f"Memory: {m['adapters_loaded']} adapters of {m['adapter_bytes_each'] / mib:.1f} MiB of factors each "
                  f"({m['adapter_bytes'] / mib:.1f} MiB); resident set grew "
                  + (f"{growth / mib:.1f} MiB" if growth is not None else "(not measured)") + " when they were loaded."]
    return "\n".join(lines) + "\n"
