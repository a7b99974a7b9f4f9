"""Selection metrics during training: how the model answers held-out ``selection`` rows.

Run through the real :class:`~noulengine.engine.engine.Engine` (the same compiler, masks and
readout as serving). Metrics per decision: accuracy, NLL (p floored at 1e-12), Brier (sum of
squares), ECE (15 equal-width bins, max-p confidence) and the median candidate mass ``x_mass``.
"""

from __future__ import annotations

import math
import statistics

import torch

from noulengine.metrics.calibration import expected_calibration_error
from noulengine.metrics.functional import PROB_FLOOR, binary_auc


def decide_rows(engine, rows) -> list:
    """``engine``'s decisions for ``rows`` (:class:`~noulengine.train.data.TrainRow`), in order: what
    :func:`selection_metrics` and :func:`selection_by_kind` score, computed once when both want them."""
    return engine.decide_batch([r.record.request for r in rows], on_error="raise")


def selection_metrics(engine, rows, *, debias: str = "none", decisions: list | None = None) -> dict:
    """Score ``rows`` (:class:`~noulengine.train.data.TrainRow`) with ``engine``, or score the
    given ``decisions`` (:func:`decide_rows` of the same engine and rows) without a forward pass.

    Returns:
        ``{"decisions", "accuracy", "nll", "brier", "ece", "x_mass_median"}``, plus
        ``"flip_rate"`` (mean over choice questions) when ``debias == "permute"``, and
        ``"yes_auc"`` (ROC AUC of P(yes) against gold yes,
        :func:`~noulengine.metrics.functional.binary_auc`) when the rows hold yes/no questions with
        both answers among their golds.
    """
    if decisions is None:
        decisions = decide_rows(engine, rows)
    if len(decisions) != len(rows):
        raise ValueError(f"{len(decisions)} decisions for {len(rows)} rows")
    conf, correct, nlls, briers, masses, flips, yes = [], [], [], [], [], [], []
    for row, dec in zip(rows, decisions):
        for q, gold in zip(row.record.request.questions, row.gold):
            if gold is None:
                continue
            ans = dec.answers[q.field]
            p = ans.probabilities
            conf.append(ans.confidence)
            correct.append(float(ans.label == gold))
            nlls.append(-math.log(max(p[gold], PROB_FLOOR)))
            briers.append(sum((v - (lab == gold)) ** 2 for lab, v in p.items()))
            masses.append(ans.x_mass)
            if q.type == "noul":
                yes.append((p["yes"], gold == "yes"))
            if ans.flip_rate is not None:
                flips.append(ans.flip_rate)
    n = len(conf)
    if n == 0:
        return {"decisions": 0}
    out = {"decisions": n, "accuracy": sum(correct) / n, "nll": sum(nlls) / n, "brier": sum(briers) / n,
           "ece": float(expected_calibration_error(torch.tensor(conf), torch.tensor(correct))),
           "x_mass_median": statistics.median(masses)}
    if yes and any(g for _, g in yes) and not all(g for _, g in yes):
        out["yes_auc"] = float(binary_auc(torch.tensor([v for v, _ in yes], dtype=torch.float64),
                                          torch.tensor([g for _, g in yes])))
    if debias == "permute":
        out["flip_rate"] = sum(flips) / len(flips) if flips else None
    return out


def selection_by_kind(engine, rows, *, decisions: list | None = None) -> dict:
    """Selection metrics per kind (a row's ``category``, else ``uncategorized``) and overall: one
    learning-curve point. Returns ``{"all": {decisions, accuracy, nll, brier}, "kinds": {kind:
    metrics}}`` (metrics as :func:`selection_metrics`, so a yes/no kind carries ``yes_auc``).
    ``decisions``: :func:`decide_rows` of the same engine and rows (no second forward pass)."""
    if decisions is None:
        decisions = decide_rows(engine, rows)
    groups: dict[str, tuple[list, list]] = {}
    for r, d in zip(rows, decisions, strict=True):
        g = groups.setdefault(r.record.category or "uncategorized", ([], []))
        g[0].append(r)
        g[1].append(d)
    kinds = {k: selection_metrics(engine, g, decisions=d) for k, (g, d) in sorted(groups.items())}
    # each row is scored once: the overall numbers are the kinds' weighted by decisions (ECE does
    # not add up that way and is left out of "all")
    n = sum(m["decisions"] for m in kinds.values())
    overall = {"decisions": n}
    if n:
        for key in ("accuracy", "nll", "brier"):
            overall[key] = sum(m[key] * m["decisions"] for m in kinds.values() if m["decisions"]) / n
    return {"all": overall, "kinds": kinds}
