#!/usr/bin/env python
"""Experiment behind docs/evaluation.md#noulenginedistributeddecide_datasetds-config---a-dataset-of-index-decision-json ("noulengine.distributed.decide_dataset(ds, config) -> a Dataset of "index", "decision" (JSON)"); reproduce: `python experiments/bench_ray.py --rows 96`.

Ray Data scaling on this machine: the local engine vs 1 and 2 Ray actors, one run.

The same AG News test rows (``random.Random(0)`` shuffle, first ``--rows``) answered by the
embedded default model three ways, each timed end to end (wall seconds of the whole call):

* ``local``: ``Engine.decide_batch`` in this process (``--threads`` torch threads);
* ``ray-1``: one actor with ``--threads`` CPUs;
* ``ray-2``: two actors with ``--threads / 2`` CPUs each.

Each ``decide_requests`` call starts its own actor pool, so a Ray variant's wall time includes
starting its actors and loading one model copy per actor; ``actor_start_s`` measures that apart
(the same call on 2 rows per actor) and ``steady`` subtracts it.
Answers are compared to the local run (argmax agreement, max |Δp|). Prints a table and ratios.

    python experiments/bench_ray.py --rows 96
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="requests per actor call")
    p.add_argument("--output", default="bench-results/ray_scaling.json")
    args = p.parse_args()

    import ray
    import torch

    from noulengine import Engine
    from noulengine.distributed import RayConfig, decide_requests
    from noulengine.eval.suites import get_suite

    rows = get_suite("agnews").load()
    random.Random(0).shuffle(rows)
    requests = [rec.request for _, rec in rows[:args.rows]]
    results = {}

    torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained()
    engine.decide_batch(requests[:2])  # warm-up
    t = time.perf_counter()
    local = [d.to_dict() for d in engine.decide_batch(requests)]
    results["local"] = {"wall_s": time.perf_counter() - t, "actor_start_s": 0.0}
    del engine

    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    answers = {}
    for name, actors in (("ray-1", 1), ("ray-2", 2)):
        cfg = RayConfig(actors=actors, num_cpus=args.threads / actors, batch_size=args.batch_size)
        t = time.perf_counter()
        decide_requests(requests[:actors * 2], cfg)  # actor start + model load + 2 rows per actor
        start = time.perf_counter() - t
        t = time.perf_counter()
        answers[name] = decide_requests(requests, cfg)
        results[name] = {"wall_s": time.perf_counter() - t, "actor_start_s": start}
    ray.shutdown()

    decisions = len(requests)
    print(f"{decisions} AG News rows, default model, float32, {args.threads} CPU threads in all")
    print("| variant | wall s | actor start s | steady s | decisions/s (wall) | decisions/s (steady) | "
          "steady vs local | argmax agree | max |dp| |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = results["local"]["wall_s"]
    for name, r in results.items():
        got = local if name == "local" else answers[name]
        agree = sum(a["answers"]["decision"]["label"] == b["answers"]["decision"]["label"] for a, b in zip(got, local))
        dp = max(abs(a["answers"]["decision"]["probabilities"][k] - b["answers"]["decision"]["probabilities"][k])
                 for a, b in zip(got, local) for k in a["answers"]["decision"]["probabilities"])
        # every decide_requests call starts its own actor pool: the timed call pays the start again
        steady = max(r["wall_s"] - r["actor_start_s"], 1e-9)
        r.update({"steady_s": steady, "decisions_per_s": decisions / r["wall_s"],
                  "steady_decisions_per_s": decisions / steady, "steady_ratio_vs_local": base / steady,
                  "argmax_agree": agree, "max_abs_dp": dp})
        print(f"| {name} | {r['wall_s']:.1f} | {r['actor_start_s']:.1f} | {steady:.1f} | {r['decisions_per_s']:.2f} | "
              f"{r['steady_decisions_per_s']:.2f} | {r['steady_ratio_vs_local']:.2f}x | {agree}/{decisions} | {dp:.1e} |")
    for key in ("decisions_per_s", "steady_decisions_per_s"):
        print(f"ray-2 / ray-1 {key}: {results['ray-2'][key] / results['ray-1'][key]:.2f}x")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": decisions, "threads": args.threads, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
