#!/usr/bin/env python
"""Experiment behind docs/performance.md#how-to-measure ("How to measure"); reproduce: `python experiments/threads_timing.py --settings default,1,2 --reps 5`.

Time ``Engine.decide`` of the README example under several torch thread settings (issue #25, item 7).

Each setting runs in its own process (torch's thread pool is set once per process): ``default``
(neither NOULENGINE_THREADS nor OMP_NUM_THREADS set: torch's own choice, what the Python engine
keeps), then ``NOULENGINE_THREADS=N`` for each N. Each process loads the default model, answers
the request once untimed, then ``--reps`` timed times. ``--rounds`` repeats the cycle so that a
change in the machine's load hits every setting alike. The 1-minute load average is printed
before and after each process: the numbers only mean something next to it.

    .venv/bin/python experiments/threads_timing.py                      # default, 1, 2 threads; 5 reps; 2 rounds
    .venv/bin/python experiments/threads_timing.py --settings default,1,2,4 --reps 10 --json out.json
    .venv/bin/python experiments/threads_timing.py --dry-run             # the commands, nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REQUEST = {  # the README's Python example
    "state": {"ticket": "My card was charged twice for order 4471."},
    "questions": {
        "route": {"type": "choice", "instructions": "Which team handles this?",
                  "criteria": {"billing": "Payments and refunds", "shipping": "Delivery problems",
                               "tech": "Website or app errors"}},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    },
}


def child(reps: int, model: str | None) -> None:
    import torch

    from noulengine import Engine

    engine = Engine.from_pretrained(model)
    engine.decide(REQUEST)  # untimed: first-call set-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        engine.decide(REQUEST)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"threads": torch.get_num_threads(), "times_s": times}))


def _env(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NOULENGINE_THREADS", "OMP_NUM_THREADS")}
    if setting != "default":
        env["NOULENGINE_THREADS"] = setting
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default="default,1,2", help="comma-separated: default and/or thread counts")
    ap.add_argument("--reps", type=int, default=5, help="timed decides per process (default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="times the whole cycle of settings runs (default 2)")
    ap.add_argument("--model", default=None, help="model (default: the embedded default decision model)")
    ap.add_argument("--json", help="also write every time to this JSON file")
    ap.add_argument("--dry-run", action="store_true", help="print each setting's command and exit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.reps, args.model)
        return 0
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in settings:
        if s != "default" and not (s.isdigit() and int(s) >= 1):
            ap.error(f"--settings: {s!r} is neither 'default' nor a positive integer")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--reps", str(args.reps)]
    if args.model:
        cmd += ["--model", args.model]
    if args.dry_run:
        for s in settings:
            prefix = "" if s == "default" else f"NOULENGINE_THREADS={s} "
            print(f"{s}: {prefix}{' '.join(cmd)}")
        return 0
    times: dict[str, list[float]] = {s: [] for s in settings}
    threads: dict[str, int] = {}
    for r in range(args.rounds):
        for s in settings:
            load0 = os.getloadavg()[0]
            out = subprocess.run(cmd, env=_env(s), capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            res = json.loads(out.stdout.strip().splitlines()[-1])
            threads[s] = res["threads"]
            times[s] += res["times_s"]
            print(f"round {r + 1}, {s}: torch threads {res['threads']}, decide "
                  + ", ".join(f"{t:.2f}" for t in res["times_s"]) + f" s (load {load0:.1f} -> {os.getloadavg()[0]:.1f})",
                  flush=True)
    print(f"\n{'setting':>8}  {'threads':>7}  {'median s':>8}  {'min s':>6}  {'max s':>6}  n")
    for s in settings:
        t = times[s]
        print(f"{s:>8}  {threads[s]:>7}  {statistics.median(t):8.2f}  {min(t):6.2f}  {max(t):6.2f}  {len(t)}")
    print(f"cores: {os.cpu_count()}; load average now {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "threads": threads, "times_s": times, "reps": args.reps,
                       "rounds": args.rounds, "cpu_count": os.cpu_count()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
