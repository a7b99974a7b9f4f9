"""Procedural Typed Decisions (a local copy of config ``all``, test split) -> canonical records.

Upstream row::

    {"id", "level": 0..4, "state", "questions": "<JSON string>", "answers": "<JSON string>"}

(``task`` too, where the copy has it.) ``questions`` decodes to ``{q: {type, instructions, criteria}}``
and ``answers`` to one object per question:

* noul ``{"noul": p}``: ``true``/``false`` or ``p`` = 0 or 1 is a hard label; any other ``p`` in
  (0, 1) is an exact posterior: the target is the distribution ``{yes: p, no: 1 - p}`` with **no
  hard label** (none is invented from it), so it enters no accuracy and no empirical ECE, only
  the probability losses (KL, Brier against the distribution, TVD, cross-entropy) and the
  posterior MAE ``|P(yes) - p|`` of the ``reference`` block;
* score ``{"score": index}``: the hard label ``index``;
* choice ``{"choice": label, "probabilities": {label: p}}``: the hard label, and the
  probabilities as a soft target where given; probabilities without a ``choice`` are a
  posterior-only question like a fractional noul.

Slices: ``task`` (the row's ``task``, else its id without the trailing number: ``bayes-00012`` ->
``bayes``) and ``level``. Protocol: 15 equal-width ECE bins, NLL floor 1e-12.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from noulengine.eval.suites.families import fail, model_question, record_dict, require_keys
from noulengine.records.schema import Record, parse_record

FAMILY = "procedural-typed-decisions"
PROTOCOL = {"family": FAMILY, "ece_bins": "equal-width", "n_bins": 15, "nll_floor": 1e-12}
ROW_KEYS = ("id", "level", "state", "questions", "answers", "task")
REQUIRED = ("id", "level", "state", "questions", "answers")
_TRAILING_NUMBER = re.compile(r"^(.*?)[-_/:.#]?\d+$")


def task_of(item: dict) -> str:
    """The row's task: its ``task`` field, else its id without the trailing number."""
    if item.get("task"):
        return str(item["task"])
    m = _TRAILING_NUMBER.match(str(item["id"]))
    return m.group(1) if m and m.group(1) else str(item["id"])


def _decode(item: dict, key: str, rid) -> dict:
    raw = item[key]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise fail(rid, key, f"{key} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise fail(rid, key, f"{key} must decode to an object keyed by question")
    return raw


def _probability(v: Any, rid, path: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
        raise fail(rid, path, f"a probability must be a number in [0, 1], got {v!r}")
    return float(v)


def target_of(qtype: str, answer: Any, rid, fld: str) -> dict:
    """The canonical target of one upstream answer (see the module doc)."""
    path = f"answers.{fld}"
    if not isinstance(answer, dict):
        raise fail(rid, path, f"an answer must be an object, got {answer!r}")
    if qtype == "noul":
        if "noul" not in answer:
            raise fail(rid, path, "a noul answer is {\"noul\": p}")
        p = answer["noul"]
        if isinstance(p, bool):
            return {"label": "yes" if p else "no"}
        p = _probability(p, rid, f"{path}.noul")
        if p in (0.0, 1.0):
            return {"label": "yes" if p == 1.0 else "no"}
        return {"probabilities": {"yes": p, "no": 1.0 - p}}  # a posterior: no hard label
    if qtype == "score":
        idx = answer.get("score")
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise fail(rid, f"{path}.score", f"a score answer is {{\"score\": index}}, got {idx!r}")
        out = {"label": str(idx)}
        if answer.get("probabilities") is not None:
            out["probabilities"] = answer["probabilities"]
        return out
    out = {}
    if answer.get("choice") is not None:
        out["label"] = answer["choice"]
    if answer.get("probabilities") is not None:
        probs = answer["probabilities"]
        if not isinstance(probs, dict):
            raise fail(rid, f"{path}.probabilities", "probabilities must be a label -> p object")
        out["probabilities"] = {k: _probability(v, rid, f"{path}.probabilities.{k}") for k, v in probs.items()}
    if not out:
        raise fail(rid, path, "a choice answer needs 'choice' and/or 'probabilities'")
    return out


def parse_item(item, *, file: str, context: dict | None = None) -> Record:
    """One upstream row -> a :class:`Record` (request: state + decoded questions).

    Raises:
        RecordError: naming the id, field and rule.
    """
    if not isinstance(item, dict):
        raise fail(None, None, f"a row must be a JSON object, got {type(item).__name__}")
    rid = item.get("id")
    require_keys(item, REQUIRED, ROW_KEYS, rid)
    level = item["level"]
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 4:
        raise fail(rid, "level", f"level must be an integer 0-4, got {level!r}")
    raw_q, answers = _decode(item, "questions", rid), _decode(item, "answers", rid)
    questions = {}
    for fld, raw in raw_q.items():
        questions[fld] = model_question(raw, rid, fld)
        unknown = [k for k in raw if k not in questions[fld]]
        if unknown:
            raise fail(rid, f"questions.{fld}.{unknown[0]}", f"unknown question key {unknown[0]!r}")
    extra = [k for k in answers if k not in questions]
    if extra:
        raise fail(rid, f"answers.{extra[0]}", f"an answer for a question the row does not ask; questions are "
                                               f"{list(questions)}")
    targets = {fld: target_of(questions[fld].get("type"), a, rid, fld) for fld, a in answers.items()}
    posterior = sorted(f for f, t in targets.items() if "label" not in t)
    metadata = {"task": task_of(item), "level": level, "file": file, "posterior_only": posterior,
                "protocol": dict(PROTOCOL)}
    return parse_record(record_dict(rid, item["state"], questions, targets, metadata))
