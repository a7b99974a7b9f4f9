"""Known-distribution pilot scorer (suite ``known-distribution-pilot``), by the pilot's own contract.

Source of the contract: ``shared/data/known_distribution_pilot/SOURCE.md`` (which quotes the
upstream ``docs/CALIBRATION_BENCHMARK.md``). For case ``i`` let ``p`` be the model's normalised
distribution over the listed outcomes and ``q`` the exact reference distribution:

* TVD = ``0.5 * sum_k |p_k - q_k|``;
* excess expected Brier = ``sum_k (p_k - q_k)^2`` (0 is optimal);
* expected multiclass Brier = ``sum_k (p_k - q_k)^2 + 1 - sum_k q_k^2`` (includes irreducible randomness);
* impossible-outcome mass = ``sum_{k: q_k = 0} p_k``, averaged only over cases that have an impossible option;
* expected ECE, pooled over all cases, by the scorer's own ECE
  (:func:`noulengine.metrics.calibration.expected_calibration_error`: 15 equal-width bins
  ``[0, 1/15], (1/15, 2/15], ..., (14/15, 1]``, the evaluation protocol's; the upstream contract
  asks for 10 left-closed bins, which this project does not use, so that there is one ECE):
  confidence is ``max p`` (as in the scorer; an answer's own ``confidence`` is not used); the
  "correctness" is ``q_{k*}``, the reference probability of the model's argmax ``k*`` (ties
  broken by the lexicographically smallest label), not a sampled 0/1 outcome;
* option-order sensitivity: mean TVD between the paired ``canonical`` and ``reversed_options``
  answers of a group, aligned by outcome label; plus the share of pairs whose argmax label differs.

There is no hard-label accuracy: the pilot's questions ask for random outcomes. Overall Brier/TVD
are means over valid cases; overall ECE pools every case (not a mean of category ECEs). Answers
that are missing or invalid (non-finite, outside ``[0, 1]``, wrong labels, sum farther than 0.02
from 1) are excluded and lower ``coverage``; they are never replaced. The pilot is evaluation
only: fit nothing (not even temperatures) on it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from noulengine.metrics.calibration import N_BINS, calibration_bins, expected_calibration_error

SUITE = "known-distribution-pilot"
SUM_TOLERANCE = 0.02
FIELD = "decision"


def _answer_dict(decision: Any, fld: str) -> tuple[dict | None, str | None]:
    """``(answer dict, error)`` from an engine Decision or its ``to_dict()`` form."""
    if decision is None:
        return None, "missing"
    if not isinstance(decision, dict):
        decision = decision.to_dict()
    if decision.get("error"):
        return None, "request_error"
    ans = (decision.get("answers") or {}).get(fld)
    if ans is None:
        return None, "missing_answer"
    return ans, None


def _probs(ans: dict, labels: Sequence[str]) -> tuple[list[float] | None, str | None]:
    raw = ans.get("probabilities")
    if not isinstance(raw, dict) or set(raw) != set(labels):
        return None, "labels_mismatch"
    vals = []
    for lab in labels:
        v = raw[lab]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
            return None, "invalid_probability"
        vals.append(float(v))
    total = math.fsum(vals)
    if abs(total - 1.0) > SUM_TOLERANCE:
        return None, "bad_sum"
    return [v / total for v in vals], None


def argmax_label(labels: Sequence[str], p: Sequence[float]) -> int:
    """Index of the most probable label; ties go to the lexicographically smallest label."""
    top = max(p)
    return min((lab, k) for k, (lab, v) in enumerate(zip(labels, p)) if v == top)[1]


def expected_ece(confidences: Sequence[float], expected_correct: Sequence[float], n_bins: int = N_BINS) -> dict:
    """Pooled ECE ``sum_b |B|/N * |mean conf - mean q_{k*}|`` and the per-bin table, by the
    scorer's :func:`~noulengine.metrics.calibration.expected_calibration_error` (its bins, with
    ``q_{k*}`` as expected correctness); ``ece`` is None when there is no case."""
    edges = [i / n_bins for i in range(n_bins + 1)]
    names = [f"{'[' if i == 0 else '('}{edges[i]:.3f},{edges[i + 1]:.3f}]" for i in range(n_bins)]
    if not confidences:
        return {"ece": None, "bins": [{"bin": b, "n": 0, "mean_confidence": None, "mean_expected_correct": None}
                                      for b in names]}
    conf, correct = list(confidences), list(expected_correct)
    ece = float(expected_calibration_error(conf, correct, n_bins, expected=True).item())
    bins = calibration_bins(conf, correct, n_bins, expected=True)
    table = []
    for name, k, c, q in zip(names, bins.counts.tolist(), bins.confidence_sum.tolist(), bins.correct.tolist()):
        table.append({"bin": name, "n": int(k), "mean_confidence": c / k if k else None,
                      "mean_expected_correct": q / k if k else None})
    return {"ece": ece, "bins": table}


def case_scores(labels: Sequence[str], p: Sequence[float], q: Sequence[float]) -> dict:
    """The per-case quantities for one valid answer (see the module docstring)."""
    sq = math.fsum((a - b) ** 2 for a, b in zip(p, q))
    k = argmax_label(labels, p)
    impossible = [a for a, b in zip(p, q) if b == 0.0]
    conf = max(p)
    return {"tvd": 0.5 * math.fsum(abs(a - b) for a, b in zip(p, q)), "excess_brier": sq,
            "expected_brier": sq + 1.0 - math.fsum(b * b for b in q),
            "impossible_mass": math.fsum(impossible) if impossible else None,
            "argmax": labels[k], "confidence": conf, "expected_correct": q[k]}


def _mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def _summary(cases: list[dict], total: int) -> dict:
    valid = [c for c in cases if c["valid"]]
    imp = [c["impossible_mass"] for c in valid if c["impossible_mass"] is not None]
    ece = expected_ece([c["confidence"] for c in valid], [c["expected_correct"] for c in valid])
    return {"n": total, "valid": len(valid), "coverage": len(valid) / total if total else None,
            "tvd": _mean([c["tvd"] for c in valid]), "excess_brier": _mean([c["excess_brier"] for c in valid]),
            "expected_brier": _mean([c["expected_brier"] for c in valid]),
            "impossible_mass": _mean(imp), "impossible_cases": len(imp), "expected_ece": ece["ece"],
            "ece_n_bins": N_BINS}


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def score_pilot(rows, decisions, *, field: str = FIELD) -> dict:
    """Score answers on the pilot by its contract.

    Args:
        rows: ``[(row_index, Record)]`` from ``get_suite("known-distribution-pilot").load()``
            (or bare Records); each record's ``targets[field].probabilities`` is the reference and
            its metadata ``group``/``variant`` pair the option orders.
        decisions: one engine :class:`~noulengine.engine.decision.Decision` (or its ``to_dict()``,
            or None when missing) per row, in the same order.
        field: the question field scored.

    Returns:
        A JSON-able dict: ``overall`` (n, valid, coverage, tvd, excess_brier, expected_brier,
        impossible_mass, impossible_cases, expected_ece, ece_n_bins = 15), ``ece_bins`` (the
        per-bin table), ``by_category``, ``by_variant``, ``option_order`` (pairs, mean_tvd,
        argmax_disagreement) and ``cases``.

    Raises:
        ValueError: ``rows`` and ``decisions`` differ in length, or a row has no reference distribution.
    """
    rows = [r[1] if isinstance(r, tuple) else r for r in rows]
    decisions = list(decisions)
    if len(rows) != len(decisions):
        raise ValueError(f"rows and decisions must align: {len(rows)} rows, {len(decisions)} decisions")
    cases = []
    for rec, dec in zip(rows, decisions):
        q_obj = next(q for q in rec.request.questions if q.field == field)
        target = rec.targets.get(field)
        if target is None or target.probabilities is None:
            raise ValueError(f"record {rec.id!r}: no reference distribution for field {field!r}")
        labels = list(q_obj.labels)
        q = [float(target.probabilities[lab]) for lab in labels]
        case = {"id": rec.id, "category": rec.category, "group": rec.metadata.get("group"),
                "variant": rec.metadata.get("variant"), "valid": False, "error": None}
        ans, err = _answer_dict(dec, field)
        p = None
        if ans is not None:
            p, err = _probs(ans, labels)
        if p is None:
            case["error"] = err
        else:
            case.update(valid=True, probabilities=dict(zip(labels, p)), **case_scores(labels, p, q))
        cases.append(case)
    out = {"suite": SUITE, "overall": _summary(cases, len(cases))}
    valid = [c for c in cases if c["valid"]]
    out["ece_bins"] = expected_ece([c["confidence"] for c in valid], [c["expected_correct"] for c in valid])["bins"]
    for dim, key in (("by_category", "category"), ("by_variant", "variant")):
        groups: dict[str, list[dict]] = {}
        for c in cases:
            groups.setdefault(str(c[key]), []).append(c)
        out[dim] = {k: _summary(v, len(v)) for k, v in sorted(groups.items())}
    out["option_order"] = option_order_sensitivity(cases)
    out["cases"] = cases
    out["notes"] = ["no hard-label accuracy: the questions ask for random outcomes",
                    "evaluation only: fit nothing on these references",
                    "canonical/reversed variants are paired, not independent (48 groups)",
                    "licence: no licence stated (internal evaluation only)"]
    return out


def option_order_sensitivity(cases: list[dict]) -> dict:
    """Mean label-aligned TVD and argmax disagreement between canonical and reversed answers."""
    pairs: dict[str, dict[str, dict]] = {}
    for c in cases:
        if c["valid"] and c["group"] is not None:
            pairs.setdefault(c["group"], {})[c["variant"]] = c
    tvds, flips = [], []
    for g in pairs.values():
        a, b = g.get("canonical"), g.get("reversed_options")
        if a is None or b is None:
            continue
        pa, pb = a["probabilities"], b["probabilities"]
        tvds.append(0.5 * math.fsum(abs(pa[k] - pb[k]) for k in pa))
        flips.append(float(a["argmax"] != b["argmax"]))
    return {"pairs": len(tvds), "mean_tvd": _mean(tvds), "argmax_disagreement": _mean(flips)}


def run_pilot(engine, rows) -> list:
    """Answer the pilot's requests (only ``state`` and ``questions`` reach the engine)."""
    return engine.decide_batch([rec.request for _, rec in rows], on_error="record")


def main(argv: list[str] | None = None) -> int:
    """``python -m noulengine.eval.pilot [engine flags] [--output metrics.json] [--answers answers.jsonl]``."""
    from noulengine.cli import add_engine_args, engine_from_args
    from noulengine.eval.suites import get_suite

    ap = argparse.ArgumentParser(prog="python -m noulengine.eval.pilot",
                                 description="Run and score the known-distribution pilot (96 choice questions).")
    ap.add_argument("--output", help="write the metrics JSON here")
    ap.add_argument("--answers", help="write the engine answers (JSONL) here")
    ap.add_argument("--source", help="raw data root (default: $NOULENGINE_DATA, else <repo>/../shared/data)")
    add_engine_args(ap)
    args = ap.parse_args(argv)
    suite = get_suite(SUITE)
    rows = suite.load(source=args.source)
    engine = engine_from_args(args)
    decisions = run_pilot(engine, rows)
    report = score_pilot(rows, decisions)
    report["engine"] = {"model": (engine.identity.to_dict() if engine.identity else None),
                        "readout": engine.config.readout, "debias": engine.config.debias,
                        "calibration": engine.config.calibration}
    o = report["overall"]
    oo = report["option_order"]
    print(f"pilot readout={engine.config.readout} debias={engine.config.debias} calibration={engine.config.calibration}")
    print(f"  valid {o['valid']}/{o['n']}  TVD {o['tvd']:.4f}  excess Brier {o['excess_brier']:.4f}  "
          f"expected Brier {o['expected_brier']:.4f}  impossible mass {o['impossible_mass']:.4f} "
          f"({o['impossible_cases']} cases)  expected ECE({N_BINS}) {_num(o['expected_ece'])}")
    print(f"  option order: {oo['pairs']} pairs, mean TVD {oo['mean_tvd']:.4f}, argmax disagreement "
          f"{oo['argmax_disagreement']:.4f}")
    for cat, s in report["by_category"].items():
        print(f"  {cat:<16} TVD {s['tvd']:.4f}  expected Brier {s['expected_brier']:.4f}  ECE {_num(s['expected_ece'])}")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.answers:
        with open(args.answers, "w", encoding="utf-8") as fh:
            for (_, rec), d in zip(rows, decisions):
                fh.write(json.dumps(d.to_dict()) + "\n")
    return 0 if o["valid"] == o["n"] else 1


if __name__ == "__main__":
    sys.exit(main())
