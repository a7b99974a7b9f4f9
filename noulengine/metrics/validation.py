"""Validation of one engine answer before it is scored.

An answer is the engine's output for one field::

    {"type": ..., "labels": [...], "probabilities": {label: p}, "confidence": float, "label": str}

Only ``probabilities`` is scored. It is valid when every rule holds:

* ``probabilities`` is a ``label -> number`` object (booleans are not numbers);
* ``labels``, when present, lists exactly the question's candidates in criteria order;
* every candidate label is present and no other label is;
* every probability is finite and within ``[0, 1]``;
* the probabilities sum to 1 within :data:`SUM_TOLERANCE` (0.01).

The raw answer is never modified; :func:`answer_probabilities` returns a normalised copy (summing
to exactly 1 up to rounding) for the generic metrics. An answer that breaks any rule is scored
as an error: not correct, and counted against coverage.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

SUM_TOLERANCE = 0.01


class InvalidAnswerError(ValueError):
    """An answer breaks at least one validation rule.

    Attributes:
        problems: one message per broken rule, each naming the rule.
    """

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def validate_answer(answer: Any, labels: Sequence[str]) -> list[str]:
    """List the rules that ``answer`` breaks for a question with candidates ``labels``.

    Args:
        answer: one field's engine output (a dict with a ``probabilities`` object).
        labels: the question's candidate labels, in criteria order.

    Returns:
        One message per problem, each naming the rule; an empty list means the answer is valid.
        Never raises for a malformed answer (that is reported as a problem).
    """
    if not isinstance(answer, dict):
        return [f"answer must be an object, got {type(answer).__name__}"]
    probs = answer.get("probabilities")
    if not isinstance(probs, dict):
        return [f"'probabilities' must be a label -> probability object, got {type(probs).__name__}"]
    problems: list[str] = []
    given = answer.get("labels")
    if given is not None and (not isinstance(given, (list, tuple)) or list(given) != list(labels)):
        problems.append(f"'labels' must be the question's candidates in order {list(labels)}, got {given!r}")
    missing = [lab for lab in labels if lab not in probs]
    if missing:
        problems.append(f"every candidate must be present: missing {missing}")
    extra = [lab for lab in probs if lab not in set(labels)]
    if extra:
        problems.append(f"only candidates may appear: unknown labels {extra}")
    total = 0.0
    numeric_ok = True
    for lab in labels:
        if lab not in probs:
            continue
        v = probs[lab]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            problems.append(f"probability of {lab!r} must be a number, got {type(v).__name__}")
            numeric_ok = False
            continue
        if not math.isfinite(v):
            problems.append(f"probability of {lab!r} must be finite, got {v!r}")
            numeric_ok = False
            continue
        if not 0.0 <= v <= 1.0:
            problems.append(f"probability of {lab!r} must be within [0, 1], got {v!r}")
        total += float(v)
    if numeric_ok and not missing and abs(total - 1.0) > SUM_TOLERANCE:
        problems.append(f"probabilities must sum to 1 within {SUM_TOLERANCE}, got {total:.6f}")
    return problems


def check_answer(answer: Any, labels: Sequence[str]) -> None:
    """Raise :class:`InvalidAnswerError` (listing every broken rule) when ``answer`` is invalid."""
    problems = validate_answer(answer, labels)
    if problems:
        raise InvalidAnswerError(problems)


def answer_probabilities(answer: dict, labels: Sequence[str]) -> list[float]:
    """The answer's probabilities in ``labels`` order, divided by their sum (a copy).

    Raises:
        InvalidAnswerError: when the answer breaks a validation rule.
    """
    check_answer(answer, labels)
    raw = [float(answer["probabilities"][lab]) for lab in labels]
    total = math.fsum(raw)
    return [v / total for v in raw]
