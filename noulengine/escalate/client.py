"""The call to an OpenAI-compatible ``/v1/chat/completions`` endpoint (httpx, async)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


class EscalationCallError(Exception):
    """A call failed: ``kind`` is ``timeout``, ``unreachable``, ``http_error`` or ``bad_response``."""

    def __init__(self, kind: str, message: str, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass
class ChatResult:
    """One completion: its text, token usage (as the server reports it) and wall-clock latency (s)."""

    text: str | None
    usage: dict = field(default_factory=dict)
    latency_s: float = 0.0
    model: str | None = None


def refuses_form(exc: EscalationCallError) -> bool:
    """True when an error says the endpoint does not take the ``json_schema`` form: a 400, 422 or
    500 whose body names ``response_format`` / ``json_schema`` (llama-cpp-python answers its own
    validation error with a 500). Rate limits, auth failures and a too-long prompt are not."""
    text = str(exc)
    return (exc.kind == "http_error" and exc.status in (400, 422, 500)
            and ("response_format" in text or "json_schema" in text))


class ChatClient:
    """An async client for one endpoint; one instance per event loop.

    Args:
        config: :class:`~noulengine.escalate.config.EscalationConfig` (url, model, key, timeout).
        transport: an ``httpx`` transport (tests may route to an ASGI app); None for the network.
    """

    def __init__(self, config, *, transport=None):
        import httpx

        self.config = config
        headers = {"Content-Type": "application/json"}
        key = config.api_key
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.mode = config.response_format  # "auto" resolves on the first refusal
        self._client = httpx.AsyncClient(base_url=config.url.rstrip("/"), headers=headers, transport=transport,
                                         timeout=httpx.Timeout(config.timeout_s))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def complete_labels(self, messages: list[dict], labels) -> ChatResult:
        """One chat completion constrained to ``{"label": one of labels}`` in the configured
        ``response_format`` (``auto``: ``json_schema``, falling back to ``json_object`` for good
        on an endpoint that refuses the first form: a 4xx, or an error that names
        ``response_format``, as llama-cpp-python's server answers with a 500).

        Raises:
            EscalationCallError: as :meth:`complete`.
        """
        from noulengine.escalate.prompt import response_format

        mode = self.mode
        try:
            return await self.complete(messages, response_format(labels, "json_schema" if mode == "auto" else mode))
        except EscalationCallError as exc:
            # A refusal of the form: a 4xx, or any error naming response_format (llama-cpp-python's
            # server answers its own validation error with a 500 that says so).
            if mode != "auto" or not refuses_form(exc):
                raise
        self.mode = "json_object"
        return await self.complete(messages, response_format(labels, "json_object"))

    async def complete(self, messages: list[dict], response_format: dict | None) -> ChatResult:
        """One chat completion.

        Raises:
            EscalationCallError: timeout, connection failure, a non-2xx status, or a body that is
                not an OpenAI chat completion (``choices[0].message.content``).
        """
        import httpx

        body = {"model": self.config.model, "messages": messages, "max_tokens": self.config.max_tokens,
                "temperature": self.config.temperature, "stream": False}
        if response_format is not None:
            body["response_format"] = response_format
        t0 = time.perf_counter()
        try:
            resp = await self._client.post("/chat/completions", json=body)
        except httpx.TimeoutException:
            raise EscalationCallError("timeout", f"no answer within {self.config.timeout_s:g} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise EscalationCallError("unreachable", f"{type(exc).__name__}: {exc}") from None
        latency = time.perf_counter() - t0
        if resp.status_code // 100 != 2:
            # an auth failure's body may echo part of the key: never pass it on
            body = "(body withheld)" if resp.status_code in (401, 403) else resp.text[:300]
            raise EscalationCallError("http_error", f"HTTP {resp.status_code}: {body}", resp.status_code)
        try:
            data = resp.json()
            text = data["choices"][0]["message"]["content"]
            if text is not None and not isinstance(text, str):
                raise TypeError(f"message.content is {type(text).__name__}, not a string")
            raw_usage = data.get("usage")
            usage = {k: int(v) for k, v in (raw_usage.items() if isinstance(raw_usage, dict) else ())
                     if k in ("prompt_tokens", "completion_tokens", "total_tokens")
                     and isinstance(v, int) and not isinstance(v, bool) and v >= 0}
            model = data.get("model") if isinstance(data.get("model"), str) else None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise EscalationCallError("bad_response", f"not a chat completion ({type(exc).__name__}: {exc}): "
                                                      f"{resp.text[:300]}") from None
        return ChatResult(text=text, usage=usage, latency_s=latency, model=model)
