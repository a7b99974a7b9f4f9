"""Training data: canonical records with targets, checked up front, and option-order augmentation.

A training file is canonical JSONL (the same format evaluation reads). Every rule below is
checked for every row before any training starts, and all violations are reported together,
each naming file, line, record id, field and rule; nothing is skipped:

* the line parses as a canonical record (the record parser's rules: targets must be candidates,
  ...), and its id is not repeated;
* the row has no ``validation_role`` (calibration and selection rows never feed training);
* every question has a target (``targets[field].label``, or ``probabilities`` with soft targets);
* neither the id nor the normalised state text occurs in a pinned evaluation suite
  (:mod:`noulengine.train.contamination`);
* the row compiles within the context window (an overlength row is an error, never truncated).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from noulengine.records.errors import NoulEngineError, RecordError
from noulengine.records.loader import load_records
from noulengine.records.schema import Question, Record, Request


class TrainingDataError(NoulEngineError, ValueError):
    """One or more training rows break a rule; ``errors`` holds one :class:`RecordError` each."""

    def __init__(self, errors: list[RecordError], *, what: str = "training"):
        # in file and line order (parse errors are found before rule errors; a reader scans by line)
        self.errors = errors = sorted(errors, key=_error_position)
        shown = "\n".join(f"  {e}" for e in errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        super().__init__(f"{len(errors)} {what} row(s) refused; nothing was trained:\n{shown}{more}")


def _error_position(err: RecordError) -> tuple:
    """Sort key: errors without a line first, then by file and line (stable within a line)."""
    line = getattr(err, "line", None)
    return (line is not None, str(getattr(err, "file", None) or ""), line if line is not None else 0)


@dataclass(frozen=True)
class TrainRow:
    """A checked training record.

    Attributes:
        record: the parsed record (its request is what reaches the model).
        line: its 1-based line in the file.
        gold: per question (request order), the gold label.
        soft: per question, the gold distribution over labels (criteria order) or None.
    """

    record: Record
    line: int
    gold: tuple[str | None, ...]
    soft: tuple[tuple[float, ...] | None, ...]

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def num_questions(self) -> int:
        return len(self.record.request.questions)


def load_training_rows(path: str | Path, *, index=None, soft_targets: bool = False,
                       role: str | None = None) -> list[TrainRow]:
    """Load and check a training (``role=None``) or selection (``role="selection"``) file.

    Args:
        path: canonical JSONL.
        index: an :class:`~noulengine.train.contamination.EvaluationIndex`; None skips the
            evaluation-overlap rule (tests only; the trainer always passes one).
        soft_targets: accept ``targets[field].probabilities`` in place of a label.
        role: None for training rows (a ``validation_role`` is refused); ``"selection"`` to
            read a selection file (every row must have that role).

    Raises:
        TrainingDataError: listing every bad row.
    """
    path = Path(path)
    loaded = load_records(path)
    errors: list[RecordError] = list(loaded.errors)
    rows: list[TrainRow] = []
    for rec, line in zip(loaded.records, loaded.lines):
        def bad(fld, rule):
            errors.append(RecordError(rule, record_id=rec.id, field=fld, file=path, line=line))

        if role is None and rec.validation_role is not None:
            bad("validation_role", f"a {rec.validation_role!r} row cannot be a training row (validation rows "
                                   "only choose epochs or fit temperatures); move it to --selection or drop the role")
            continue
        if role is not None and rec.validation_role != role:
            bad("validation_role", f"expected {role!r}, got {rec.validation_role!r}")
            continue
        gold, soft, ok = [], [], True
        for q in rec.request.questions:
            t = rec.targets.get(q.field)
            if t is None or (t.label is None and not (soft_targets and t.probabilities)):
                need = "a label (or probabilities, with soft targets)" if soft_targets else "a label"
                bad(f"targets.{q.field}", f"every question of a training row needs a target with {need}")
                ok = False
                continue
            gold.append(t.label)
            soft.append(tuple(t.probabilities[lab] for lab in q.labels) if soft_targets and t.probabilities else None)
        if not ok:
            continue
        if index is not None:
            try:
                hit = index.overlap(rec.id, rec.request.state, rec.request.images)
            except RecordError as exc:  # an image that passed its header check but does not decode
                bad(exc.field or "images", exc.rule)
                continue
            if hit is not None:
                bad(*hit)
                continue
        rows.append(TrainRow(rec, line, tuple(gold), tuple(soft)))
    if errors:
        raise TrainingDataError(errors, what="selection" if role else "training")
    return rows


def permute_question(q: Question, rng: random.Random) -> Question:
    """The same question with its choice options in a random order.

    Labels keep their meaning; only the symbol each label is shown with moves (criteria order
    maps to A, B, ...), so a model must read the options instead of memorising "business = C".
    Score levels are ordinal and noul is fixed (no, yes): those are returned unchanged.
    """
    if q.type != "choice" or q.num_candidates < 2:
        return q
    order = list(range(q.num_candidates))
    rng.shuffle(order)
    return Question(q.field, q.type, q.instructions, tuple(q.labels[i] for i in order),
                    tuple(q.descriptions[i] for i in order))


def permuted_request(request: Request, rng: random.Random | None) -> Request:
    """``request`` with every choice question permuted by ``rng`` (unchanged when ``rng`` is None)."""
    if rng is None:
        return request
    return Request(state=request.state, questions=tuple(permute_question(q, rng) for q in request.questions),
                   images=request.images, id=request.id)
