#!/usr/bin/env python
"""How much a model's answers depend on option order: reversal change share and rotation flip rate.

    python scripts/order_sensitivity.py [--model SPEC] [--suites agnews,toolace,...] [--sample 40]
        [--seed 0] [--no-rotations] [--output runs/order.json]

For a fixed-seed sample of each suite's rows (the eval runner's ``sample_rows``), every choice
question with 2+ options is answered three ways by the same engine, in one process:

* ``in order``: the criteria as the suite gives them;
* ``reversed``: the same criteria in reverse order (labels keep their meaning);
* ``rotations`` (unless ``--no-rotations``): ``--debias permute``, whose ``flip_rate`` per
  question is the share of cyclic rotations whose argmax differs from the in-order argmax.

It prints, per suite: decisions, accuracy in order and reversed, the share of answers the
reversal changed, and the mean rotation flip rate. A model that reads option *content* answers
the same whatever the order (change share and flip rate near 0); one that answers by *slot*
moves its answer with the options (issue #22's targets: both <= 0.10). Score and noul questions
have no option order to permute and are not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_SUITES = "agnews,wildjailbreak,typed_decisions,toolace,jevbench_easy,jevbench_original,jevbench_hard,procedural"


def _reversed(request: dict) -> dict:
    qs = {}
    for f, q in request["questions"].items():
        q = dict(q)
        if q.get("type") == "choice" and isinstance(q.get("criteria"), dict):
            q["criteria"] = dict(reversed(list(q["criteria"].items())))
        qs[f] = q
    return {**request, "questions": qs}


def question_json(q) -> dict:
    """A parsed :class:`Question` back as a canonical question object (what the model sees)."""
    out = {"type": q.type, "instructions": q.instructions}
    if q.type == "choice":
        out["criteria"] = dict(zip(q.labels, q.descriptions))
    elif q.type == "score":
        out["criteria"] = {label: desc for label, desc in zip(q.labels, q.descriptions)}
    elif any(q.descriptions):
        no, yes = q.descriptions
        out["criteria"] = {"false": no, "true": yes}
    return out


def _choice_fields(rec) -> list[str]:
    return [q.field for q in rec.request.questions if q.type == "choice" and q.num_candidates >= 2
            and rec.targets.get(q.field) is not None and rec.targets[q.field].label is not None]


def measure(engine, permute_engine, records, progress: bool = False) -> dict:
    """Per-suite order statistics for ``records`` (parsed :class:`Record` objects)."""
    requests = [{"state": r.request.state, "questions": {q.field: question_json(q) for q in r.request.questions},
                 **({"images": list(r.request.images)} if r.request.images else {})} for r in records]
    t0 = time.perf_counter()
    fwd = engine.decide_batch(requests)
    rev = engine.decide_batch([_reversed(q) for q in requests])
    rot = permute_engine.decide_batch(requests) if permute_engine is not None else None
    n = right = right_rev = changed = errors = 0
    flips = []
    for i, rec in enumerate(records):
        if fwd[i].error or rev[i].error or (rot is not None and rot[i].error):
            errors += 1
            continue
        for f in _choice_fields(rec):
            gold = rec.targets[f].label
            a, b = fwd[i].answers[f].label, rev[i].answers[f].label
            n += 1
            right += a == gold
            right_rev += b == gold
            changed += a != b
            if rot is not None and rot[i].answers[f].flip_rate is not None:
                flips.append(rot[i].answers[f].flip_rate)
    return {"choice_decisions": n, "request_errors": errors,
            "accuracy_in_order": right / n if n else None, "accuracy_reversed": right_rev / n if n else None,
            "reversal_change_share": changed / n if n else None,
            "rotation_flip_rate": sum(flips) / len(flips) if flips else None,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model spec (default: the embedded default decision model)")
    ap.add_argument("--suites", default=DEFAULT_SUITES)
    ap.add_argument("--sample", type=int, default=40, help="rows per suite (fixed-seed sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-rotations", action="store_true", help="skip the permute-debiasing flip rate")
    ap.add_argument("--output", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    from noulengine import Engine
    from noulengine.eval.suites import get_suite, sample_rows

    engine = Engine.from_pretrained(args.model)
    permute = None if args.no_rotations else Engine.from_pretrained(args.model, debias="permute")
    results = {}
    for name in args.suites.split(","):
        rows = sample_rows(get_suite(name).load(), args.sample, seed=args.seed)
        recs = [r for _, r in rows if _choice_fields(r)]
        results[name] = measure(engine, permute, recs)
        print(json.dumps({name: results[name]}), flush=True)
    print("\n| suite | choice decisions | accuracy in order | reversed | changed by reversal | rotation flip rate |")
    print("|---|---:|---:|---:|---:|---:|")
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    for name, r in results.items():
        print(f"| {name} | {r['choice_decisions']} | {fmt(r['accuracy_in_order'])} | {fmt(r['accuracy_reversed'])} | "
              f"{fmt(r['reversal_change_share'])} | {fmt(r['rotation_flip_rate'])} |")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"model": args.model or "default", "sample": args.sample,
                                                 "seed": args.seed, "suites": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
