"""Run the engine over validation rows and keep, per labelled field, its logits and gold index."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from noulengine.records.schema import Record


@dataclass
class Item:
    """One labelled decision of a validation row.

    Attributes:
        source: the validation file's stem (e.g. ``"agnews"``).
        record_id, field, type: where it comes from.
        logits: ``(K,)`` float64 CPU tensor, ``Answer.logprobs`` (the engine's logits before
            temperature, after view averaging and any contextual prior).
        gold: gold candidate index in ``[0, K)``.
    """

    source: str
    record_id: str
    field: str
    type: str
    logits: torch.Tensor
    gold: int

    @property
    def num_candidates(self) -> int:
        return int(self.logits.shape[0])


def collect(engine, rows: list[tuple[str, Record]], *, chunk: int = 64, progress=None) -> tuple[list[Item], list[dict]]:
    """Answer ``rows`` with ``engine`` and return ``(items, errors)``.

    Only ``record.request`` (state, questions, images) reaches the engine. Fields without a hard
    gold label are skipped. A request the engine refuses is listed in ``errors`` as
    ``{"id", "error"}`` and contributes no item.
    """
    items: list[Item] = []
    errors: list[dict] = []
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        decisions = engine.decide_batch([rec.request for _, rec in part], on_error="record")
        for (src, rec), dec in zip(part, decisions):
            if dec.error is not None:
                errors.append({"id": rec.id, "source": src, "error": dec.error})
                continue
            for q in rec.request.questions:
                target = rec.targets.get(q.field)
                if target is None or target.label is None or q.field not in dec.answers:
                    continue
                ans = dec.answers[q.field]
                items.append(Item(source=src, record_id=rec.id, field=q.field, type=q.type,
                                  logits=torch.tensor(ans.logprobs, dtype=torch.float64),
                                  gold=list(q.labels).index(target.label)))
        if progress is not None:
            progress(len(part))
    return items, errors
