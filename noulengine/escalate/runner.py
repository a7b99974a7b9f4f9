"""Escalate a decision's doubtful fields and deliver each final answer as soon as it is known.

Order of delivery (what the HTTP stream sends): first every field that stays with the decision
model (confident ones, and those over the request's escalation budget), in question order; then
each escalated field as its LLM answer lands; at the request's deadline, the fields still waiting
keep the model's answer. Every answer says where it came from (``Answer.source``) and, for
fields under the threshold, what happened (``Answer.escalation``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import AsyncIterator

from noulengine.engine.decision import Answer, Decision
from noulengine.escalate.client import ChatClient, EscalationCallError
from noulengine.escalate.config import EscalationConfig
from noulengine.escalate.prompt import build_messages, parse_label


def _record(answer: Answer, cfg: EscalationConfig, status: str, **extra) -> dict:
    """The ``escalation`` record of one field under the threshold."""
    return {"status": status, "below": cfg.below, "model_label": answer.label,
            "model_confidence": answer.confidence, "llm_model": cfg.model, "llm_label": None,
            "reason": None, "usage": {}, "latency_s": None, **extra}


def kept(answer: Answer, cfg: EscalationConfig, status: str, reason: str, **extra) -> Answer:
    """The model's answer, flagged with why the LLM's answer is not used."""
    return replace(answer, source="model", escalation=_record(answer, cfg, status, reason=reason, **extra))


def escalated(answer: Answer, cfg: EscalationConfig, label: str, **extra) -> Answer:
    """The LLM's label in place of the model's; probabilities stay the decision model's."""
    value = label if answer.type == "choice" else answer.value
    return replace(answer, label=label, value=value, source="escalated",
                   escalation=_record(answer, cfg, "escalated", llm_label=label, changed=label != answer.label, **extra))


def plan_fields(decision: Decision, cfg: EscalationConfig) -> tuple[list[str], list[str]]:
    """``(to_escalate, over_budget)``: the fields under ``cfg.below``, least confident first,
    split at ``cfg.max_per_request``."""
    doubtful = sorted((f for f, a in decision.answers.items() if a.confidence < cfg.below),
                      key=lambda f: decision.answers[f].confidence)
    return doubtful[: cfg.max_per_request], doubtful[cfg.max_per_request:]


class Escalator:
    """Escalates decisions through one OpenAI-compatible endpoint.

    One instance per event loop (its HTTP client and its ``max_concurrent`` semaphore are bound to
    the loop that first uses them); :func:`escalate_decisions` makes one for synchronous callers.

    Args:
        config: the server-wide :class:`EscalationConfig`; a request may override ``below``,
            ``max`` and ``deadline_s`` (:meth:`EscalationConfig.with_overrides`).
        transport: an ``httpx`` transport for the client (None: the network).
    """

    def __init__(self, config: EscalationConfig, *, transport=None):
        self.config = config
        self._transport = transport
        self._client: ChatClient | None = None
        self._sem: asyncio.Semaphore | None = None

    def _ensure(self) -> tuple[ChatClient, asyncio.Semaphore]:
        if self._client is None:
            self._client = ChatClient(self.config, transport=self._transport)
            self._sem = asyncio.Semaphore(self.config.max_concurrent)
        return self._client, self._sem  # type: ignore[return-value]

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _ask(self, request, question, answer: Answer, cfg: EscalationConfig, started: set) -> Answer:
        client, sem = self._ensure()
        messages = build_messages(request, question, answer, show_probabilities=cfg.show_probabilities)
        async with sem:
            started.add(question.field)  # the call is made (a field still waiting for a slot is not "sent")
            t0 = time.perf_counter()
            try:
                result = await client.complete_labels(messages, question.labels)
            except EscalationCallError as exc:
                return kept(answer, cfg, exc.kind, str(exc), latency_s=time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - a failed LLM call never fails the request
                return kept(answer, cfg, "bad_response", f"{type(exc).__name__}: {exc}",
                            latency_s=time.perf_counter() - t0)
        label, why = parse_label(result.text, question.labels)
        common = {"usage": result.usage, "latency_s": result.latency_s, "llm_text": (result.text or "")[:500]}
        if label is None:
            return kept(answer, cfg, "invalid_answer", why, **common)
        return escalated(answer, cfg, label, **common)

    async def stream(self, decision: Decision, request, options: dict | None = None
                     ) -> AsyncIterator[tuple[str, Answer]]:
        """Yield ``(field, final answer)`` for every field of ``decision``, each as soon as it is final.

        Args:
            decision: the decision model's answers (a failed decision yields nothing).
            request: its :class:`~noulengine.records.schema.Request`.
            options: per-request overrides (``below``, ``max``, ``deadline_s``).

        Raises:
            ValueError: a bad option (before anything is yielded).
        """
        cfg = self.config.with_overrides(options)
        if not decision.ok:
            return
        todo, over = plan_fields(decision, cfg)
        for f, a in decision.answers.items():
            if f in over:
                yield f, kept(a, cfg, "budget", f"over the request's escalation budget ({cfg.max_per_request})")
            elif f not in todo:
                yield f, a
        if not todo:
            return
        questions = {q.field: q for q in request.questions}
        loop = asyncio.get_running_loop()
        started: set = set()
        tasks = {asyncio.ensure_future(self._ask(request, questions[f], decision.answers[f], cfg, started)): f
                 for f in todo}
        deadline = loop.time() + cfg.deadline_s
        pending = set(tasks)
        order = lambda t: todo.index(tasks[t])  # noqa: E731
        try:
            while pending:
                left = deadline - loop.time()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                for t in sorted(done, key=order):
                    yield tasks[t], t.result()
            # Answers that landed while the consumer was busy (time spent at `yield` counts toward
            # the deadline) are final: deliver them, not a deadline flag.
            landed = {t for t in pending if t.done() and not t.cancelled()}
            pending -= landed
            for t in sorted(landed, key=order):
                yield tasks[t], t.result()
            for t in pending:
                t.cancel()
            for t in sorted(pending, key=order):
                f = tasks[t]
                yield f, kept(decision.answers[f], cfg, "deadline",
                              f"the request's escalation deadline ({cfg.deadline_s:g} s) passed first",
                              called=f in started)
        finally:
            for t in pending:
                t.cancel()
            if pending:  # let cancelled calls unwind (close their connections) before leaving
                await asyncio.gather(*pending, return_exceptions=True)

    async def escalate(self, decision: Decision, request, options: dict | None = None) -> Decision:
        """The decision with its doubtful fields escalated (answers in question order)."""
        if not decision.ok:
            return decision
        t0 = time.perf_counter()
        final = {f: a async for f, a in self.stream(decision, request, options)}
        answers = {f: final[f] for f in decision.answers}
        return replace(decision, answers=answers, escalation=summarize(answers.values(),
                                                                       wall_s=time.perf_counter() - t0))


def summarize(answers, *, wall_s: float | None = None) -> dict:
    """A request's escalation usage: fields sent, answered by the LLM, kept (by reason), tokens."""
    sent = [a for a in answers if a.escalation is not None and a.escalation["status"] != "budget"
            and a.escalation.get("called", True)]  # a deadline flag before the call began: never sent
    kept_by: dict[str, int] = {}
    for a in answers:
        if a.escalation is not None and a.source == "model":
            kept_by[a.escalation["status"]] = kept_by.get(a.escalation["status"], 0) + 1
    return {"escalated": sum(a.source == "escalated" for a in answers), "sent": len(sent), "kept": kept_by,
            "prompt_tokens": sum(a.escalation["usage"].get("prompt_tokens", 0) for a in sent),
            "completion_tokens": sum(a.escalation["usage"].get("completion_tokens", 0) for a in sent),
            "wall_s": wall_s}


def escalate_decisions(decisions: list[Decision], requests: list, config: EscalationConfig, *,
                       transport=None) -> list[Decision]:
    """Escalate many decisions at once (calls bounded by ``config.max_concurrent``), synchronously.

    Args:
        decisions: the decision model's output, one per request.
        requests: the parsed :class:`~noulengine.records.schema.Request` of each (None for a
            failed one).

    Returns:
        The decisions, in order, with doubtful fields escalated; failed decisions unchanged.

    Called from inside a running event loop (a notebook), the calls run on a fresh loop in a
    worker thread and the caller's loop waits until they finish: an LLM served on that same loop
    cannot answer then. Async callers should use :class:`Escalator` directly.
    """
    async def run_all():
        esc = Escalator(config, transport=transport)
        try:
            return await asyncio.gather(*(esc.escalate(d, r) if r is not None else _same(d)
                                          for d, r in zip(decisions, requests)))
        finally:
            await esc.aclose()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return list(asyncio.run(run_all()))
    box: dict = {}  # called from inside an event loop (a notebook): run on a fresh loop in a thread

    def target():
        try:
            box["out"] = asyncio.run(run_all())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["err"] = exc

    th = threading.Thread(target=target)
    th.start()
    th.join()
    if "err" in box:
        raise box["err"]
    return list(box["out"])


async def _same(d):
    return d
