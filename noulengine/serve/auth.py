"""API-key checks: ``Authorization: Bearer <key>`` or ``x-api-key: <key>``, compared in constant time."""

from __future__ import annotations

import hmac

from noulengine.serve.responses import ApiError


def presented_key(headers) -> str | None:
    """The key a client sent, or None."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def check_key(headers, expected: str | None) -> None:
    """Raise 401 ``authentication_error`` unless ``expected`` is None or the right key was sent.

    Without a configured key any Authorization header is ignored (SDKs always send one).
    """
    if expected is None:
        return
    got = presented_key(headers)
    if got is None:
        raise ApiError(401, "authentication_error", "missing API key: send 'Authorization: Bearer <key>'",
                       {"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(got.encode("utf-8"), expected.encode("utf-8")):
        raise ApiError(401, "authentication_error", "invalid API key", {"WWW-Authenticate": "Bearer"})
