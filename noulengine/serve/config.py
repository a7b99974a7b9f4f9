"""Server settings (what ``noulengine serve`` flags turn into)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

LOOPBACK_NAMES = ("localhost",)

# Questions per request accepted by each route unless ``--max-questions`` says otherwise. The
# 16 of /v1/decide is a service default (one request should stay one affordable forward pass);
# /v1/systemone admits Jev-protocol clients, whose frozen tests send up to 20 questions. Records
# themselves have no count rule: the context window and the packed-token budget bound them.
DEFAULT_MAX_QUESTIONS = {"decide": 16, "systemone": 64}
ROUTES = {"decide": "/v1/decide", "systemone": "/v1/systemone"}

# LoRA adapters (serve/adapters.py): at most this many loaded at once (least recently used unloaded
# first), each at most this many bytes of factors, so adapters hold at most their product in memory
DEFAULT_MAX_LOADED = 8
DEFAULT_MAX_ADAPTER_BYTES = 256 * 2**20  # a rank-16 SmolLM2-135M adapter of 84 modules is 7.5 MiB


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
        aliases: model names accepted besides ``model_name``: Jev's public model names, so Jev-protocol
            harnesses and SDKs address this server without configuration (``jev-latest``, the SDKs'
            default, and ``noul``, what the ``jevbench`` harness sends); listed as ``x_aliases``.
        max_questions: questions per request accepted by each route (``"decide"``,
            ``"systemone"``); a route missing from the mapping, or mapped to None, has no cap.
            More get 422 ``too_long`` naming the cap.
        escalation: an :class:`~noulengine.escalate.EscalationConfig` (``--escalate-url``):
            ``/v1/decide`` may hand doubtful questions to that LLM; None: a request asking for
            escalation gets 400 ``escalation_unavailable``.
        escalate_by_default: with ``escalation``, whether a request that does not say
            ``"escalate"`` is escalated.
        adapters: ``{name: folder}`` LoRA adapters served from the start (``--adapter NAME=PATH``).
        adapter_root: the folder ``POST /v1/adapters`` may load from (``--adapter-root``); None:
            no loading at run time (and adapters named in ``adapters`` cannot be deleted over HTTP).
        max_loaded_adapters: adapters loaded at once at most, least recently used unloaded first
            (``--max-loaded-adapters``, default 8); None: no limit.
        max_adapter_bytes: one adapter's factors at most, in bytes as stored, read from the
            safetensors header before the weights (``--max-adapter-bytes``, default 256 MiB); None:
            no cap. With ``max_loaded_adapters`` it bounds the adapters' memory.
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
    aliases: tuple[str, ...] = ("jev-latest", "noul")
    release_date: str = "unknown"
    description: str = "noulengine decision model"
    max_questions: dict = field(default_factory=lambda: dict(DEFAULT_MAX_QUESTIONS))
    escalation: object | None = None
    adapters: dict = field(default_factory=dict)
    adapter_root: str | None = None
    max_loaded_adapters: int | None = DEFAULT_MAX_LOADED
    max_adapter_bytes: int | None = DEFAULT_MAX_ADAPTER_BYTES
    escalate_by_default: bool = True

    def question_cap(self, route: str) -> int | None:
        """The configured question cap of ``route`` (``"decide"`` or ``"systemone"``), or None."""
        return self.max_questions.get(route)


def parse_max_questions(values: list[str] | None) -> dict:
    """``--max-questions`` values -> ``{route: cap or None}`` over :data:`DEFAULT_MAX_QUESTIONS`.

    Each value is ``N`` (every route), ``ROUTE=N`` (one route: ``decide`` or ``systemone``), or
    ``none`` / ``ROUTE=none`` (no cap); later values override earlier ones.

    Raises:
        ValueError: an unknown route, or a cap that is not a positive integer or ``none``.
    """
    caps = dict(DEFAULT_MAX_QUESTIONS)
    for value in values or []:
        route, sep, num = value.rpartition("=")
        routes = [route] if sep else list(caps)
        if sep and route not in ROUTES:
            raise ValueError(f"--max-questions {value!r}: unknown route {route!r}; routes are {sorted(ROUTES)}")
        if num.strip().lower() == "none":
            cap = None
        else:
            try:
                cap = int(num)
            except ValueError:
                cap = 0
            if cap < 1:
                raise ValueError(f"--max-questions {value!r}: the cap must be a positive integer or 'none'")
        for r in routes:
            caps[r] = cap
    return caps


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
