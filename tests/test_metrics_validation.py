"""Answer validation rules."""

import math

import pytest

from noulengine.metrics.validation import InvalidAnswerError, answer_probabilities, check_answer, validate_answer

LABELS = ["a", "b", "c"]


def ans(**probs):
    return {"type": "choice", "labels": LABELS, "probabilities": probs}


def test_valid_answer_has_no_problems():
    assert validate_answer(ans(a=0.5, b=0.3, c=0.2), LABELS) == []
    assert validate_answer(ans(a=0.5, b=0.3, c=0.205), LABELS) == []  # within 0.01


@pytest.mark.parametrize("answer, rule", [
    ("nope", "answer must be an object"),
    ({"probabilities": [0.5, 0.5]}, "'probabilities' must be"),
    (ans(a=0.5, b=0.5), "every candidate must be present"),
    (ans(a=0.5, b=0.3, c=0.2, d=0.0), "unknown labels"),
    (ans(a=math.nan, b=0.5, c=0.5), "must be finite"),
    (ans(a=math.inf, b=0.0, c=0.0), "must be finite"),
    (ans(a=1.2, b=-0.2, c=0.0), "within [0, 1]"),
    (ans(a=True, b=0.0, c=0.0), "must be a number"),
    (ans(a="0.5", b=0.5, c=0.0), "must be a number"),
    (ans(a=0.5, b=0.3, c=0.1), "sum to 1 within 0.01"),
    ({"labels": ["c", "b", "a"], "probabilities": {"a": 0.5, "b": 0.3, "c": 0.2}}, "'labels' must be"),
])
def test_each_rule_is_named(answer, rule):
    problems = validate_answer(answer, LABELS)
    assert problems and any(rule in p for p in problems), problems


def test_check_answer_raises_with_every_problem():
    with pytest.raises(InvalidAnswerError) as info:
        check_answer(ans(a=1.5, b=-0.2, c=0.0), LABELS)
    assert len(info.value.problems) == 3  # two out of range, and the sum (1.3)


def test_normalised_copy_leaves_raw_answer_alone():
    a = ans(a=0.5, b=0.3, c=0.205)
    p = answer_probabilities(a, LABELS)
    assert sum(p) == pytest.approx(1.0, abs=1e-15)
    assert p[0] == pytest.approx(0.5 / 1.005)
    assert a["probabilities"]["c"] == 0.205
