"""Escalation settings (what ``--escalate-*`` flags and the HTTP ``escalate`` option turn into)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from urllib.parse import urlsplit

API_KEY_ENV = "NOULENGINE_ESCALATE_API_KEY"
RESPONSE_FORMATS = ("auto", "json_schema", "json_object", "none")
MAX_SECONDS = 7 * 24 * 3600.0  # a week: any larger timeout or deadline is a mistake (and 1e400 is not a number)


def _number(v) -> bool:
    """A finite real number that is not a bool (``True`` is an ``int`` in Python)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an int too large for a float
        return False


@dataclass(frozen=True)
class EscalationConfig:
    """Where and when to escalate.

    Attributes:
        url: the endpoint's base URL, up to and including ``/v1`` (``http://127.0.0.1:8080/v1``);
            ``/chat/completions`` is appended.
        model: the ``model`` sent in each call (llama.cpp's server accepts any name).
        below: a question whose confidence (max p, after temperature) is strictly under this is
            escalated; in (0, 1].
        api_key_env: the environment variable holding the API key (sent as ``Authorization:
            Bearer``); unset or empty sends none. The key itself is never stored here or logged.
        timeout_s: seconds one call may take (connect + answer); past it the model's answer stands.
        max_concurrent: LLM calls in flight at once (all requests together).
        max_per_request: escalations per request at most, least confident first; the rest keep
            the model's answer, flagged ``budget``.
        deadline_s: seconds a request's escalations may take in all; calls still running then are
            cancelled and keep the model's answer, flagged ``deadline``.
        max_tokens: completion tokens per call (a JSON label needs few).
        response_format: ``json_schema`` (OpenAI's structured outputs, also vLLM's and llama.cpp's
            ``llama-server``: the label is an enum), ``json_object`` (llama-cpp-python's server:
            ``{"type": "json_object", "schema": ...}``), ``none`` (free text, validated after),
            or ``auto``: ``json_schema``, and ``json_object`` from then on if the endpoint refuses
            that form (a 4xx, or an error naming response_format).
        temperature: sampling temperature of the LLM (0: greedy).
        show_probabilities: give the LLM the decision model's probabilities as context.

    Raises:
        ValueError: (on construction) a value out of range, naming the field.
    """

    url: str
    model: str = "default"
    below: float = 0.7
    api_key_env: str = API_KEY_ENV
    timeout_s: float = 30.0
    max_concurrent: int = 4
    max_per_request: int = 8
    deadline_s: float = 120.0
    max_tokens: int = 32
    response_format: str = "auto"
    temperature: float = 0.0
    show_probabilities: bool = True

    def __post_init__(self):
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"escalation url must start with http:// or https://, got {self.url!r}")
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises ValueError for a malformed port
        except ValueError as exc:
            raise ValueError(f"escalation url {self.url!r} is malformed: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"escalation url {self.url!r} has no host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("escalation url must not carry credentials (user:password@): they would be written "
                             f"to reports; put the key in ${self.api_key_env} instead")
        if not (_number(self.below) and 0.0 < self.below <= 1.0):
            raise ValueError(f"escalation 'below' must be a number in (0, 1], got {self.below!r}")
        for name in ("timeout_s", "deadline_s"):
            v = getattr(self, name)
            if not (_number(v) and 0 < v <= MAX_SECONDS):
                raise ValueError(f"escalation {name!r} must be a positive number of seconds (at most "
                                 f"{MAX_SECONDS:g}), got {v!r}")
        for name in ("max_concurrent", "max_per_request", "max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "max_per_request" else 1):
                raise ValueError(f"escalation {name!r} must be a positive integer, got {v!r}")
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(f"escalation response_format must be one of {list(RESPONSE_FORMATS)}, "
                             f"got {self.response_format!r}")

    @property
    def api_key(self) -> str | None:
        """The key from ``api_key_env``, or None."""
        return os.environ.get(self.api_key_env) or None

    def with_overrides(self, options: dict | None) -> "EscalationConfig":
        """A copy with a request's options applied: ``below`` (any threshold in (0, 1]), ``max``
        and ``deadline_s`` (which may only lower the server's budgets, never raise them); an
        option given as null keeps the server's value.

        Raises:
            ValueError: an unknown option, a value out of range, or a budget above the server's
                (naming it).
        """
        options = {k: v for k, v in (options or {}).items() if v is not None}
        if not options:
            return self
        allowed = {"below": "below", "max": "max_per_request", "deadline_s": "deadline_s"}
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"unknown escalate option {unknown[0]!r}; options are {sorted(allowed)}")
        out = replace(self, **{allowed[k]: v for k, v in options.items()})
        for key, attr in (("max", "max_per_request"), ("deadline_s", "deadline_s")):
            if key in options and getattr(out, attr) > getattr(self, attr):
                raise ValueError(f"escalate option {key!r} may only lower this server's budget "
                                 f"({getattr(self, attr):g}), got {options[key]!r}")
        return out

    def to_dict(self) -> dict:
        """JSON-able settings (the API key's variable name, never the key)."""
        return asdict(self)
