"""The inference worker: one thread owns the engine and answers queued requests in shared passes.

Handlers :meth:`BatchWorker.submit` parsed requests and await the returned future. The worker
takes the oldest request, then keeps gathering for at most ``max_wait_ms`` (or until the
estimated token budget or ``max_batch_requests`` is reached) and answers the whole group with one
``engine.decide_batch`` call, which packs it into forward passes within ``max_batch_tokens``.
The queue is bounded: a full queue raises :class:`QueueFull` at once (the HTTP layer answers 429).

With an :class:`~noulengine.serve.adapters.AdapterRegistry` (``adapters``), each gathered batch is
answered in the steps: split it into groups naming at most ``--max-loaded-adapters`` adapters
(:meth:`~noulengine.serve.adapters.AdapterRegistry.plan`); for each group, under the engine lock,
load its adapters (evicting least recently used ones), fail the requests whose adapter was deleted
or no longer loads with that error (the rest of the group is answered), run ``decide_batch``, and
trim the loaded set to the limit.

Chunked scheduling (issue #56; vLLM / Sarathi-Serve chunked prefill): a request the engine computes
in chunks (:meth:`~noulengine.Engine.is_chunked`: at least ``chunk_min_tokens`` and more
than ``chunk_tokens`` packed tokens, naming no adapter) is not answered inside the gathered group:
it becomes a job (:meth:`~noulengine.Engine.start_batch`) the worker runs one chunk at a time, the
engine lock held for each chunk only. Between two chunks the worker gathers what arrived (up to
``max_batch_tokens``, as above) and answers it oldest first in passes of a chunk's worth of tokens
(:attr:`BatchWorker.step_tokens`; at least one request each), so small requests keep moving behind
a large one and each waits for those before it, not for all that arrived with it; large jobs run
oldest first. Each chunk's shapes and inputs depend on its own request alone, so every
answer is the same bits as the request alone (``tests/test_chunked_scheduling.py``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("noulengine.serve")


@dataclass
class _Job:
    """A large request answered one chunk per step (the engine's :class:`~noulengine.engine.engine.DecideJob`)."""

    item: "_Item"
    job: object
    started: float
    seconds: float = 0.0  # the worker's time spent on its steps


class QueueFull(Exception):
    """The worker already holds ``max_queue`` requests."""


@dataclass
class _Item:
    request: object
    tokens: int
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


def estimate_tokens(request) -> int:
    """A cheap upper-ish guess of a request's packed tokens (bytes / 3 + per-question overhead),
    used only to decide how many queued requests to gather; the engine plans exact passes."""
    try:
        text = json.dumps(request.state, ensure_ascii=False, default=str)
        qs = sum(len(json.dumps(q.spec(), ensure_ascii=False, default=str)) for q in request.questions)
    except Exception:  # noqa: BLE001 - an estimate must never fail a request
        return 256
    return 48 + len(text) // 3 + qs // 3 + 24 * len(request.questions)


class BatchWorker:
    """A thread that owns the engine and runs gathered requests through ``decide_batch``."""

    def __init__(self, engine, *, max_batch_tokens: int = 8192, max_batch_requests: int = 64,
                 max_wait_ms: float = 5.0, max_queue: int = 256, metrics=None, adapters=None):
        self.engine = engine
        # held for each batch; adapter loads and unloads (serve/adapters.py) take it too, so the
        # engine's adapter set never changes under a running pass
        self.engine_lock = threading.Lock()
        self.adapters = adapters  # the server's AdapterRegistry (its lock must be engine_lock), or None
        self.max_batch_tokens = max(1, int(max_batch_tokens))
        self.max_batch_requests = max(1, int(max_batch_requests))
        self.max_wait_s = max(0.0, float(max_wait_ms)) / 1000.0
        self.max_queue = max(1, int(max_queue))
        self.metrics = metrics
        if metrics is not None:
            metrics.worker = self  # /metrics reports the batch and chunk settings and the chunks run
        self._queue: collections.deque[_Item] = collections.deque()
        self._cv = threading.Condition()
        self._in_flight = 0
        self._jobs: list[_Job] = []  # large requests being answered in chunks, oldest first
        self.chunk_steps = 0  # chunks run for large requests (reported on /metrics)
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="noulengine-worker", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batch in progress, fail what is still queued, and join the thread."""
        with self._cv:
            self._stop = True
            pending = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for item in pending:
            item.future.set_exception(RuntimeError("the server is shutting down"))
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """True while the worker thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def depth(self) -> int:
        """Requests queued or being answered."""
        return len(self._queue) + self._in_flight

    # -- submission ---------------------------------------------------------------------------
    def submit(self, request) -> concurrent.futures.Future:
        """Queue a parsed :class:`~noulengine.records.schema.Request`; the future resolves to its
        :class:`~noulengine.engine.decision.Decision` (``error`` set for a request the engine
        refused, e.g. over the context length).

        Raises:
            QueueFull: ``max_queue`` requests are already waiting or running.
        """
        item = _Item(request, estimate_tokens(request))
        with self._cv:
            if self._stop:
                raise RuntimeError("the server is shutting down")
            if len(self._queue) + self._in_flight >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are already queued")
            self._queue.append(item)
            self._report_depth()
            self._cv.notify()
        return item.future

    # -- the loop -----------------------------------------------------------------------------
    def _gather(self, wait: bool = True) -> list[_Item]:
        """The next group of queued requests; with ``wait=False`` (large jobs in flight) an empty
        list at once when nothing is queued."""
        running = len(self._jobs)
        with self._cv:
            while wait and not self._queue and not self._stop:
                self._cv.wait()
            if self._stop or not self._queue:
                return []
            batch = [self._queue.popleft()]
            # Popped items count as in flight at once: cv.wait() below releases the lock, and
            # submit() must still see them when it checks max_queue.
            self._in_flight = running + 1
            tokens = batch[0].tokens
            deadline = time.monotonic() + self.max_wait_s
            while len(batch) < self.max_batch_requests and tokens < self.max_batch_tokens:
                if self._queue:
                    nxt = self._queue[0]
                    if tokens + nxt.tokens > self.max_batch_tokens:
                        break
                    batch.append(self._queue.popleft())
                    self._in_flight = running + len(batch)
                    tokens += nxt.tokens
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or self._stop:
                    break
                self._cv.wait(left)
            self._in_flight = running + len(batch)
            self._report_depth()
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._gather(wait=not self._jobs)
            if self._stop:
                self._fail_jobs(RuntimeError("the server is shutting down"))
                return
            try:
                small = []
                for item in batch:
                    if self._is_large(item):
                        self._start_job(item)
                    else:
                        small.append(item)
                if small:
                    for group in self._groups(small):
                        for step in self._steps(group):
                            self._answer(step)
                if self._jobs:
                    self._step_job()
            finally:
                with self._cv:
                    self._in_flight = len(self._jobs)
                    self._report_depth()

    # -- chunked scheduling of large requests -------------------------------------------------
    @property
    def step_tokens(self) -> int:
        """The token budget of one pass for requests answered while large requests are being
        computed: the engine's ``chunk_tokens`` (``max_batch_tokens`` when chunking is off).

        Between two chunks of a large request the worker still takes what arrived, up to
        ``max_batch_tokens`` as ever (so a large request waits for no more than before), but
        answers it in passes of about this many estimated tokens, oldest first (at least one
        request per pass; Sarathi-Serve's fixed token budget per iteration, Agrawal et al. 2024):
        the first requests are answered after their own pass, not after all that arrived with
        them (measured in docs/serving.md)."""
        config = getattr(self.engine, "config", None)
        chunk = int(getattr(config, "chunk_tokens", 0) or 0) if config is not None else 0
        return min(self.max_batch_tokens, chunk) if chunk > 0 else self.max_batch_tokens

    def _steps(self, group: list[_Item]) -> list[list[_Item]]:
        """``group`` as one pass when no large request is in flight; otherwise in order, in passes
        of at most :attr:`step_tokens` estimated tokens (at least one request each)."""
        if not self._jobs:
            return [group]
        out: list[list[_Item]] = []
        tokens = 0
        for item in group:
            if out and tokens + item.tokens <= self.step_tokens:
                out[-1].append(item)
                tokens += item.tokens
            else:
                out.append([item])
                tokens = item.tokens
        return out

    def _is_large(self, item: _Item) -> bool:
        """Whether ``item`` is answered as a job, one chunk per step: the engine would chunk it
        (:meth:`~noulengine.Engine.is_chunked`) and it names no adapter (an adapter may be loaded
        or unloaded between steps; those requests are answered whole). Only scheduling depends on
        this, never an answer's bits."""
        probe = getattr(self.engine, "is_chunked", None)
        config = getattr(self.engine, "config", None)
        chunk = getattr(config, "chunk_tokens", 0) if config is not None else 0
        if probe is None or not chunk or getattr(item.request, "adapter", None) is not None:
            return False
        if 2 * item.tokens < max(chunk, getattr(config, "chunk_min_tokens", 0)):
            return False  # far below the threshold (the estimate overshoots): not worth compiling to check
        try:
            with self.engine_lock:
                return bool(probe(item.request))
        except Exception:  # noqa: BLE001 - a request that does not compile is answered (as an error) whole
            return False

    def _start_job(self, item: _Item) -> None:
        with self.engine_lock:
            job = self.engine.start_batch([item.request], batch_tokens=self.max_batch_tokens, on_error="record")
        self._jobs.append(_Job(item, job, time.perf_counter()))

    def _step_job(self) -> None:
        """One chunk of the oldest large job; answer it when it is done."""
        entry = self._jobs[0]
        t0 = time.perf_counter()
        try:
            with self.engine_lock:
                more = entry.job.step()
        except BaseException as exc:  # noqa: BLE001 - its client gets an answer
            log.exception("engine failure on a large request")
            self._jobs.pop(0)
            if not entry.item.future.done():
                entry.item.future.set_exception(exc)
            return
        entry.seconds += time.perf_counter() - t0
        self.chunk_steps += 1
        if more:
            return
        self._jobs.pop(0)
        decision = entry.job.decisions[0]
        if self.metrics is not None:
            self.metrics.observe_batch(1, time.perf_counter() - entry.started, decision.input_tokens)
        entry.item.future.set_result(decision)

    def _fail_jobs(self, exc: BaseException) -> None:
        for entry in self._jobs:
            if not entry.item.future.done():
                entry.item.future.set_exception(exc)
        self._jobs.clear()

    def _groups(self, batch: list[_Item]) -> list[list[_Item]]:
        """The batch split so that no group names more adapters than may be loaded at once."""
        if self.adapters is None:
            return [batch]
        with self.engine_lock:
            plan = self.adapters.plan([getattr(it.request, "adapter", None) for it in batch])
        return [[batch[i] for i in group] for group in plan if group]

    def _answer(self, group: list[_Item]) -> None:
        """Answer one group in one ``decide_batch`` call; every waiting client gets an answer."""
        try:
            t0 = time.perf_counter()
            with self.engine_lock:
                refused = {}
                if self.adapters is not None:
                    refused = self.adapters.ensure_loaded([getattr(it.request, "adapter", None) for it in group])
                run = []
                for item in group:
                    err = refused.get(getattr(item.request, "adapter", None))
                    if err is not None:  # this adapter is gone or no longer loads: its requests only
                        item.future.set_exception(err)
                    else:
                        run.append(item)
                decisions = (self.engine.decide_batch([it.request for it in run], batch_tokens=self.max_batch_tokens,
                                                      on_error="record") if run else [])
                if self.adapters is not None:
                    self.adapters.trim()
            if self.metrics is not None and run:
                self.metrics.observe_batch(len(run), time.perf_counter() - t0, sum(d.input_tokens for d in decisions))
            for item, decision in zip(run, decisions):
                item.future.set_result(decision)
        except BaseException as exc:  # noqa: BLE001 - every waiting client gets an answer
            log.exception("engine failure on a batch of %d", len(group))
            for item in group:
                if not item.future.done():
                    item.future.set_exception(exc)

    def _report_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.set_queue_depth(len(self._queue) + self._in_flight)
