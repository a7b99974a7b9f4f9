"""Before/after scores of a set of :class:`~noulengine.calibrate.collect.Item` under temperatures.

Metrics (all over hard gold labels, float64): mean NLL (nats), multiclass Brier, 15-bin ECE with
confidence = max p (Guo et al. 2017), accuracy; the functions are those of
:mod:`noulengine.metrics`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from noulengine.metrics import functional as F
from noulengine.metrics.calibration import expected_calibration_error


def probabilities(items: Sequence, temperature_of: Callable[[object], float]) -> torch.Tensor:
    """``(N, K_max)`` float64: ``softmax(logits / T)`` per item, zero-padded on the right."""
    k = max(it.num_candidates for it in items)
    out = torch.zeros(len(items), k, dtype=torch.float64)
    for i, it in enumerate(items):
        out[i, : it.num_candidates] = torch.softmax(it.logits / temperature_of(it), dim=0)
    return out


def argmax(items: Sequence) -> torch.Tensor:
    """``(N,)`` int64 argmax of the raw logits (first maximum wins), padding excluded."""
    return torch.tensor([int(torch.argmax(it.logits)) for it in items], dtype=torch.int64)


def score_items(items: Sequence, temperature_of: Callable[[object], float]) -> dict | None:
    """``{"n", "nll", "brier", "ece", "accuracy", "mean_confidence"}`` (None for no items)."""
    if not items:
        return None
    p = probabilities(items, temperature_of)
    y = torch.tensor([it.gold for it in items], dtype=torch.int64)
    conf, pred = p.max(dim=1)
    correct = (pred == y).to(torch.float64)
    return {"n": len(items), "nll": float(F.nll(p, y)), "brier": float(F.brier(p, y)),
            "ece": float(expected_calibration_error(conf, correct)), "accuracy": float(F.accuracy(p, y)),
            "mean_confidence": float(conf.mean())}


def reliability_inputs(items: Sequence, temperature_of) -> tuple[torch.Tensor, torch.Tensor]:
    """``(confidences, correct)`` for :func:`noulengine.metrics.reliability.plot_reliability`."""
    p = probabilities(items, temperature_of)
    y = torch.tensor([it.gold for it in items], dtype=torch.int64)
    conf, pred = p.max(dim=1)
    return conf, (pred == y).to(torch.float64)
