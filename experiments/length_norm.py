"""Experiment behind docs/training.md#length-normalisation-label-sequence ("Length normalisation (`label-sequence`)"); reproduce: `python experiments/length_norm.py --suite agnews,typed_decisions --rows 5`.

Label-sequence readout: summed log-likelihood against the per-token mean, on the same rows.

Under ``label-sequence`` a candidate's score is the log-likelihood of its text plus the
end-of-answer token, so a long label pays for every token. This script reads N rows of each
suite once with the label-sequence readout and scores every question both ways from the same
forward pass (:func:`noulengine.engine.readout.batch_candidate_logprobs`, ``length_norm``
false / true: each spelling's summed log-probability, or that sum divided by its token count,
the spellings then log-sum-exp'ed), and prints accuracy, NLL of the softmax over the candidates
and the number of changed argmaxes for both. No training; the engine's served answers use the
sum (checked against ``Engine.decide_batch`` on the first batch).

    python experiments/length_norm.py                                   # default model, 20 rows of agnews
    python experiments/length_norm.py --suite agnews,typed_decisions --rows 5 [--model PATH] [--seed S] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from noulengine import Engine  # noqa: E402
from noulengine.engine.batching import collate, plan_batches  # noqa: E402
from noulengine.engine.readout import batch_candidate_logprobs  # noqa: E402
from noulengine.eval.suites import get_suite, sample_rows  # noqa: E402

NORMS = ("sum", "mean")


def score_suite(engine: Engine, records, *, batch_tokens: int, check: bool = True) -> dict:
    """Both scores of every labelled question of ``records``; returns per-norm metrics."""
    compiled = [engine.compile(rec.request) for rec in records]
    stats = {n: {"correct": 0, "nll": 0.0} for n in NORMS}
    questions = changed = 0
    label_tokens = []
    for b, indices in enumerate(plan_batches([c.input_tokens for c in compiled], batch_tokens=batch_tokens,
                                             max_batch_size=engine.config.max_batch_size)):
        batch = collate(compiled, indices, pad_id=engine.pad_id)
        with torch.inference_mode():
            hidden = engine.runner.hidden_states(batch)
            per = {n: batch_candidate_logprobs(hidden, engine.runner.head, compiled, indices, length_norm=n == "mean")
                   for n in NORMS}
        if check and b == 0:  # the summed scores are what the engine serves
            served = engine.decide_batch([records[i].request for i in indices], on_error="raise")
            for row, d in enumerate(served):
                for plan, lp in zip(compiled[indices[row]].questions, per["sum"][row]):
                    got = torch.tensor(d.answers[plan.field].logprobs, dtype=torch.float64)
                    assert torch.allclose(got, lp[0], atol=1e-3), (plan.field, got, lp[0])
        for row, idx in enumerate(indices):
            rec = records[idx]
            for j, plan in enumerate(compiled[idx].questions):
                target = rec.targets.get(plan.field)
                if target is None or target.label is None:
                    continue
                gold = plan.labels.index(target.label)
                questions += 1
                picks = {}
                for n in NORMS:
                    logp = torch.log_softmax(per[n][row][j][0], 0)
                    picks[n] = int(torch.argmax(logp))
                    stats[n]["correct"] += int(picks[n] == gold)
                    stats[n]["nll"] -= max(float(logp[gold]), math.log(1e-12))
                changed += int(picks["sum"] != picks["mean"])
                if plan.mode == "label-sequence":  # tokens per alternative (text + end token)
                    counts = [0] * len(plan.alt_vc)
                    for a in plan.term_alt:
                        counts[a] += 1
                    label_tokens += counts
    out = {"questions": questions, "changed_argmax": changed,
           "label_tokens": {"min": min(label_tokens), "max": max(label_tokens),
                            "mean": round(sum(label_tokens) / len(label_tokens), 2)} if label_tokens else None}
    for n in NORMS:
        out[n] = {"accuracy": stats[n]["correct"] / questions if questions else None,
                  "nll": stats[n]["nll"] / questions if questions else None}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="anything Engine.from_pretrained takes (default: the embedded default)")
    ap.add_argument("--suite", default="agnews", help="comma-separated suite names (default agnews)")
    ap.add_argument("--rows", type=int, default=20, help="rows per suite: a fixed-seed sample (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    engine = Engine.from_pretrained(args.model, device=args.device, readout="label-sequence", calibration="none",
                                    prefix_cache_mb=0)
    results = {"model": args.model or "default", "identity": engine.describe().get("model"), "rows": args.rows,
               "seed": args.seed, "readout": "label-sequence", "suites": {}}
    print("| suite | questions | sum: accuracy | mean: accuracy | sum: NLL | mean: NLL | changed argmax | "
          "label tokens (min/mean/max) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name in args.suite.split(","):
        rows = sample_rows(get_suite(name).load(), args.rows, seed=args.seed)
        r = score_suite(engine, [rec for _, rec in rows], batch_tokens=args.batch_tokens)
        results["suites"][name] = r
        lt = r["label_tokens"]
        lt_s = f"{lt['min']}/{lt['mean']}/{lt['max']}" if lt else "n/a"
        print(f"| {name} | {r['questions']} | {100 * r['sum']['accuracy']:.1f}% | {100 * r['mean']['accuracy']:.1f}% | "
              f"{r['sum']['nll']:.3f} | {r['mean']['nll']:.3f} | {r['changed_argmax']} | {lt_s} |", flush=True)
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"\n{args.rows} rows per suite (seed {args.seed}), label-sequence readout, no temperature; "
          f"{results['wall_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
