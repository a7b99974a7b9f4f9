"""One escalated question as chat messages, its structured-output schema, and answer parsing.

Only what the decision model saw reaches the LLM: the request's ``state`` and the question
(instructions, labels, descriptions), plus the decision model's probabilities as context. Ids,
targets and metadata never do. Images are not sent (the call is text-only); the prompt says how
many were left out.
"""

from __future__ import annotations

import json

SYSTEM = ("You check one decision about the evidence below. Read the evidence and the options, then "
          "answer with a JSON object {\"label\": \"...\"} whose label is exactly one of the option labels. "
          "Write nothing else.")


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)


def answer_schema(labels) -> dict:
    """JSON schema of a valid answer: ``{"label": one of labels}``."""
    return {"type": "object", "properties": {"label": {"type": "string", "enum": list(labels)}},
            "required": ["label"], "additionalProperties": False}


def response_format(labels, mode: str) -> dict | None:
    """The ``response_format`` of the call (None for ``mode="none"``).

    ``json_schema`` is OpenAI's structured-outputs form; ``json_object`` with a ``schema`` is
    llama-cpp-python's server form (both become a grammar there).
    """
    schema = answer_schema(labels)
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "decision", "strict": True, "schema": schema}}
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    return None


def build_messages(request, question, answer=None, *, show_probabilities: bool = True) -> list[dict]:
    """Chat messages for one question.

    Args:
        request: the :class:`~noulengine.records.schema.Request` (its ``state`` and image count).
        question: the :class:`~noulengine.records.schema.Question` to answer.
        answer: the decision model's :class:`~noulengine.engine.decision.Answer` (its
            probabilities are shown when ``show_probabilities``), or None.
    """
    kind = {"choice": "pick one option", "score": "pick one level", "noul": "answer no or yes"}[question.type]
    lines = ["Evidence:", _text(request.state)]
    if request.images:
        lines.append(f"({len(request.images)} image(s) belong to this evidence but are not shown to you.)")
    lines += ["", f"Question ({kind}): {_text(question.instructions)}", "Options:"]
    for label, desc in zip(question.labels, question.descriptions):
        lines.append(f"- {json.dumps(label, ensure_ascii=False)}" + (f": {_text(desc)}" if desc not in (None, "") else ""))
    if show_probabilities and answer is not None:
        probs = ", ".join(f"{json.dumps(k, ensure_ascii=False)} {p:.2f}" for k, p in answer.probabilities.items())
        lines += ["", f"A fast decision model, unsure here, gave these probabilities: {probs}."]
    allowed = ", ".join(json.dumps(lab, ensure_ascii=False) for lab in question.labels)
    lines += ["", f"Answer with {{\"label\": ...}} where label is one of: {allowed}."]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def parse_label(text: str | None, labels) -> tuple[str | None, str | None]:
    """The candidate label an LLM answered, or why there is none.

    Accepts ``{"label": L}`` (structured output) or, for free-text answers, the bare label
    (surrounding whitespace and one pair of quotes ignored). Never guesses: a label that is not
    exactly a candidate is refused.

    Returns:
        ``(label, None)`` for a valid answer, ``(None, reason)`` otherwise.
    """
    if text is None or not text.strip():
        return None, "the LLM returned no text"
    raw = text.strip()
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        label = obj.get("label")
        if not isinstance(label, str):
            return None, f"the LLM's JSON has no string 'label': {raw[:200]!r}"
    elif isinstance(obj, str):
        label = obj
    else:
        label = raw
    if label in labels:
        return label, None
    return None, f"the LLM answered {label[:200]!r}, which is not one of the candidates {list(labels)}"
