"""Canonical decision records: typed questions, requests and evaluation targets.

A canonical record is one JSON object::

    {"id": str, "state": <any JSON>, "images": [...], "questions": {field: question},
     "targets": {field: {"label": str, "probabilities": {label: p}}},
     "validation_role": "calibration" | "selection"}

Only ``state``, ``images`` and ``questions`` ever reach the model (see :class:`Request`); ids,
targets, gold probabilities, roles and any other metadata stay in :class:`Record`.

Question types and their candidate labels, in order:

* ``choice``: ``criteria`` is an ordered ``label -> description`` object (descriptions may be
  null); candidates are its keys in order.
* ``score``: ``criteria`` is an ordered list of level descriptions, or an object whose keys are
  the integers ``0 .. n-1``; candidates are ``"0", "1", ...`` in level order.
* ``noul``: always the two candidates ``("no", "yes")``; optional ``criteria`` keyed
  ``true/false`` or ``yes/no`` give the descriptions.

A question object has only the keys ``type``, ``instructions``, ``criteria`` and the legacy gold
``answer``; any other key is an error (a misspelt ``criteria`` must not vanish silently).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from noulengine.records.errors import RecordError
from noulengine.records.images import MAX_IMAGES, Image, check_image_list, coerce_image  # Image: re-exported

QUESTION_TYPES = ("choice", "score", "noul")
QUESTION_KEYS = ("type", "instructions", "criteria", "answer")  # "answer": legacy gold, evaluation only
VALIDATION_ROLES = ("calibration", "selection")
NOUL_LABELS = ("no", "yes")
MAX_CHOICE_OPTIONS = 255
MAX_SCORE_LEVELS = 10
_NOUL_KEYS = {"false": "no", "no": "no", "true": "yes", "yes": "yes"}


@dataclass(frozen=True)
class Question:
    """One typed question.

    Attributes:
        field: the question's key in the request (any non-empty string).
        type: ``"choice"``, ``"score"`` or ``"noul"``.
        instructions: the question text; an object or array is rendered as JSON.
        labels: candidate labels in order (choice: criteria keys; score: ``"0".."n-1"``;
            noul: ``("no", "yes")``).
        descriptions: one description (or None) per label.
    """

    field: str
    type: str
    instructions: Any
    labels: tuple[str, ...]
    descriptions: tuple[str | None, ...]

    @property
    def num_candidates(self) -> int:
        return len(self.labels)

    def spec(self) -> dict:
        """The JSON-able content of the question (what the model sees), for hashing/caching."""
        return {
            "type": self.type,
            "instructions": self.instructions,
            "labels": list(self.labels),
            "descriptions": list(self.descriptions),
        }


@dataclass(frozen=True)
class Request:
    """What inference sees: the evidence and the questions, nothing else.

    Attributes:
        state: any JSON value (a plain string is rendered as text).
        questions: ordered questions (at least one; no upper count: the context window and the
            packed-token budget bound a request, and refuse with counts, never truncating).
        images: ordered images (empty for text-only requests).
        id: an opaque request id, echoed in the output and never compiled into the prompt.
        adapter: the name of a LoRA adapter loaded on the engine that answers this request (None:
            the engine's model as loaded); it chooses weights, never reaches the prompt.
    """

    state: Any
    questions: tuple[Question, ...]
    images: tuple[Image, ...] = ()
    id: str | None = None
    adapter: str | None = None


@dataclass(frozen=True)
class Target:
    """Evaluation gold for one field: a hard label and optionally a gold distribution."""

    label: str | None
    probabilities: Mapping[str, float] | None = None


@dataclass
class Record:
    """A canonical record: the :class:`Request` plus evaluation-only fields."""

    id: str
    request: Request
    targets: dict[str, Target] = field(default_factory=dict)
    validation_role: str | None = None
    category: str | None = None
    metadata: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Parsing with rule-naming errors.


def _fail(rid, fld, rule) -> RecordError:
    return RecordError(rule, record_id=rid, field=fld)


def _check_text(value: str, rid, path: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _fail(rid, path, f"string is not valid Unicode (lone surrogate at position {exc.start})") from None


def _check_finite(value: Any, rid, path: str) -> None:
    """Reject NaN/Infinity anywhere in a JSON value (Python's json accepts them by default), and
    strings (values or keys) with lone surrogates, which no tokenizer or UTF-8 writer accepts."""
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(rid, path, f"non-finite number {value!r} is not valid JSON")
    if isinstance(value, str):
        _check_text(value, rid, path)
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    raise _fail(rid, path, f"a key in this object is not valid Unicode (lone surrogate in {k!r})") from None
            _check_finite(v, rid, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, rid, f"{path}[{i}]")


def _description(value: Any, rid, path: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    raise _fail(rid, path, f"a description must be a string or null, got {type(value).__name__}")


def parse_question(fld: str, raw: Any, *, record_id: str | None = None) -> Question:
    """Parse one question object.

    Raises:
        RecordError: naming the record id, ``questions.<field>`` and the rule broken.
    """
    rid = record_id
    path = f"questions.{fld}"
    if not isinstance(fld, str) or not fld:
        raise _fail(rid, "questions", "question ids must be non-empty strings")
    if not isinstance(raw, dict):
        raise _fail(rid, path, f"expected an object, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in QUESTION_KEYS]
    if unknown:  # a misspelt "criteria" must not silently drop the descriptions
        raise _fail(rid, f"{path}.{unknown[0]}", f"unknown question key {unknown[0]!r}; "
                                                 f"question keys are {list(QUESTION_KEYS)}")
    qtype = raw.get("type")
    if qtype not in QUESTION_TYPES:
        raise _fail(rid, f"{path}.type", f"unknown type {qtype!r}; expected one of {list(QUESTION_TYPES)}")
    instructions = raw.get("instructions")
    if instructions is None or (isinstance(instructions, str) and not instructions.strip()):
        raise _fail(rid, f"{path}.instructions", "instructions are required (a string, object or array)")
    if not isinstance(instructions, (str, dict, list)):
        raise _fail(rid, f"{path}.instructions", f"expected a string, object or array, got {type(instructions).__name__}")
    if isinstance(instructions, (dict, list)) and not instructions:
        raise _fail(rid, f"{path}.instructions", f"instructions must not be an empty {type(instructions).__name__}")
    criteria = raw.get("criteria")
    cpath = f"{path}.criteria"

    if qtype == "choice":
        if not isinstance(criteria, dict):
            raise _fail(rid, cpath, "a choice question needs criteria: an ordered label -> description object")
        labels = tuple(criteria.keys())
        for label in labels:
            if not isinstance(label, str):
                raise _fail(rid, cpath, f"choice labels must be strings, got {type(label).__name__} {label!r}")
            if not label.strip():
                raise _fail(rid, cpath, "choice labels must be non-empty")
        if len(labels) < 2:
            raise _fail(rid, cpath, f"a choice question needs at least 2 options, got {len(labels)}")
        if len(labels) > MAX_CHOICE_OPTIONS:
            raise _fail(rid, cpath, f"at most {MAX_CHOICE_OPTIONS} options, got {len(labels)}")
        descriptions = tuple(_description(criteria[k], rid, f"{cpath}.{k}") for k in labels)
    elif qtype == "score":
        if isinstance(criteria, list):
            descriptions = tuple(_description(d, rid, f"{cpath}[{i}]") for i, d in enumerate(criteria))
        elif isinstance(criteria, dict):
            levels = []
            for k in criteria:
                if isinstance(k, int) and not isinstance(k, bool) and k >= 0:
                    levels.append((k, k))
                elif isinstance(k, str) and re.fullmatch(r"0|[1-9][0-9]{0,5}", k):
                    levels.append((int(k), k))
                else:  # no silent coercion of "+1", " 1", "01", 1.5 or True
                    raise _fail(rid, f"{cpath}.{k}", f"score criteria keys must be the integers 0..n-1 "
                                                     f"written plainly, got {k!r}")
            levels.sort()
            if [lvl for lvl, _ in levels] != list(range(len(levels))):
                raise _fail(rid, cpath, f"score levels must be exactly 0..{len(levels) - 1}, got {[k for _, k in levels]}")
            descriptions = tuple(_description(criteria[k], rid, f"{cpath}.{k}") for _, k in levels)
        else:
            raise _fail(rid, cpath, "a score question needs criteria: an ordered list of levels or a 0..n-1 keyed object")
        if len(descriptions) < 2:
            raise _fail(rid, cpath, f"a score question needs at least 2 levels, got {len(descriptions)}")
        if len(descriptions) > MAX_SCORE_LEVELS:
            raise _fail(rid, cpath, f"at most {MAX_SCORE_LEVELS} score levels, got {len(descriptions)}")
        labels = tuple(str(i) for i in range(len(descriptions)))
    else:  # noul
        labels = NOUL_LABELS
        desc = {"no": None, "yes": None}
        if criteria is not None:
            if not isinstance(criteria, dict):
                raise _fail(rid, cpath, "noul criteria must be an object keyed true/false or yes/no")
            seen = set()
            for k, v in criteria.items():
                key = _NOUL_KEYS.get(str(k).lower())
                if key is None:
                    raise _fail(rid, f"{cpath}.{k}", "noul criteria keys must be true/false or yes/no")
                if key in seen:  # by key, not description: a null first must not make the rule order-dependent
                    raise _fail(rid, f"{cpath}.{k}", f"duplicate noul criterion for {key!r}")
                seen.add(key)
                desc[key] = _description(v, rid, f"{cpath}.{k}")
        descriptions = (desc["no"], desc["yes"])
    return Question(field=fld, type=qtype, instructions=instructions, labels=labels, descriptions=descriptions)


def question_to_json(q: Question) -> dict:
    """The canonical JSON of a parsed question (``parse_question`` of it gives ``q`` back)."""
    if q.type == "choice":
        criteria: Any = dict(zip(q.labels, q.descriptions))
    elif q.type == "score":
        criteria = list(q.descriptions)
    else:
        criteria = {k: d for k, d in zip(("false", "true"), q.descriptions) if d is not None} or None
    out = {"type": q.type, "instructions": q.instructions}
    if criteria is not None:
        out["criteria"] = criteria
    return out


def request_to_json(request: Request) -> dict:
    """The canonical JSON of a text request (``request_from_json`` of it gives it back): what an
    HTTP client sends for a parsed record.

    Raises:
        ValueError: the request has images (their bytes are not written back as JSON here).
    """
    if request.images:
        raise ValueError(f"request {request.id!r} has {len(request.images)} images; request_to_json writes text "
                         "requests only")
    out = {"state": request.state, "questions": {q.field: question_to_json(q) for q in request.questions}}
    if request.id is not None:
        out["id"] = request.id
    return out


def parse_questions(raw: Any, *, record_id: str | None = None) -> tuple[Question, ...]:
    """Parse the ``questions`` object (one or more questions, order preserved).

    There is no question-count rule here: a canonical record's ``questions`` is any non-empty
    object. The real bounds are the model's context window and the engine's packed-token budget
    (both refuse with the counts, never truncate); a per-route cap is a service setting
    (``noulengine serve --max-questions``), not a property of records.
    """
    if not isinstance(raw, dict):
        raise _fail(record_id, "questions", f"expected a non-empty object, got {type(raw).__name__}")
    if not raw:
        raise _fail(record_id, "questions", "questions must not be empty")
    return tuple(parse_question(k, v, record_id=record_id) for k, v in raw.items())


def normalize_label(question: Question, value: Any) -> str | None:
    """Map a gold label as written in data onto the question's candidate label.

    Accepts integers for score levels and booleans / true/false for noul; returns None for a
    value that names no candidate.
    """
    if question.type == "noul":
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, str):
            return _NOUL_KEYS.get(value.lower())
        return None
    if question.type == "score" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and value in question.labels:
        return value
    return None


def _parse_target(q: Question, raw: Any, rid) -> Target:
    path = f"targets.{q.field}"
    if not isinstance(raw, dict):
        raise _fail(rid, path, f"expected an object with 'label', got {type(raw).__name__}")
    label = None
    if raw.get("label") is not None:
        label = normalize_label(q, raw["label"])
        if label is None:
            raise _fail(rid, f"{path}.label", f"target {raw['label']!r} is not a candidate; candidates are {list(q.labels)}")
    probs = None
    if raw.get("probabilities") is not None:
        rawp = raw["probabilities"]
        if not isinstance(rawp, dict):
            raise _fail(rid, f"{path}.probabilities", "expected a label -> probability object")
        probs = {}
        for k, v in rawp.items():
            lab = normalize_label(q, k)
            if lab is None:
                raise _fail(rid, f"{path}.probabilities.{k}", f"not a candidate; candidates are {list(q.labels)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
                raise _fail(rid, f"{path}.probabilities.{k}", f"a probability must be a finite number in [0, 1], got {v!r}")
            probs[lab] = float(v)
        total = sum(probs.values())
        if abs(total - 1.0) > 0.01:
            raise _fail(rid, f"{path}.probabilities", f"gold probabilities must sum to 1 (within 0.01), got {total:.6f}")
        probs = {lab: probs.get(lab, 0.0) for lab in q.labels}
    return Target(label=label, probabilities=probs)


def parse_record(obj: Any, *, media_root=None) -> Record:
    """Parse one canonical record object.

    Args:
        media_root: the folder relative image paths are read from (records files); None
            accepts only inline (base64) images.

    Raises:
        RecordError: naming the record id, field and rule.
    """
    if not isinstance(obj, dict):
        raise RecordError(f"a record must be a JSON object, got {type(obj).__name__}")
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
        raise _fail(None, "id", f"every record needs a non-empty string id, got {rid!r}")
    _check_text(rid, None, "id")
    for key, value in obj.items():
        _check_finite(value, rid, key)
    if "state" not in obj:
        raise _fail(rid, "state", "state is required (any JSON value)")
    questions = parse_questions(obj.get("questions"), record_id=rid)
    parsed_images = _parse_images(rid, [] if obj.get("images") is None else obj["images"], media_root=media_root)
    role = obj.get("validation_role")
    if role is not None and role not in VALIDATION_ROLES:
        raise _fail(rid, "validation_role", f"expected one of {list(VALIDATION_ROLES)}, got {role!r}")
    raw_targets = {} if obj.get("targets") is None else obj["targets"]
    if not isinstance(raw_targets, dict):
        raise _fail(rid, "targets", "targets must be an object keyed by question field")
    by_field = {q.field: q for q in questions}
    targets: dict[str, Target] = {}
    for fld, raw in raw_targets.items():
        if fld not in by_field:
            raise _fail(rid, f"targets.{fld}", f"target for unknown question; questions are {list(by_field)}")
        targets[fld] = _parse_target(by_field[fld], raw, rid)
    # Legacy `questions[field].answer`: used when no target contradicts it.
    for fld, rawq in obj["questions"].items():
        if isinstance(rawq, dict) and rawq.get("answer") is not None:
            q = by_field[fld]
            legacy = normalize_label(q, rawq["answer"])
            if legacy is None:
                raise _fail(rid, f"questions.{fld}.answer", f"answer {rawq['answer']!r} is not a candidate; candidates are {list(q.labels)}")
            t = targets.get(fld)
            if t is not None and t.label is not None and t.label != legacy:
                raise _fail(rid, f"questions.{fld}.answer", f"legacy answer {legacy!r} contradicts targets.{fld}.label {t.label!r}")
            if t is None:
                targets[fld] = Target(label=legacy)
            elif t.label is None:
                targets[fld] = Target(label=legacy, probabilities=t.probabilities)
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise _fail(rid, "category", f"category must be a string or null, got {type(category).__name__}")
    known = {"id", "state", "questions", "images", "targets", "validation_role", "category"}
    metadata = {k: v for k, v in obj.items() if k not in known}
    request = Request(state=obj["state"], questions=questions, images=parsed_images, id=rid)
    return Record(id=rid, request=request, targets=targets, validation_role=role,
                  category=category if isinstance(category, str) else None, metadata=metadata)


def _parse_images(rid, images: Any, *, media_root=None) -> tuple[Image, ...]:
    """Decode and check every image (in order), then the request-level limits (count, combined
    bytes). The count is checked first, so a request with too many images decodes none."""
    if not isinstance(images, (list, tuple)):
        raise _fail(rid, "images", "images must be a list")
    if len(images) > MAX_IMAGES:
        raise _fail(rid, "images", f"at most {MAX_IMAGES} images per request, got {len(images)}")
    parsed = tuple(coerce_image(im, record_id=rid, field=f"images[{i}]", media_root=media_root)
                   for i, im in enumerate(images))
    check_image_list(parsed, record_id=rid)
    return parsed


def request_from_json(obj: Any, *, request_id: str | None = None, media_root=None) -> Request:
    """Build a :class:`Request` from a JSON object with ``state``, ``questions``, ``images``.

    Extra keys (``id``, ``targets``, metadata) are ignored here: they never reach the model.
    ``adapter`` names the LoRA adapter that answers (:meth:`noulengine.Engine.load_adapter`).

    Args:
        media_root: the folder relative image paths are read from; None (HTTP) accepts only
            inline images: base64 objects or data URLs, or, from Python, ``PIL`` images and
            encoded bytes.
    """
    if not isinstance(obj, dict):
        raise RecordError(f"a request must be a JSON object, got {type(obj).__name__}")
    rid = request_id if request_id is not None else obj.get("id")
    if rid is not None and not isinstance(rid, str):
        raise _fail(None, "id", f"id must be a string or null, got {type(rid).__name__} {rid!r}")
    if rid is not None:
        _check_text(rid, None, "id")
    for key in ("state", "questions"):
        _check_finite(obj.get(key), rid, key)
    if "state" not in obj:
        raise _fail(rid, "state", "state is required (any JSON value)")
    questions = parse_questions(obj.get("questions"), record_id=rid)
    images = _parse_images(rid, [] if obj.get("images") is None else obj["images"], media_root=media_root)
    adapter = obj.get("adapter")
    if adapter is not None and (not isinstance(adapter, str) or not adapter.strip()):
        raise _fail(rid, "adapter", f"adapter must be a non-blank string (a loaded adapter's name) or null, got "
                                    f"{type(adapter).__name__} {adapter!r}")
    return Request(state=obj["state"], questions=questions, images=images, id=rid, adapter=adapter)


def canonical_json(value: Any) -> str:
    """Deterministic compact JSON used for rendering and hashing (key order preserved)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)
