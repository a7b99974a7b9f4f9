"""The Jev-compatible contract (``POST /v1/systemone``): request translation and answer shapes.

A Jev request ``{"model", "state", "questions": {id: question}}`` becomes a canonical request;
each engine :class:`~noulengine.engine.decision.Answer` becomes a Jev answer:

* noul: ``{"type": "noul", "noul": P(true)}``
* choice: ``{"type": "choice", "choice", "probabilities" by option name, "confidence"}``
* score: ``{"type": "score", "score": expected level, "legend": {"0": level text, ...},
  "probabilities": {"0": p, ...}, "confidence"}``

Confidence follows the contract's reference formulas (choice: ``(max p - 1/n) / (1 - 1/n)``;
score: ``1 - spread around the mode / spread of the uniform distribution``). Extra fields carry
an ``x_`` prefix.
"""

from __future__ import annotations

import math
from typing import Any

from noulengine.records.schema import canonical_json
from noulengine.serve.responses import ValidationFailure
from noulengine.serve.validation import check_body

QUESTION_TYPES = ("noul", "choice", "score")


def _text(value: Any) -> str | None:
    """A description as the engine takes it: strings as they are, objects/arrays as JSON."""
    if value is None or isinstance(value, str):
        return value
    return canonical_json(value)


def _check_text(value: Any, loc: list, what: str) -> None:
    if value is not None and not isinstance(value, (str, dict, list)):
        raise ValidationFailure(loc, f"{what} must be a string, object, array or null, got {type(value).__name__}",
                                "type_error")


def _instructions(qtype: str, q: dict, loc: list) -> Any:
    ins = q.get("instructions")
    _check_text(ins, loc + ["instructions"], "instructions")
    if ins is not None and not (isinstance(ins, str) and not ins.strip()):
        return ins
    if qtype == "noul":  # contract: a noul may come with criteria only
        crit = q.get("criteria") or {}
        true = crit.get("true") if isinstance(crit, dict) else None
        false = crit.get("false") if isinstance(crit, dict) else None
        if true is not None:
            return f"Is this true: {_text(true)}?"
        if false is not None:
            return f"Is this false: {_text(false)}?"
        raise ValidationFailure(loc + ["instructions"], "a noul question needs instructions or criteria", "missing")
    return "Which option fits best?" if qtype == "choice" else "Which level fits best?"


def translate_question(qid: Any, q: Any) -> dict:
    """One Jev question as a canonical question object.

    Raises:
        ValidationFailure: naming ``["body", "questions", id, ...]`` and the rule.
    """
    loc = ["questions", qid]
    if not isinstance(qid, str) or not qid:
        raise ValidationFailure(["questions"], "question ids must be non-empty strings")
    if not isinstance(q, dict):
        raise ValidationFailure(loc, f"a question must be an object, got {type(q).__name__}", "type_error")
    qtype = q.get("type")
    if qtype not in QUESTION_TYPES:
        raise ValidationFailure(loc + ["type"], f"type must be one of {list(QUESTION_TYPES)}, got {qtype!r}",
                                "missing" if qtype is None else "literal_error")
    crit = q.get("criteria")
    cloc = loc + ["criteria"]
    out: dict = {"type": qtype, "instructions": _instructions(qtype, q, loc)}
    if qtype == "noul":
        if crit is not None:
            if not isinstance(crit, dict):
                raise ValidationFailure(cloc, "noul criteria must be an object with 'true' and/or 'false' keys",
                                        "type_error")
            bad = [k for k in crit if k not in ("true", "false")]
            if bad:
                raise ValidationFailure(cloc + [bad[0]], "noul criteria keys must be 'true' or 'false'", "extra_forbidden")
            for k, v in crit.items():
                _check_text(v, cloc + [k], "a criterion")
            out["criteria"] = {k: _text(v) for k, v in crit.items() if v is not None}
    elif qtype == "choice":
        if not isinstance(crit, dict):
            raise ValidationFailure(cloc, "a choice question needs criteria: an object of option name -> description",
                                    "missing" if crit is None else "type_error")
        for k, v in crit.items():
            _check_text(v, cloc + [k], "an option description")
        out["criteria"] = {k: _text(v) for k, v in crit.items()}
    else:
        if not isinstance(crit, list):
            raise ValidationFailure(cloc, "score criteria must be an ordered list of level descriptions "
                                          "(the map form is not accepted)", "missing" if crit is None else "list_type")
        for i, v in enumerate(crit):
            if v is None:
                raise ValidationFailure(cloc + [i], "a score level description must not be null", "missing")
            _check_text(v, cloc + [i], "a level description")
        out["criteria"] = [_text(v) for v in crit]
    return out


def translate_request(body: Any, max_questions: int | None = None) -> tuple[dict, list]:
    """A Jev request body as ``(canonical request dict, score legends by question id)``.

    Unknown top-level fields (and ``model``, checked by the caller) are ignored; ``images`` is passed on.

    Args:
        body: the parsed JSON body.
        max_questions: the route's configured cap (``noulengine serve --max-questions``), or None
            for no cap.

    Raises:
        ValidationFailure: a missing ``state``/``questions``, more questions than the cap, a
            non-finite number or lone surrogate anywhere in them
            (:func:`noulengine.serve.validation.check_body`, shared with ``/v1/decide``), or a
            malformed question.
    """
    qs = check_body(body, "/v1/systemone", max_questions)  # the frame and JSON values, as /v1/decide checks them
    questions = {qid: translate_question(qid, q) for qid, q in qs.items()}
    legends = {qid: {str(i): lvl for i, lvl in enumerate(q["criteria"])}
               for qid, q in qs.items() if q.get("type") == "score"}
    canonical = {"state": body["state"], "questions": questions}
    if body.get("images") is not None:  # never dropped: a text-only model refuses them, a VLM reads them
        canonical["images"] = body["images"]
    return canonical, legends


def choice_confidence(probs: list[float]) -> float:
    """``(max p - 1/n) / (1 - 1/n)``: 0 for a uniform answer, 1 for a certain one."""
    n = len(probs)
    if n <= 1:
        return 1.0
    return min(1.0, max(0.0, (max(probs) - 1 / n) / (1 - 1 / n)))


def score_confidence(probs: list[float]) -> float:
    """``1 - sum p_i |i - mode| / uniform spread``, clipped to [0, 1]."""
    n = len(probs)
    if n <= 1:
        return 1.0
    mode = max(range(n), key=lambda i: probs[i])
    spread = sum(p * abs(i - mode) for i, p in enumerate(probs))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return min(1.0, max(0.0, 1 - spread / uniform))


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x!r} in an answer")
    return float(x)


def jev_answer(answer, legend: dict | None = None) -> dict:
    """One engine :class:`~noulengine.engine.decision.Answer` in the Jev shape (finite numbers only)."""
    probs = {k: _finite(v) for k, v in answer.probabilities.items()}
    if answer.type == "noul":
        return {"type": "noul", "noul": min(1.0, max(0.0, probs["yes"]))}
    values = list(probs.values())
    if answer.type == "choice":
        return {"type": "choice", "choice": answer.label, "probabilities": probs,
                "confidence": choice_confidence(values)}
    score = sum(i * p for i, p in enumerate(values))
    legend = legend or {k: k for k in probs}
    return {"type": "score", "score": _finite(score), "legend": legend,
            "probabilities": probs, "confidence": score_confidence(values),
            "x_level": answer.label, "x_level_text": legend.get(answer.label)}


def jev_response(model: str, decision, legends: dict) -> dict:
    """The response envelope ``{"model", "answers", "usage"}`` for a successful decision."""
    answers = {qid: jev_answer(a, legends.get(qid)) for qid, a in decision.answers.items()}
    return {"model": model, "answers": answers,
            "usage": {"input_tokens": int(decision.input_tokens), "output_tokens": 0}}
