"""The checks both POST routes run on a parsed body before their own rules.

``/v1/systemone`` and ``/v1/decide`` differ in what a question may hold (the Jev contract accepts
object descriptions and fills in missing instructions; the canonical format does not), but the
body's frame and its JSON values are checked here, once, for both: an object with ``state`` and a
non-empty ``questions`` object under the route's cap, every number finite (Python's ``json``
reads an out-of-range literal such as ``1e400`` as infinity) and every string and key valid
Unicode (a ``\\ud800`` escape is a lone surrogate, which no tokenizer or UTF-8 writer takes).
So a body one route refuses cleanly is refused by the other with the same ``loc``, and nothing
later (descriptions rendered as JSON, an error that echoes a question id) meets such a value.
"""

from __future__ import annotations

import math
from typing import Any

from noulengine.serve.limits import check_question_count
from noulengine.serve.responses import ValidationFailure

MAX_NESTING = 512
"""Objects and arrays nested deeper than this are refused. Python's ``json`` parses a body up to
roughly 950 levels, but rendering such a value again (a Jev description as JSON, the prompt)
recurses as deep from a deeper stack and could overflow it: a 500, not a rule."""


def _surrogate_at(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_json_values(value: Any, loc: list, *, name_depth: int = 0) -> None:
    """Refuse a non-finite number, or a string or object key with a lone surrogate, anywhere in
    ``value`` (the first in document order), with the ``loc`` of the offending value (of the
    object, for a key), and a value more than :data:`MAX_NESTING` levels below the body (``loc``
    is where ``value`` sits in the body; the error names ``loc`` and ``name_depth`` entries
    more, e.g. the question). Iterative, and each value holds only a link to its parent's place,
    so neither deep nor wide bodies cost more than one pass.

    Raises:
        ValidationFailure: 422 ``finite_number``, ``string_unicode`` or ``too_deep``.
    """
    base = len(loc)

    def where(place) -> list:  # place: (parent place, key) or None for ``value`` itself
        keys = []
        while place is not None:
            place, key = place
            keys.append(key)
        return [*loc, *reversed(keys)]

    # (value, its place, its depth below the body, whether its key (the place's last entry) is to be checked)
    stack: list[tuple[Any, Any, int, bool]] = [(value, None, base, False)]
    while stack:
        item, place, depth, keyed = stack.pop()
        if depth > MAX_NESTING:
            raise ValidationFailure(where(place)[:base + name_depth], f"objects and arrays may nest at most "
                                                                      f"{MAX_NESTING} levels deep in a body", "too_deep")
        if keyed and isinstance(place[1], str):  # an object key, checked before its value
            at = _surrogate_at(place[1])
            if at is not None:
                raise ValidationFailure(where(place[0]), f"a key in this object is not valid Unicode (lone surrogate "
                                                         f"at position {at} of {place[1]!r})", "string_unicode")
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValidationFailure(where(place), f"non-finite number {item!r} is not valid JSON (a number out "
                                                      "of the float range, such as 1e400, reads as infinity)",
                                        "finite_number")
        elif isinstance(item, str):
            at = _surrogate_at(item)
            if at is not None:
                raise ValidationFailure(where(place), f"string is not valid Unicode (lone surrogate at position {at})",
                                        "string_unicode")
        elif isinstance(item, dict):
            stack.extend((v, (place, k), depth + 1, True) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, (place, i), depth + 1, False) for i, v in reversed(list(enumerate(item))))


def check_body(body: Any, route: str, max_questions: int | None) -> dict:
    """The frame both POST routes share; returns the ``questions`` object.

    Args:
        body: the parsed JSON body.
        route: ``"/v1/systemone"`` or ``"/v1/decide"`` (named in the question-cap message).
        max_questions: the route's cap, or None.

    Raises:
        ValidationFailure: not an object, no ``state``, ``questions`` missing, not an object or
            empty, more questions than the cap, an empty question id, or a bad JSON value
            (:func:`check_json_values`: non-finite, lone surrogate, too deep) in ``state`` or
            ``questions``.
    """
    if not isinstance(body, dict):
        raise ValidationFailure([], f"the body must be a JSON object, got {type(body).__name__}", "model_attributes_type")
    if "state" not in body:
        raise ValidationFailure(["state"], "state is required (a string, object or array)", "missing")
    qs = body.get("questions")
    if not isinstance(qs, dict):
        raise ValidationFailure(["questions"], "questions is required: an object of question id -> question",
                                "missing" if qs is None else "dict_type")
    if not qs:
        raise ValidationFailure(["questions"], "questions must not be empty", "too_short")
    check_question_count(qs, max_questions, route)
    if "" in qs:
        raise ValidationFailure(["questions"], "question ids must be non-empty strings", "string_too_short")
    check_json_values(body["state"], ["state"])  # the canonical parser's order: state, then questions
    check_json_values(qs, ["questions"], name_depth=1)
    return qs
