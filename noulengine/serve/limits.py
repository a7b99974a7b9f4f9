"""Request limits: bodies over ``max_body_bytes`` get 413, bodies that stall get 408, and
requests with more questions than a route's cap get 422 (:func:`check_question_count`).

The middleware reads the whole body up front (declared ``Content-Length`` checked first, then the
bytes actually received), under one deadline for the entire upload, then replays it to the app.
"""

from __future__ import annotations

import asyncio
import json
import time

from noulengine.serve.responses import ValidationFailure


def _error(status: int, error_type: str, message: str) -> tuple[dict, bytes]:
    body = json.dumps({"detail": {"error_type": error_type, "message": message}}).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"connection", b"close")]}
    return start, body


class BodyLimitMiddleware:
    """ASGI middleware enforcing a body size limit and an upload deadline."""

    def __init__(self, app, *, max_body_bytes: int, body_timeout_s: float):
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.body_timeout_s = float(body_timeout_s)

    async def _reject(self, send, status, error_type, message):
        start, body = _error(status, error_type, message)
        await send(start)
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return await self._reject(send, 413, "payload_too_large",
                                      f"request body is {int(declared)} bytes; the limit is {self.max_body_bytes}")
        chunks, size = [], 0
        deadline = time.monotonic() + self.body_timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
            except asyncio.TimeoutError:
                return await self._reject(send, 408, "request_timeout",
                                          f"request body not received within {self.body_timeout_s:g} s")
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return await self._reject(send, 413, "payload_too_large",
                                          f"request body exceeds the limit of {self.max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def check_question_count(questions: dict, max_questions: int | None, route: str) -> None:
    """Refuse more questions than a route's configured cap (a service setting, not a record rule).

    Raises:
        ValidationFailure: 422 ``too_long`` at ``["body", "questions"]``, naming the route, the cap,
            the count and the flag that sets it.
    """
    if max_questions is not None and len(questions) > max_questions:
        name = route.rsplit("/", 1)[-1]
        raise ValidationFailure(["questions"], f"at most {max_questions} questions per request on {route} "
                                               f"(this server's --max-questions {name}={max_questions}), "
                                               f"got {len(questions)}", "too_long")
