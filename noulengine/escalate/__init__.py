"""Escalation: questions the decision model is unsure of are handed to a generative LLM.

The decision model answers every question in one forward pass with calibrated probabilities; a
question whose confidence (max p) is under a threshold is then asked of an OpenAI-compatible
chat-completions endpoint (a user's larger LLM, or llama.cpp's server locally), constrained to
answer one of the question's candidate labels. The LLM's answer replaces the label only when it
is a valid candidate; otherwise, and past the budgets, the decision model's answer stands, with
the reason recorded.

* :mod:`.config`: :class:`EscalationConfig` (endpoint, threshold, budgets).
* :mod:`.prompt`: the chat messages and the structured-output schema for one question.
* :mod:`.client`: :class:`ChatClient`, the HTTP call (httpx), usage and latency.
* :mod:`.runner`: :class:`Escalator`, which escalates a decision's doubtful fields and yields
  each final answer as it lands (the HTTP service streams them as server-sent events).

The protocol follows the reference runtime's "thinking" handoff (fields under a confidence
threshold are sent to an LLM and streamed back); the request shape is OpenAI's chat-completions
API (``response_format`` with a JSON schema, which llama.cpp's server turns into a grammar).
"""

from noulengine.escalate.config import EscalationConfig

__all__ = ["EscalationConfig"]
