"""Predicted-label share against gold share per candidate slot.

A slot is a candidate's index ``0..K-1`` in criteria order. Comparing how often a model predicts
each slot with how often gold has it exposes position bias (always the first option, never the
last level). A slot the model never predicts while gold has it is flagged ``never_predicted``.
"""

from __future__ import annotations

import torch


def slot_shares(predicted, target, num_slots: int | None = None) -> list[dict]:
    """Per-slot predicted and gold counts and shares.

    Args:
        predicted: ``(N,)`` int predicted slot indices (argmax).
        target: ``(N,)`` int gold slot indices.
        num_slots: slots to report (default: one past the largest index seen).

    Returns:
        One JSON-able dict per slot: ``slot``, ``predicted`` and ``gold`` counts,
        ``predicted_share`` and ``gold_share`` (floats, over N rows), ``difference``
        (predicted - gold share) and ``flags`` (``["never_predicted"]`` or empty).

    Raises:
        ValueError: shapes differ, negative indices, or an index at or past ``num_slots``.
    """
    pred = torch.as_tensor(predicted).to(torch.int64)
    gold = torch.as_tensor(target).to(torch.int64)
    if pred.ndim != 1 or pred.shape != gold.shape:
        raise ValueError(f"predicted and target must both have shape (N,), got {tuple(pred.shape)} and {tuple(gold.shape)}")
    n = pred.shape[0]
    if n == 0:
        return []
    if int(torch.minimum(pred.min(), gold.min())) < 0:
        raise ValueError("slot indices must be non-negative")
    seen = int(torch.maximum(pred.max(), gold.max())) + 1
    k = seen if num_slots is None else num_slots
    if seen > k:
        raise ValueError(f"slot index {seen - 1} is past num_slots={k}")
    pc = torch.bincount(pred, minlength=k).to(torch.float64)
    gc = torch.bincount(gold, minlength=k).to(torch.float64)
    out = []
    for j, (a, b) in enumerate(zip(pc.tolist(), gc.tolist())):
        out.append({
            "slot": j,
            "predicted": int(a),
            "gold": int(b),
            "predicted_share": a / n,
            "gold_share": b / n,
            "difference": (a - b) / n,
            "flags": ["never_predicted"] if a == 0 and b > 0 else [],
        })
    return out
