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

# Prompt layouts (the order of a prompt's parts; part of the prompt version):
#   state-first:  HEAD + state + question + TAIL, one branch per question (the questions follow
#                 the state, so requests share only HEAD);
#   schema-first: HEAD + every question (instructions, options, descriptions) + state + a short cue
#                 per question + TAIL (the static questions come first, so requests asking the same
#                 questions share them and a prefix cache serves them; issue #32).
LAYOUTS = ("state-first", "schema-first")
DEFAULT_LAYOUT = "state-first"


def prompt_version(layout: str = DEFAULT_LAYOUT) -> str:
    """The prompt version of a layout: ``PROMPT_VERSION`` for state-first (unchanged, so models
    trained before layouts existed keep their version), ``PROMPT_VERSION + "+schema-first"``
    otherwise.

    Raises:
        ValueError: an unknown layout.
    """
    check_layout(layout)
    return PROMPT_VERSION if layout == "state-first" else f"{PROMPT_VERSION}+{layout}"


def check_layout(layout: str) -> str:
    """``layout`` itself when it is one of :data:`LAYOUTS`.

    Raises:
        ValueError: naming the allowed layouts.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    return layout


def layout_of_prompt_version(version: str | None) -> str:
    """The layout a recorded prompt version was compiled with (state-first for versions recorded
    before layouts existed, or None)."""
    if version and "+" in version:
        return check_layout(version.split("+", 1)[1])
    return "state-first"


def _state_body(state: Any) -> str:
    """A state as prompt text: a plain string as is, any other JSON value as compact JSON."""
    return state if isinstance(state, str) else canonical_json(state)


def render_state(state: Any) -> str:
    """The state-first layout's shared prefix text."""
    return f"Read the evidence, then answer the question about it.\n\nEvidence:\n{_state_body(state)}\n\n"


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


def _question_body(q: Question, mode: str, order: Sequence[int], symbols: Sequence[str]) -> list[str]:
    """The lines after a question's instructions that list its candidates (with descriptions)."""
    lines: list[str] = []
    if q.type == "noul":
        no, yes = q.descriptions
        if yes or no:
            lines.append(f"yes: {yes or 'the statement holds'}")
            lines.append(f"no: {no or 'it does not hold'}")
    elif q.type == "score" and reads_level_texts(q, mode):
        texts = candidate_texts(q, mode)
        lines.append("Levels:")
        lines += [f"- {texts[k]}" for k in order]
    elif q.type == "score":
        lines.append("Levels:")
        lines += [_line(q.labels[k], q.descriptions[k]) for k in order]
    elif mode == "symbols" and symbols:
        lines.append("Options:")
        lines += [f"{symbols[slot]}. {_line(q.labels[k], q.descriptions[k])}" for slot, k in enumerate(order)]
    else:
        lines.append("Options:")
        lines += [f"- {_line(q.labels[k], q.descriptions[k])}" for k in order]
    return lines


def _answer_line(q: Question, mode: str) -> str:
    """The last line of a question's branch: what form the answer takes."""
    if q.type == "noul":
        return "Answer yes or no."
    if q.type == "score":
        return "Answer with the level text only." if reads_level_texts(q, mode) else "Answer with the level number only."
    return "Answer with the option's symbol only." if mode == "symbols" else "Answer with the option name only."


def render_question(q: Question, mode: str, order: Sequence[int], symbols: Sequence[str] = ()) -> str:
    """Text of one question branch of the state-first layout (before the template tail).

    Args:
        q: the question.
        mode: ``"symbols"``, ``"label-token"`` or ``"label-sequence"``. A score question read by its
            level texts (:func:`reads_level_texts`) lists them lowest first as ``- <text>`` lines
            without digits; any other score question lists ``<digit>: <description>`` lines.
        order: candidate indices in display order (a rotation for permutation debiasing).
        symbols: symbols by display slot (symbols mode only).
    """
    lines = [f"Question: {_instructions(q.instructions)}"]
    lines += _question_body(q, mode, order, symbols)
    lines.append(_answer_line(q, mode))
    return "\n".join(lines)


# -- schema-first layout --------------------------------------------------------------------

SCHEMA_PREAMBLE = "Answer each question about the evidence.\n\n"


def _field_name(q: Question) -> str:
    return json.dumps(q.field, ensure_ascii=False)


def render_schema(questions: Sequence[Question], modes: Sequence[str]) -> str:
    """The schema-first layout's static text: every question in request order, with its
    instructions, its candidates' descriptions (the options in the request's own order; under
    ``symbols`` no symbols, since a branch assigns them per view) and the form its answer takes,
    before the state.

    Args:
        questions: the request's questions, in request order.
        modes: the readout mode of each question (decides how score levels are listed).
    """
    blocks = []
    for q, mode in zip(questions, modes):
        lines = [f"Question {_field_name(q)}: {_instructions(q.instructions)}"]
        lines += _question_body(q, mode, range(q.num_candidates), ())
        lines.append(_answer_line(q, mode))
        blocks.append("\n".join(lines))
    return SCHEMA_PREAMBLE + "\n\n".join(blocks) + "\n\n"


def render_evidence(state: Any) -> str:
    """The schema-first layout's state text (after the schema, before the cues)."""
    return f"Evidence:\n{_state_body(state)}\n\n"


def render_cue(q: Question, mode: str, order: Sequence[int], symbols: Sequence[str] = ()) -> str:
    """Text of one question branch of the schema-first layout: the field's name and its candidate
    labels in display ``order`` (no descriptions: those are in the schema), so the labels stay next
    to the answer: ``Answer "route" (billing | shipping | tech):``. Symbols (``symbols`` mode) are
    assigned here, per view (``A. billing | B. shipping``); a noul question lists ``no | yes``.
    """
    if q.type == "score" and reads_level_texts(q, mode):
        texts = candidate_texts(q, mode)
        names = [texts[k] for k in order]
    elif q.type == "choice" and mode == "symbols":
        names = [f"{symbols[slot]}. {q.labels[k]}" for slot, k in enumerate(order)]
    else:
        names = [q.labels[k] for k in order]
    return f"Answer {_field_name(q)} ({' | '.join(names)}):"
