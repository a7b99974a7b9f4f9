"""Strict JSON responses and the two error shapes of the HTTP contract.

* validation errors: 422 ``{"detail": [{"loc": ["body", ...], "msg", "type"}]}``;
* other errors: ``{"detail": {"error_type", "message"}}`` with their own status.

Bodies are rendered with ``allow_nan=False``: NaN or Infinity can never reach a client. Text that
an error echoes from the request (a ``loc`` entry, a message) is made printable UTF-8 first
(:func:`safe_text`): a lone surrogate there would otherwise fail while the error is rendered.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response


def safe_text(value: Any) -> Any:
    """A string that UTF-8 can encode: lone surrogates become backslash escapes such as ``\\ud800`` (other values as they are)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


class FiniteJSONResponse(Response):
    """``application/json`` rendered strictly: a non-finite float raises ``ValueError``."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class ApiError(Exception):
    """An error answered as ``{"detail": {"error_type", "message"}}`` with ``status``."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        message = safe_text(message)
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}

    def response(self) -> FiniteJSONResponse:
        """The JSON response for this error."""
        return FiniteJSONResponse({"detail": {"error_type": self.error_type, "message": self.message}},
                                  status_code=self.status, headers=self.headers)


class ValidationFailure(Exception):
    """A request body that breaks a rule: answered 422 with ``detail[]``."""

    def __init__(self, loc: list, msg: str, type_: str = "value_error"):
        msg = safe_text(msg)
        super().__init__(msg)
        self.items = [{"loc": ["body", *(safe_text(x) for x in loc)], "msg": msg, "type": type_}]

    def response(self) -> FiniteJSONResponse:
        """The 422 response for this failure."""
        return FiniteJSONResponse({"detail": self.items}, status_code=422)


def loc_from_field(field: str | None, question_ids=()) -> list:
    """Turn a dotted field path (``questions.q.1.criteria``) into a loc list, keeping question
    ids that themselves contain dots whole (the longest id that matches wins)."""
    if not field:
        return []
    head, _, rest = field.partition(".")
    if head == "questions" and rest:
        for qid in sorted(question_ids, key=len, reverse=True):
            if rest == qid or rest.startswith(qid + "."):
                tail = rest[len(qid) + 1:]
                return ["questions", qid, *(tail.split(".") if tail else [])]
    if "[" in head and head.endswith("]"):  # images[0]
        name, _, idx = head[:-1].partition("[")
        out: list = [name, int(idx) if idx.isdigit() else idx]
        return out + (rest.split(".") if rest else [])
    return [head, *(rest.split(".") if rest else [])]


def record_error_failure(exc, question_ids=()) -> ValidationFailure:
    """A :class:`~noulengine.records.errors.RecordError` as a 422 failure naming field and rule."""
    rule = getattr(exc, "rule", None) or str(exc)
    field = getattr(exc, "field", None)
    msg = f"field {field!r}: {rule}" if field else rule
    return ValidationFailure(loc_from_field(field, question_ids), msg, "value_error")


class InternalErrorMiddleware:
    """ASGI middleware answering an exception no handler took with 500 ``internal_error`` (naming
    only its type) and keeping the connection open.

    Starlette's own last-resort handler sends the 500 and then re-raises, and uvicorn closes a
    connection whose application raised: a keep-alive client then saw its next request reset. An
    exception after the response started (a stream) is re-raised: that connection cannot be saved.
    """

    def __init__(self, app, *, log=None):
        self.app = app
        self.log = log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_wrapper(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as exc:  # noqa: BLE001 - the last resort: one 500, the connection kept
            if started:
                raise
            if self.log is not None:
                self.log.exception("internal error on %s", scope.get("path", ""))
            response = FiniteJSONResponse({"detail": {"error_type": "internal_error", "message": type(exc).__name__}},
                                          status_code=500)
            await response(scope, receive, send_wrapper)
