"""Prometheus text-format metrics (no client library needed).

Series:
  noulengine_requests_total{route,status}        counter (route: the path, /v1/adapters/{name} for one
                                                 adapter, other for unknown paths)
  noulengine_request_duration_seconds{route}     histogram
  noulengine_batch_requests                      histogram (requests per engine call)
  noulengine_batch_duration_seconds              histogram
  noulengine_queue_depth                         gauge (queued + running)
  noulengine_input_tokens_total                  counter
  noulengine_prefix_cache_query_tokens_total     counter (packed tokens of requests looked up)
  noulengine_prefix_cache_hit_tokens_total       counter (of those, keys/values reused from the cache)
  noulengine_prefix_cache_queries_total          counter (requests looked up)
  noulengine_prefix_cache_hits_total             counter (requests that reused at least one token)
  noulengine_prefix_cache_evictions_total        counter
  noulengine_prefix_cache_hit_rate               gauge (hit tokens / query tokens since start)
  noulengine_prefix_cache_entries                gauge
  noulengine_prefix_cache_bytes                  gauge (keys and values held)
  noulengine_prefix_cache_capacity_bytes         gauge (0: cross-request prefix caching off)
  noulengine_max_batch_tokens                    gauge (padded-token budget of one forward pass)
  noulengine_chunk_tokens                        gauge (large requests run in chunks of at most this many
                                                 tokens, answering others between them; 0: off)
  noulengine_chunk_steps_total                   counter (chunks run for large requests)
  noulengine_chunked_requests                    gauge (large requests being computed in chunks now)
  noulengine_adapter_batches_total{adapter}      counter (engine calls that served a LoRA adapter)
  noulengine_adapter_loaded{adapter}             gauge (1 loaded, 0 registered but evicted)
  noulengine_adapter_evictions_total             counter (least-recently-used unloads)

The prefix-cache series follow vLLM's prefix_cache_queries / prefix_cache_hits (token counts).
"""

from __future__ import annotations

import threading
import time

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
ROUTES = ("/", "/healthz", "/metrics", "/v1/models", "/v1/systemone", "/v1/decide", "/v1/adapters")


ADAPTER_ITEM = "/v1/adapters/{name}"


def route_label(path: str) -> str:
    """The ``route`` label of a request path: a served route, ``/v1/adapters/{name}`` for one
    adapter (a name is one path segment), else ``other``."""
    if path in ROUTES:
        return path
    rest = path[len("/v1/adapters/"):] if path.startswith("/v1/adapters/") else ""
    return ADAPTER_ITEM if rest and "/" not in rest else "other"


class _Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.total += 1
        self.sum += v

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.total}')
        lab = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{lab} {self.sum:.6f}", f"{name}_count{lab} {self.total}"]
        return out


class Metrics:
    """Thread-safe counters for the HTTP layer and the worker, rendered by :meth:`render`."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, _Histogram] = {}
        self.batch_sizes = _Histogram(BATCH_BUCKETS)
        self.batch_seconds = _Histogram(LATENCY_BUCKETS)
        self.queue_depth = 0
        self.input_tokens = 0
        self.prefix_store = None  # the engine's PrefixKVStore, read at render time
        self.adapters = None  # the server's AdapterRegistry, read at render time
        self.worker = None  # the BatchWorker (it sets itself), read at render time
        self.started = time.time()

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """Count one finished HTTP request by its route (``/v1/adapters/NAME`` as
        ``/v1/adapters/{name}``; unknown paths are folded into ``other``)."""
        route = route_label(route)
        with self._lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
            self.latency.setdefault(route, _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def observe_batch(self, size: int, seconds: float, tokens: int) -> None:
        """Record one engine call: how many requests, how long, how many input tokens."""
        with self._lock:
            self.batch_sizes.observe(size)
            self.batch_seconds.observe(seconds)
            self.input_tokens += int(tokens)

    def set_queue_depth(self, depth: int) -> None:
        """Set the current queue depth (queued + running)."""
        self.queue_depth = int(depth)

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        with self._lock:
            out = ["# HELP noulengine_requests_total HTTP requests by route and status.",
                   "# TYPE noulengine_requests_total counter"]
            out += [f'noulengine_requests_total{{route="{r}",status="{s}"}} {n}'
                    for (r, s), n in sorted(self.requests.items())]
            out += ["# HELP noulengine_request_duration_seconds HTTP request latency.",
                    "# TYPE noulengine_request_duration_seconds histogram"]
            for r, h in sorted(self.latency.items()):
                out += h.lines("noulengine_request_duration_seconds", f'route="{r}"')
            out += ["# HELP noulengine_batch_requests Requests answered per engine call.",
                    "# TYPE noulengine_batch_requests histogram"]
            out += self.batch_sizes.lines("noulengine_batch_requests")
            out += ["# HELP noulengine_batch_duration_seconds Seconds per engine call.",
                    "# TYPE noulengine_batch_duration_seconds histogram"]
            out += self.batch_seconds.lines("noulengine_batch_duration_seconds")
            out += ["# HELP noulengine_queue_depth Requests queued or running.",
                    "# TYPE noulengine_queue_depth gauge", f"noulengine_queue_depth {self.queue_depth}",
                    "# HELP noulengine_input_tokens_total Packed input tokens fed to the model.",
                    "# TYPE noulengine_input_tokens_total counter", f"noulengine_input_tokens_total {self.input_tokens}"]
            out += self._scheduling_lines()
            out += self._prefix_cache_lines()
            out += self._adapter_lines()
        return "\n".join(out) + "\n"

    def _scheduling_lines(self) -> list[str]:
        w = self.worker
        if w is None:
            return []
        config = getattr(w.engine, "config", None)
        series = [
            ("max_batch_tokens", "gauge", "Padded-token budget of one forward pass.", w.max_batch_tokens),
            ("chunk_tokens", "gauge", "Large requests run in chunks of at most this many tokens, others answered "
             "between the chunks (0: off).", int(getattr(config, "chunk_tokens", 0) or 0)),
            ("chunk_steps_total", "counter", "Chunks run for large requests.", w.chunk_steps),
            ("chunked_requests", "gauge", "Large requests being computed in chunks now.", len(w._jobs)),
        ]
        out = []
        for name, kind, help_text, value in series:
            out += [f"# HELP noulengine_{name} {help_text}", f"# TYPE noulengine_{name} {kind}",
                    f"noulengine_{name} {value}"]
        return out

    def _adapter_lines(self) -> list[str]:
        reg = self.adapters
        if reg is None:
            return []
        names = sorted(reg.paths)
        out = ["# HELP noulengine_adapter_batches_total Engine calls that served each LoRA adapter.",
               "# TYPE noulengine_adapter_batches_total counter"]
        out += [f'noulengine_adapter_batches_total{{adapter="{n}"}} {reg.requests.get(n, 0)}' for n in names]
        out += ["# HELP noulengine_adapter_loaded Whether each registered LoRA adapter is loaded (1) or evicted (0).",
                "# TYPE noulengine_adapter_loaded gauge"]
        out += [f'noulengine_adapter_loaded{{adapter="{n}"}} {int(n in reg.loaded)}' for n in names]
        out += ["# HELP noulengine_adapter_evictions_total LoRA adapters unloaded to make room (least recently used).",
                "# TYPE noulengine_adapter_evictions_total counter", f"noulengine_adapter_evictions_total {reg.evictions}"]
        return out

    def _prefix_cache_lines(self) -> list[str]:
        store = self.prefix_store
        stats = store.stats.to_dict() if store is not None else {}
        series = [
            ("query_tokens_total", "counter", "Packed input tokens of requests looked up in the prefix cache.",
             stats.get("query_tokens", 0)),
            ("hit_tokens_total", "counter", "Tokens whose keys and values were reused from the prefix cache.",
             stats.get("hit_tokens", 0)),
            ("queries_total", "counter", "Requests looked up in the prefix cache.", stats.get("queries", 0)),
            ("hits_total", "counter", "Requests that reused cached keys and values.", stats.get("hits", 0)),
            ("evictions_total", "counter", "Prefix cache entries evicted (least recently used).",
             stats.get("evictions", 0)),
            ("hit_rate", "gauge", "Prefix cache hit tokens over query tokens since start.",
             round(stats.get("token_hit_rate", 0.0), 6)),
            ("entries", "gauge", "Prefixes held in the prefix cache.", len(store) if store is not None else 0),
            ("bytes", "gauge", "Bytes of keys and values held in the prefix cache.",
             store.nbytes if store is not None else 0),
            ("capacity_bytes", "gauge", "Prefix cache budget in bytes (0: cross-request prefix caching off).",
             store.max_bytes if store is not None else 0),
        ]
        out = []
        for name, kind, help_text, value in series:
            full = f"noulengine_prefix_cache_{name}"
            out += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}", f"{full} {value}"]
        return out


class MetricsMiddleware:
    """ASGI middleware counting every HTTP response by route and status, with its latency."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.observe_request(scope.get("path", ""), status["code"], time.perf_counter() - t0)
