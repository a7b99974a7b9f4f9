"""Prompt text for the state and for one question, per readout mode.

The wording is fixed and versioned (``PROMPT_VERSION``): a change alters every compiled prompt,
so it is recorded in evaluation metadata.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from noulengine.records.schema import Question, canonical_json

# 3: score levels read by their own text under the label readouts ("- can wait" lines, "Answer with
#    the level text only."; issue #22); 2: whole-prompt tokenization (no merges lost at the
#    state/question boundary)
PROMPT_VERSION = "noul-prompt-3"

LABEL_READOUTS = ("label-token", "label-sequence")


def render_state(state: Any) -> str:
    """The shared prefix text: a plain string as is, any other JSON value as compact JSON."""
    body = state if isinstance(state, str) else canonical_json(state)
    return f"Read the evidence, then answer the question about it.\n\nEvidence:\n{body}\n\n"


def _instructions(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _line(name: str, desc: str | None) -> str:
    return f"{name}: {desc}" if desc else name


def level_texts(q: Question) -> tuple[str, ...] | None:
    """A score question's level texts: its descriptions, lowest level first, without leading and
    trailing whitespace (an answer starts at the answer cue, so a leading space or newline would
    merge with it), when every level has a non-blank one and no two are the same; otherwise None
    (the levels are then read as digits, which is what tells such levels apart)."""
    if q.type != "score" or any(d is None for d in q.descriptions):
        return None
    texts = tuple(d.strip() for d in q.descriptions)
    if not all(texts) or len(set(texts)) != len(texts):
        return None
    return texts


def reads_level_texts(q: Question, mode: str) -> bool:
    """Whether ``q`` is a score question read by its level texts under ``mode``: a label readout
    (``label-token``, ``label-sequence``) and :func:`level_texts` gives texts."""
    return mode in LABEL_READOUTS and level_texts(q) is not None


def candidate_texts(q: Question, mode: str) -> tuple[str, ...]:
    """The text each candidate is read by under a label readout, in candidate order.

    The rule, one place for the compiler's first tokens (``label-token``: each text's first token
    and its capitalised spelling's), label sequences (``label-sequence``: each text + the
    end-of-answer token) and the rendered question:

    * a score question whose levels all have distinct non-blank descriptions
      (:func:`level_texts`), under a label readout: those descriptions ("can wait", "this week",
      "today"; stripped), lowest level first, instead of digits that carry no meaning;
    * any other question: its labels (choice: the option names; score without level texts: the
      digits ``"0".."n-1"``; noul: ``"no"``/``"yes"``, which label-token reads as the fixed words
      no/No and yes/Yes).

    ``symbols`` mode reads its own symbols by display slot, not these texts. Candidates stay keyed
    by ``q.labels`` (a score decision by ``"0".."n-1"``) whatever text is read.
    """
    return level_texts(q) if reads_level_texts(q, mode) else q.labels


def render_question(q: Question, mode: str, order: Sequence[int], symbols: Sequence[str] = ()) -> str:
    """Text of one question branch (before the template tail).

    Args:
        q: the question.
        mode: ``"symbols"``, ``"label-token"`` or ``"label-sequence"``. A score question read by its
            level texts (:func:`reads_level_texts`) lists them lowest first as ``- <text>`` lines
            without digits; any other score question lists ``<digit>: <description>`` lines.
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
    elif q.type == "score" and reads_level_texts(q, mode):
        texts = candidate_texts(q, mode)
        lines.append("Levels:")
        lines += [f"- {texts[k]}" for k in order]
        lines.append("Answer with the level text only.")
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
