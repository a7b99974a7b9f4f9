"""Server settings (what ``noulengine serve`` flags turn into)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LOOPBACK_NAMES = ("localhost",)


@dataclass
class ServeConfig:
    """HTTP service settings.

    Attributes:
        model_name: the name answered in ``model`` and listed by ``GET /v1/models``.
        api_key: the key clients must send (``Authorization: Bearer`` or ``x-api-key``), or None.
        max_batch_tokens: padded-token budget of one forward pass; also caps how many queued
            requests (by estimated tokens) the worker gathers into one engine call. ``1`` turns
            dynamic batching off (one request per pass).
        max_batch_requests: requests gathered into one engine call at most.
        max_wait_ms: how long the worker waits for more requests after the first one arrives.
        max_queue: requests waiting or running at most; more get 429 with Retry-After.
        max_body_bytes: request bodies larger than this get 413.
        body_timeout_s: a request body not fully received within this many seconds gets 408.
        request_timeout_s: a request not answered within this many seconds gets 503.
        aliases: model names accepted besides ``model_name`` (the Jev SDKs' default alias).
    """

    model_name: str = "noulengine"
    api_key: str | None = None
    max_batch_tokens: int = 8192
    max_batch_requests: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 256
    max_body_bytes: int = 48 * 1024 * 1024
    body_timeout_s: float = 30.0
    request_timeout_s: float = 300.0
    aliases: tuple[str, ...] = ("jev-latest",)
    release_date: str = "unknown"
    description: str = "noulengine decision model"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
