"""JevAlt-Bench (local copies of the English, Turkish and German ``test.jsonl``) -> canonical records.

Upstream row::

    {"id", "lang", "source", "license", "split", "tags": [...], "state",
     "questions": {q: {"type", "instructions", "criteria"}},
     "targets": {q: {"label": ..., "dist": {label: p} | null}}}

Projection:

* split membership is the file (``<lang>/test.jsonl``), not the row's ``split`` field (a
  ``"train"`` placeholder in the release): it is kept in metadata as ``split_field`` and used for
  nothing;
* the ``abstain`` tag adds an explicit candidate ``unknown`` ("not enough information to decide")
  to every choice question that lacks one, and a last level ``unknown`` to every score question;
  only the tag decides it, never the gold (a row whose gold is ``unknown`` without the tag is
  refused: its gold is not a candidate);
* a score rubric written as an object keeps its insertion order: its keys are the levels
  ``0..n-1`` in that order, each level's text ``key: description`` (or the description alone when
  the keys are the digits ``"0".."n-1"`` in order); a score gold may be the level key, its
  position (an integer or a digit string) or, for a list rubric, the level text;
* ``targets[q].dist`` becomes the target distribution (KL, Brier against it, TVD) beside the hard
  label;
* protocol: ECE over 15 equal-mass bins, NLL floor 1e-12; slices by ``lang``.
"""

from __future__ import annotations

from typing import Any

from noulengine.eval.suites.families import fail, record_dict, require_keys
from noulengine.records.schema import Record, parse_record

FAMILY = "jevalt-bench"
PROTOCOL = {"family": FAMILY, "ece_bins": "equal-mass", "n_bins": 15, "nll_floor": 1e-12}
ROW_KEYS = ("id", "lang", "source", "license", "split", "tags", "state", "questions", "targets")
REQUIRED = ("id", "state", "questions", "targets")
ABSTAIN_TAG = "abstain"
UNKNOWN = "unknown"
UNKNOWN_TEXT = "not enough information to decide"


def _score_levels(criteria: Any, rid, fld: str) -> tuple[list[str], list[str | None]]:
    """``(level keys, level texts)`` of a score rubric (list or insertion-ordered object)."""
    if isinstance(criteria, list):
        return [str(i) for i in range(len(criteria))], list(criteria)
    if isinstance(criteria, dict):
        keys = [str(k) for k in criteria]
        plain = keys == [str(i) for i in range(len(keys))]
        texts = []
        for k, v in criteria.items():
            v = None if v is None else str(v)
            texts.append(v if plain else (f"{k}: {v}" if v else str(k)))
        return keys, texts
    raise fail(rid, f"questions.{fld}.criteria", "a score rubric must be a list of levels or an object of levels")


def _score_index(value: Any, keys: list[str], texts: list, listed: bool, rid, path: str) -> int:
    if isinstance(value, bool):
        raise fail(rid, path, f"a score label must be a level, got {value!r}")
    if isinstance(value, int) and 0 <= value < len(keys):
        return value
    if isinstance(value, str):
        if value in keys:
            return keys.index(value)
        if listed and value in texts:
            return texts.index(value)
    raise fail(rid, path, f"{value!r} is not a level of {keys if not listed else texts}")


def _question(raw: Any, abstain: bool, rid, fld: str) -> tuple[dict, Any]:
    """``(canonical question, label mapper)`` for one upstream question."""
    if not isinstance(raw, dict):
        raise fail(rid, f"questions.{fld}", f"expected an object, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in ("type", "instructions", "criteria")]
    if unknown:
        raise fail(rid, f"questions.{fld}.{unknown[0]}", f"unknown question key {unknown[0]!r}")
    qtype, criteria = raw.get("type"), raw.get("criteria")
    q = {"type": qtype, "instructions": raw.get("instructions")}
    if qtype == "choice":
        if isinstance(criteria, list):
            criteria = {str(c): None for c in criteria}
        if not isinstance(criteria, dict):
            raise fail(rid, f"questions.{fld}.criteria", "a choice question needs criteria")
        criteria = dict(criteria)
        if abstain and UNKNOWN not in criteria:
            criteria[UNKNOWN] = UNKNOWN_TEXT
        q["criteria"] = criteria
        return q, lambda v, path: v
    if qtype == "score":
        keys, texts = _score_levels(criteria, rid, fld)
        listed = isinstance(criteria, list)
        if abstain and UNKNOWN not in keys and UNKNOWN not in texts:
            keys, texts = keys + [UNKNOWN], texts + [UNKNOWN]
        q["criteria"] = texts
        return q, lambda v, path: str(_score_index(v, keys, texts, listed, rid, path))
    if criteria is not None:
        q["criteria"] = criteria
    return q, lambda v, path: v


def parse_item(item, *, file: str, context: dict | None = None) -> Record:
    """One upstream row -> a :class:`Record`; ``file`` (``en/test.jsonl``) gives the split and language.

    Raises:
        RecordError: naming the id, field and rule.
    """
    if not isinstance(item, dict):
        raise fail(None, None, f"a row must be a JSON object, got {type(item).__name__}")
    rid = item.get("id")
    require_keys(item, REQUIRED, ROW_KEYS, rid)
    tags = item.get("tags") or []
    if not isinstance(tags, list):
        raise fail(rid, "tags", "tags must be a list")
    abstain = ABSTAIN_TAG in tags
    raw_q, raw_t = item["questions"], item["targets"]
    if not isinstance(raw_q, dict) or not raw_q:
        raise fail(rid, "questions", "questions must be a non-empty object")
    if not isinstance(raw_t, dict):
        raise fail(rid, "targets", "targets must be an object keyed by question")
    questions, mappers = {}, {}
    for fld, raw in raw_q.items():
        questions[fld], mappers[fld] = _question(raw, abstain, rid, fld)
    targets = {}
    for fld, t in raw_t.items():
        if fld not in questions:
            raise fail(rid, f"targets.{fld}", f"target for a question the row does not ask; questions are {list(raw_q)}")
        if not isinstance(t, dict):
            raise fail(rid, f"targets.{fld}", "a target must be an object with 'label' and/or 'dist'")
        target = {}
        if t.get("label") is not None:
            target["label"] = mappers[fld](t["label"], f"targets.{fld}.label")
        if t.get("dist") is not None:
            if not isinstance(t["dist"], dict):
                raise fail(rid, f"targets.{fld}.dist", "dist must be a label -> probability object")
            target["probabilities"] = {mappers[fld](k, f"targets.{fld}.dist.{k}"): p for k, p in t["dist"].items()}
        if target:
            targets[fld] = target
    lang_file, _, split_file = file.partition("/")
    metadata = {"lang": item.get("lang") or lang_file, "file": file, "split": split_file.removesuffix(".jsonl"),
                "split_field": item.get("split"), "tags": tags, "abstain": abstain, "source": item.get("source"),
                "license": item.get("license"), "protocol": dict(PROTOCOL)}
    return parse_record(record_dict(rid, item["state"], questions, targets, metadata))
