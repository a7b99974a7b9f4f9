"""Errors raised for bad input. Each names where the problem is and which rule it breaks."""

from __future__ import annotations


class NoulEngineError(Exception):
    """Base class of every error noulengine raises on purpose."""


class RecordError(NoulEngineError, ValueError):
    """A record, request or question breaks a rule of the canonical format.

    Attributes:
        rule: what is wrong, as "expected X, got Y" where possible.
        record_id: the record's ``id`` (None when the record has none or it is unreadable).
        field: the dotted path of the offending field (``questions.q1.criteria``), or None.
        file: the file the record came from, or None.
        line: the 1-based line number in that file, or None.
    """

    def __init__(self, rule: str, *, record_id=None, field=None, file=None, line=None):
        self.rule = rule
        self.record_id = record_id
        self.field = field
        self.file = file
        self.line = line
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.file is not None:
            where.append(f"{self.file}:{self.line}" if self.line is not None else str(self.file))
        if self.record_id is not None:
            where.append(f"record {self.record_id!r}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return f"{', '.join(where)}: {self.rule}" if where else self.rule

    def located(self, file, line) -> "RecordError":
        """The same error with the file and line filled in."""
        return RecordError(self.rule, record_id=self.record_id, field=self.field, file=file, line=line)

    def to_dict(self) -> dict:
        return {"error_type": "record_error", "message": str(self), "record_id": self.record_id,
                "field": self.field, "rule": self.rule, "file": None if self.file is None else str(self.file),
                "line": self.line}


class SizeLimitError(RecordError):
    """A record field is larger than a size limit (an image's bytes, the images' total).

    A :class:`RecordError` (files and error rows treat it as any rule break); the HTTP service
    answers it with 413, like an over-limit body, because it is a size, not a shape, problem.

    Attributes:
        limit: the limit in bytes.
        actual: the offending size in bytes.
    """

    def __init__(self, rule: str, *, limit: int, actual: int, **where):
        self.limit, self.actual = int(limit), int(actual)
        super().__init__(rule, **where)


class UnsupportedModalityError(NoulEngineError, ValueError):
    """The request carries images but the loaded model is text-only."""

    field = "images"  # the request field at fault, for error rows


class OverlengthError(NoulEngineError, ValueError):
    """A compiled request needs more tokens than the model's context allows (never truncated)."""

    field = "state"  # the request field at fault, for error rows


class NonFiniteLogitsError(NoulEngineError, ArithmeticError):
    """The model produced NaN or infinite candidate logits for a question: never an answer.

    Attributes:
        field: the question whose candidate logits were non-finite.
        rule: ``"non-finite logits"``.
    """

    rule = "non-finite logits"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class TokenizerError(NoulEngineError):
    """The tokenizer cannot represent the readout protocol (a symbol is not one token, ...)."""
