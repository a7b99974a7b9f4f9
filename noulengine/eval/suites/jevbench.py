"""Adapter from the upstream Jevbench single-question format to canonical records.

Upstream item (kept unchanged on disk)::

    {"id", "family", "group", "split", "state": str, "labels": [...],
     "question": {"type", "instructions", "criteria"}, "expected": str | int, "gold_probs"?: {...}}

Canonical record built at evaluation time: ``state`` = the state string; one question keyed
``decision`` built from ``question`` (choice options put in the item's ``labels`` order: the
files are written with sorted keys, so ``criteria`` on disk is alphabetical); ``targets.decision.label`` from ``expected`` (score integers
become "0".."n-1", noul "yes"/"no"); ``gold_probs`` (when present) become the target
probabilities for TVD and NEVER enter the state or the question; ``category`` = family.
"""

from __future__ import annotations

from typing import Any

from noulengine.records.errors import RecordError
from noulengine.records.schema import Record, parse_record

FIELD = "decision"
_QUESTION_KEYS = ("type", "instructions", "criteria")


def canonical_from_jevbench(item: dict, *, tier: str | None = None) -> dict:
    """The canonical record object (a plain dict) for one upstream Jevbench item."""
    if not isinstance(item, dict):
        raise RecordError(f"a jevbench item must be an object, got {type(item).__name__}")
    rid = item.get("id")
    q = item.get("question")
    if not isinstance(q, dict):
        raise RecordError("jevbench item needs a 'question' object", record_id=rid, field="question")
    question = {k: q[k] for k in _QUESTION_KEYS if k in q}
    labels = item.get("labels")
    criteria = question.get("criteria")
    if question.get("type") == "choice" and isinstance(criteria, dict) and isinstance(labels, list):
        # The files are written with sorted keys, so criteria come alphabetically; `labels` holds
        # the intended candidate order, which is what the model must see.
        if sorted(map(str, labels)) != sorted(criteria):
            raise RecordError(f"labels {labels!r} are not the criteria keys {sorted(criteria)!r}",
                              record_id=rid, field="labels")
        question["criteria"] = {str(label): criteria[str(label)] for label in labels}
    expected: Any = item.get("expected")
    if question.get("type") == "score" and isinstance(expected, int) and not isinstance(expected, bool):
        expected = str(expected)
    target: dict = {"label": expected, "label_origin": "native_annotation"}
    if item.get("gold_probs") is not None:
        target["probabilities"] = item["gold_probs"]
    rec = {"id": rid, "state": item.get("state"), "questions": {FIELD: question},
           "targets": {FIELD: target}, "images": [], "category": item.get("family")}
    for key in ("group", "split"):
        if item.get(key) is not None:
            rec[key] = item[key]
    if tier is not None:
        rec["tier"] = tier
    return rec


def parse_jevbench(item: dict, *, tier: str | None = None) -> Record:
    """Parse one upstream item into a :class:`Record`; checks its ``labels`` match the question's.

    Raises:
        RecordError: the item breaks the canonical format or its ``labels`` disagree.
    """
    record = parse_record(canonical_from_jevbench(item, tier=tier))
    labels = item.get("labels")
    question = record.request.questions[0]
    if labels is not None and [str(x) for x in labels] != list(question.labels):
        raise RecordError(f"labels {labels!r} differ from the question's candidates {list(question.labels)}",
                          record_id=record.id, field="labels")
    return record
