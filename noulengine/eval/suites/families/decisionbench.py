"""DecisionBench (a local copy of the ``eval`` split) -> canonical records.

Upstream row (JSONL; the hub copy stores the three nested fields as JSON strings)::

    {"id", "task", "primitive": "binary_classification" | "candidate_selection" | "ordinal_scoring",
     "question" (or "instructions"): str,
     "state" | "state_json", "candidates" | "candidates_json": [{"id", "label", "description", "ordinal_value"}],
     "source" | "source_json", "gold_candidate_id", "gold_probabilities": {candidate id: p} | [p, ...] | null}

Projection (one question, field ``decision``):

* ``binary_classification`` -> ``noul``: the first candidate is "yes", the second "no" (criteria
  ``true``/``false`` carry their texts); the source's candidate order ``[first, second]`` is
  ``[yes, no]``, so the field's protocol ``order`` is ``[1, 0]`` and a 50/50 tie goes to the
  first candidate, as upstream;
* ``candidate_selection`` -> ``choice`` keyed by the original candidate ids, in their order;
* ``ordinal_scoring`` -> ``score``: the candidates sorted by ``ordinal_value`` (stable: equal
  values keep their order) become levels ``0..n-1``; the protocol keeps the inverse mapping
  (``order``: each original candidate's level, in the original order), so the reference argmax
  visits candidates in the original order (first maximum wins ties), and the original numeric
  values (``values``), so the reference ordinal error is ``|sum_k p_k v_k - v_gold|``;
* a candidate's text is ``label: description`` (either alone when the other is empty);
* ``gold_probabilities`` become the target distribution (soft KL/Brier/TVD) on the same mapping;
* protocol: NLL floor 1e-15 (beside the generic 1e-12), 15 equal-width ECE bins;
* ``task``, ``primitive``, ``source`` and any other column stay in metadata (slices: task, primitive).
"""

from __future__ import annotations

import json
import math
from typing import Any

from noulengine.eval.suites.families import fail, record_dict
from noulengine.records.schema import Record, parse_record

FAMILY = "decisionbench"
FIELD = "decision"
PRIMITIVES = {"binary_classification": "noul", "candidate_selection": "choice", "ordinal_scoring": "score"}
PROTOCOL = {"family": FAMILY, "ece_bins": "equal-width", "n_bins": 15, "nll_floor": 1e-15}
QUESTION_KEYS = ("question", "instructions")
CONSUMED = {"id", "task", "primitive", *QUESTION_KEYS, "state", "state_json", "candidates", "candidates_json",
            "source", "source_json", "gold_candidate_id", "gold_probabilities", "gold_probabilities_json"}


def _json_field(item: dict, name: str, rid, *, required: bool = True) -> Any:
    """``item[name]``, or ``item[name + "_json"]`` parsed from its JSON string (the hub copy)."""
    if name in item:
        return item[name]
    key = f"{name}_json"
    if key in item:
        raw = item[key]
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise fail(rid, key, f"{key} must be a JSON string, got {type(raw).__name__}")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise fail(rid, key, f"{key} is not valid JSON: {exc}") from None
    if required:
        raise fail(rid, name, f"missing {name!r} (or {key!r})")
    return None


def candidate_text(c: dict) -> str:
    label, desc = str(c.get("label") or "").strip(), str(c.get("description") or "").strip()
    return f"{label}: {desc}" if label and desc and label != desc else (label or desc)


def _candidates(raw: Any, rid) -> list[dict]:
    if not isinstance(raw, list) or len(raw) < 2:
        raise fail(rid, "candidates", f"candidates must be a list of at least 2 objects, got {raw!r}"[:200])
    ids = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict) or c.get("id") is None:
            raise fail(rid, f"candidates[{i}]", "every candidate needs an 'id'")
        if not candidate_text(c):
            raise fail(rid, f"candidates[{i}]", "a candidate needs a label or a description")
        ids.append(str(c["id"]))
    if len(set(ids)) != len(ids):
        raise fail(rid, "candidates", f"candidate ids repeat: {ids}")
    return raw


def _gold_distribution(raw: Any, ids: list[str], rid) -> list[float] | None:
    """The gold probabilities in the original candidate order (None when absent)."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        unknown = [k for k in raw if str(k) not in ids]
        if unknown:
            raise fail(rid, "gold_probabilities", f"probability for unknown candidate {unknown[0]!r}; ids are {ids}")
        by_id = {str(k): v for k, v in raw.items()}
        values = [by_id.get(i, 0.0) for i in ids]
    elif isinstance(raw, list) and len(raw) == len(ids):
        values = raw
    else:
        raise fail(rid, "gold_probabilities", "expected an id -> probability object or one probability per candidate")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
            raise fail(rid, "gold_probabilities", f"a probability must be a number in [0, 1], got {v!r}")
    return [float(v) for v in values]


def project(item: dict) -> dict:
    """The canonical record object for one upstream row (see the module doc)."""
    if not isinstance(item, dict):
        raise fail(None, None, f"a row must be a JSON object, got {type(item).__name__}")
    rid = item.get("id")
    if rid is None:
        raise fail(None, "id", "every row needs an id")
    rid = str(rid)
    primitive = item.get("primitive")
    if primitive not in PRIMITIVES:
        raise fail(rid, "primitive", f"unknown primitive {primitive!r}; expected one of {list(PRIMITIVES)}")
    instructions = next((item[k] for k in QUESTION_KEYS if item.get(k)), None)
    if instructions is None:
        raise fail(rid, "question", f"a row needs its question text in one of {list(QUESTION_KEYS)}")
    state = _json_field(item, "state", rid)
    cands = _candidates(_json_field(item, "candidates", rid), rid)
    ids = [str(c["id"]) for c in cands]
    gold_id = item.get("gold_candidate_id")
    if gold_id is not None and str(gold_id) not in ids:
        raise fail(rid, "gold_candidate_id", f"{gold_id!r} is not a candidate id; ids are {ids}")
    dist = _gold_distribution(_json_field(item, "gold_probabilities", rid, required=False), ids, rid)
    qtype = PRIMITIVES[primitive]
    rule: dict = {}
    if qtype == "noul":
        if len(cands) != 2:
            raise fail(rid, "candidates", f"binary_classification needs exactly 2 candidates, got {len(cands)}")
        criteria = {"true": candidate_text(cands[0]), "false": candidate_text(cands[1])}
        labels = ["yes", "no"]  # original order -> engine labels
        rule["order"] = [1, 0]
    elif qtype == "choice":
        criteria = {i: candidate_text(c) for i, c in zip(ids, cands)}
        labels = ids
    else:
        values = []
        for j, c in enumerate(cands):
            v = c.get("ordinal_value")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise fail(rid, f"candidates[{j}].ordinal_value", f"ordinal_scoring needs a number, got {v!r}")
            values.append(float(v))
        ranked = sorted(range(len(cands)), key=lambda j: values[j])  # stable: equal values keep their order
        level_of = {j: k for k, j in enumerate(ranked)}
        criteria = [candidate_text(cands[j]) for j in ranked]
        labels = [str(level_of[j]) for j in range(len(cands))]  # original candidate j -> its level
        rule["order"] = [level_of[j] for j in range(len(cands))]
        rule["values"] = [values[j] for j in ranked]
    target: dict = {}
    if gold_id is not None:
        target["label"] = labels[ids.index(str(gold_id))]
    if dist is not None:
        target["probabilities"] = {lab: p for lab, p in zip(labels, dist)}
    question = {"type": qtype, "instructions": instructions, "criteria": criteria}
    metadata = {"task": item.get("task"), "primitive": primitive, "source": _json_field(item, "source", rid,
                                                                                         required=False),
                "candidate_ids": ids,
                "protocol": {**PROTOCOL, "fields": {FIELD: rule} if rule else {}}}
    extra = {k: v for k, v in item.items() if k not in CONSUMED}
    if extra:
        metadata["extra"] = extra
    return record_dict(rid, state, {FIELD: question}, {FIELD: target} if target else {}, metadata)


def parse_item(item, *, file: str, context: dict | None = None) -> Record:
    """One upstream row -> a :class:`Record` (request: state + one question).

    Raises:
        RecordError: naming the id, field and rule.
    """
    return parse_record(project(item))
