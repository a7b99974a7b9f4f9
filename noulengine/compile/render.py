"""Prompt text for the state and for one question, per readout mode.

The wording is fixed and versioned (``PROMPT_VERSION``): a change alters every compiled prompt,
so it is recorded in evaluation metadata.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from noulengine.records.schema import Question, canonical_json

PROMPT_VERSION = "noul-prompt-2"  # 2: whole-prompt tokenization (no merges lost at the state/question boundary)


def render_state(state: Any) -> str:
    """The shared prefix text: a plain string as is, any other JSON value as compact JSON."""
    body = state if isinstance(state, str) else canonical_json(state)
    return f"Read the evidence, then answer the question about it.\n\nEvidence:\n{body}\n\n"


def _instructions(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _line(name: str, desc: str | None) -> str:
    return f"{name}: {desc}" if desc else name


def render_question(q: Question, mode: str, order: Sequence[int], symbols: Sequence[str] = ()) -> str:
    """Text of one question branch (before the template tail).

    Args:
        q: the question.
        mode: ``"symbols"``, ``"label-token"`` or ``"label-sequence"``.
        order: candidate indices in display order (a rotation for permutation debiasing).
        symbols: symbols by display slot (symbols mode only).
    """
    lines = [f"Question: {_instructions(q.instructions)}"]
    if q.type == "noul":
        no, yes = q.descriptions
        if yes or no:
            lines.append(f"yes: {yes or 'the statement holds'}")
            lines.append(f"no: {no or 'it does not hold'}")
        lines.append("Answer yes or no.")
    elif q.type == "score":
        lines.append("Levels:")
        lines += [_line(q.labels[k], q.descriptions[k]) for k in order]
        lines.append("Answer with the level number only.")
    elif mode == "symbols":
        lines.append("Options:")
        lines += [f"{symbols[slot]}. {_line(q.labels[k], q.descriptions[k])}" for slot, k in enumerate(order)]
        lines.append("Answer with the option's symbol only.")
    else:
        lines.append("Options:")
        lines += [f"- {_line(q.labels[k], q.descriptions[k])}" for k in order]
        lines.append("Answer with the option name only.")
    return "\n".join(lines)
