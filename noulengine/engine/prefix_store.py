"""Cross-request prefix caching: prefilled keys and values of shared token prefixes, reused.

Every request's prompt starts with the same tokens: the chat-template head (BOS, system prompt,
user header) and the fixed frame text before the state (39 of AG News' ~185 tokens on
SmolLM2). Requests about the same state share much longer prefixes. Serving engines prefill such
prefixes once and keep their keys/values ("automatic prefix caching", vLLM docs; the idea of
RadixAttention in SGLang, Zheng et al. 2024); this module does the same for the engine's causal
path (linear requests) and its prefix-cache path (tree requests):

* :class:`PrefixKVStore`: a bounded LRU of :class:`PrefixEntry` (one prefix's per-layer keys and
  values, batch 1), keyed by the prefix's token ids; lookup returns the longest entry that equals
  the first ``n`` ids of a request's own token ids. Bounded in bytes; the frame head is pinned.
* :func:`prefill`: keys/values (and hidden states) of a prefix, continuing from a shorter entry.
* :func:`cache_for_rows`: a :class:`transformers.DynamicCache` holding one entry for ``B`` rows.

Exactness: an entry is used only for token ids identical to the request's own whole-prompt
tokenization (never re-tokenized pieces), only for positions ``0 .. n-1`` of the root segment
(where position ids equal token indices) and never past a read position, so the cached keys and
values are the ones the request's own pass computes, up to float rounding from different matmul
shapes (``tests/test_prefix_store.py``: answers within 1e-5 of the tree path in float32).

Determinism (issue #46): every stored entry is computed in one canonical shape, by
:func:`prefix_chain`: a request's prefix is cut at fixed points that depend on the request alone
(the frame head, its static prefix when it has one, its whole root segment) and each piece is a
batch-1 :func:`prefill` continuing from the one before. A request that finds a piece stored reuses
exactly the bits it would have computed, so what the store holds (what the server answered
before) never changes an answer; only the batch a request shares a pass with can
(docs/serving.md#determinism).

Hit rate, as vLLM reports it: prompt tokens whose keys/values came from the cache over prompt
tokens looked up (:class:`PrefixCacheStats`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from noulengine.compile.layout import shared_root_prefix


@dataclass
class PrefixEntry:
    """One cached prefix.

    Attributes:
        ids: the prefix's token ids (positions ``0 .. n-1``).
        keys, values: per decoder layer, ``(1, kv_heads, n, head_dim)`` tensors (model dtype, on
            the model's device), as the model's own cache holds them.
        adapter: the LoRA adapter slot whose weights computed it (0: the model as loaded); the
            store keys entries by (adapter, ids), so a prefix never serves another adapter.
        pinned: never evicted (the frame head every request starts with).
        static: a static prefix (the questions of a schema-first prompt, shared by every request
            that asks them): evicted only when no other unpinned entry is left, so a stream of
            one-off state prefixes never pushes out the schema all of them reuse.
    """

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    pinned: bool = False
    static: bool = False
    adapter: int = 0  # the LoRA adapter slot it was computed under (0: the base): part of its key
    cuts: tuple[int, ...] = ()  # the cut points it was computed along (prefix_chain); reused only along the same

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class PrefixCacheStats:
    """Counters of a :class:`PrefixKVStore` (monotonic; :meth:`to_dict` adds the rates).

    Attributes:
        queries: requests looked up.
        hits: requests that reused cached keys/values for at least one token.
        query_tokens: packed input tokens of the looked-up requests.
        hit_tokens: of those, tokens whose keys/values came from the cache (not recomputed).
        inserts, evictions: entries added and dropped (least recently used first).
    """

    queries: int = 0
    hits: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    inserts: int = 0
    evictions: int = 0

    @property
    def token_hit_rate(self) -> float:
        """hit_tokens / query_tokens (0.0 before any query): vLLM's prefix cache hit rate."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def to_dict(self) -> dict:
        return {"queries": self.queries, "hits": self.hits, "query_tokens": self.query_tokens,
                "hit_tokens": self.hit_tokens, "inserts": self.inserts, "evictions": self.evictions,
                "token_hit_rate": self.token_hit_rate, "request_hit_rate": self.request_hit_rate}


class PrefixKVStore:
    """Bounded LRU cache of prefilled prefixes keyed by token ids.

    Eviction is segmented: least recently used entries of requests' own prefixes first, then
    least recently used static prefixes (:attr:`PrefixEntry.static`), never pinned ones.

    Args:
        max_bytes: total bytes of keys and values held at most (pinned entries included); an
            insert evicts unpinned entries in the order above until it fits, and an entry
            larger than the whole budget is not stored.
        min_tokens: an entry must save at least this many tokens over the longest entry it
            extends to be worth storing (smaller prefixes cost more to manage than to recompute).

    Raises:
        ValueError: a negative ``max_bytes`` or a ``min_tokens`` below 1.
    """

    def __init__(self, max_bytes: int, *, min_tokens: int = 8):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        self.max_bytes = int(max_bytes)
        self.min_tokens = int(min_tokens)
        self._entries: OrderedDict[tuple[int, tuple[int, ...]], PrefixEntry] = OrderedDict()  # (adapter, ids)
        self._lengths: dict[int, int] = {}  # entry length -> how many entries have it
        self.nbytes = 0
        self.stats = PrefixCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int], limit: int, adapter: int = 0) -> PrefixEntry | None:
        """The longest entry of ``adapter`` whose ids equal ``ids[:n]`` with ``n <= limit`` (marked
        recently used).

        Cost: one tuple of ``n`` ids and one dict probe per distinct entry length.
        """
        for n in sorted((n for n in self._lengths if n <= limit), reverse=True):
            entry = self._entries.get((adapter, tuple(ids[:n])))
            if entry is not None:
                self._entries.move_to_end((adapter, entry.ids))
                return entry
        return None

    def record(self, query_tokens: int, hit_tokens: int) -> None:
        """Count one request: its packed tokens, and how many came from the cache."""
        self.stats.queries += 1
        self.stats.query_tokens += int(query_tokens)
        if hit_tokens > 0:
            self.stats.hits += 1
            self.stats.hit_tokens += int(hit_tokens)

    def worth_storing(self, n: int, base: PrefixEntry | None) -> bool:
        """Whether a prefix of ``n`` tokens extending ``base`` saves enough to be stored."""
        return n - (len(base) if base is not None else 0) >= self.min_tokens

    def insert(self, entry: PrefixEntry) -> bool:
        """Store ``entry`` (replacing one with the same ids). Returns False when it cannot fit."""
        size = entry.nbytes
        if size > self.max_bytes:
            return False
        old = self._entries.pop((entry.adapter, entry.ids), None)
        if old is not None:
            self._forget(old)
        while self.nbytes + size > self.max_bytes:
            victim = next((e for e in self._entries.values() if not e.pinned and not e.static), None)
            if victim is None:
                victim = next((e for e in self._entries.values() if not e.pinned), None)
            if victim is None:
                return False  # only pinned entries left, and they fill the budget
            del self._entries[(victim.adapter, victim.ids)]
            self._forget(victim)
            self.stats.evictions += 1
        self._entries[(entry.adapter, entry.ids)] = entry
        self._lengths[len(entry)] = self._lengths.get(len(entry), 0) + 1
        self.nbytes += size
        self.stats.inserts += 1
        return True

    def clear(self, *, keep_pinned: bool = False, adapter: int | None = None) -> None:
        """Drop every entry (pinned ones too, unless ``keep_pinned``), or only ``adapter``'s; the
        counters stay."""
        for entry in [e for e in self._entries.values()
                      if not (keep_pinned and e.pinned) and (adapter is None or e.adapter == adapter)]:
            del self._entries[(entry.adapter, entry.ids)]
            self._forget(entry)

    def _forget(self, entry: PrefixEntry) -> None:
        self.nbytes -= entry.nbytes
        n = len(entry)
        self._lengths[n] -= 1
        if not self._lengths[n]:
            del self._lengths[n]


def cache_for_rows(runner, entry: PrefixEntry | None, rows: int):
    """A :class:`transformers.DynamicCache` holding ``entry`` for each of ``rows`` batch rows.

    An entry with one row is shared by every row as ``Tensor.expand`` views of one copy; an
    entry with ``rows`` rows (one prefix per row) is used as it is. The cache concatenates the
    next pass's keys onto them (allocating the ``rows``-row result); the entry's own tensors are
    never modified.

    Raises:
        ValueError: the entry has neither 1 nor ``rows`` rows.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=runner.config)
    if entry is not None:
        for layer, (k, v) in enumerate(zip(entry.keys, entry.values)):
            if k.shape[0] not in (1, rows):
                raise ValueError(f"cache_for_rows: an entry of {k.shape[0]} rows cannot fill {rows} rows")
            cache.update(k, v, layer)
            held = cache.layers[layer]
            if k.shape[0] != rows:
                held.keys = held.keys.expand(rows, -1, -1, -1)
                held.values = held.values.expand(rows, -1, -1, -1)
    return cache


def prefill(runner, ids: Sequence[int], base: PrefixEntry | None = None) -> tuple[PrefixEntry, torch.Tensor]:
    """Prefill ``ids`` (positions ``0 .. n-1``) with the model's causal attention, batch 1.

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        ids: the prefix's token ids.
        base: a cached entry whose ids are ``ids[:len(base)]``: only the rest is computed.

    Returns:
        ``(entry, hidden)``: the entry for all of ``ids``, and the ``(n - len(base), D)`` final
        hidden states of the newly computed tokens.

    Raises:
        ValueError: ``base`` is not a prefix of ``ids``, or nothing is left to compute.
    """
    start = len(base) if base is not None else 0
    if base is not None and tuple(ids[:start]) != base.ids:
        raise ValueError("prefill: the base entry is not a prefix of the ids")
    if start >= len(ids):
        raise ValueError(f"prefill: nothing to compute ({len(ids)} ids, {start} cached)")
    dev = runner.device
    cache = cache_for_rows(runner, base, 1)
    hidden = runner.forward_with_cache(torch.tensor([list(ids[start:])], device=dev),
                                       torch.arange(start, len(ids), device=dev)[None], None, cache)
    entry = PrefixEntry(tuple(ids), [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers])
    return entry, hidden[0]



def exact_entry(store: PrefixKVStore | None, ids: Sequence[int], n: int, adapter: int = 0,
                cuts: tuple[int, ...] | None = None) -> PrefixEntry | None:
    """The stored entry of exactly ``ids[:n]`` under ``adapter``, or None (a shorter one does not
    count); with ``cuts``, only one computed along those cut points (the same bits)."""
    if store is None or n <= 0:
        return None
    entry = store.lookup(ids, n, adapter)
    if entry is None or len(entry) != n or (cuts is not None and entry.cuts != cuts):
        return None
    return entry


def canonical_cuts(cuts: Sequence[int], chunk: int = 0) -> list[int]:
    """The cut points a prefix is computed along: ``cuts`` (zeros and repeats dropped), and with
    ``chunk > 0`` also every ``chunk`` tokens inside a piece longer than ``chunk`` (counted from the
    piece's start), so no piece computes more than ``chunk`` tokens. A function of its arguments
    alone (the request's own cut points and the engine's fixed chunk size): the canonical shape.

    Example: ``canonical_cuts([39, 600], 256) == [39, 295, 551, 600]``.
    """
    points = sorted({int(c) for c in cuts if c > 0})
    if chunk <= 0:
        return points
    out: list[int] = []
    prev = 0
    for c in points:
        x = prev + chunk
        while x < c:
            out.append(x)
            x += chunk
        out.append(c)
        prev = c
    return out


def leading_entry(entry: PrefixEntry, n: int, *, cuts: tuple[int, ...], static: bool = False) -> PrefixEntry:
    """The entry of ``entry``'s first ``n`` tokens: its keys and values cut to ``n`` positions and
    copied (a view would keep the whole longer entry's tensors alive, bytes the store does not
    count). Bit-identical to computing those ``n`` tokens along ``cuts`` when ``entry`` was computed
    along ``cuts`` and further pieces after them: a causal prefix's keys and values never depend on
    what follows it.

    Raises:
        ValueError: ``n`` is not inside ``entry`` (``0 < n < len(entry)``).
    """
    if not 0 < n < len(entry):
        raise ValueError(f"leading_entry: {n} tokens are not inside an entry of {len(entry)}")
    return PrefixEntry(entry.ids[:n], [k[:, :, :n].clone() for k in entry.keys],
                       [v[:, :, :n].clone() for v in entry.values], static=static, adapter=entry.adapter, cuts=cuts)


def drain(steps):
    """Run a step generator (``prefix_chain_steps``, ``chunked_hidden_steps``, the engine's
    ``_run_steps``) to its end and return its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def prefix_chain(runner, store: PrefixKVStore | None, ids: Sequence[int], cuts: Sequence[int], *,
                 static: int = 0, keep_static: bool = False, keep_end: bool = False, adapter: int = 0,
                 keep_first: bool = False, chunk: int = 0) -> tuple[PrefixEntry | None, torch.Tensor | None, int]:
    """Keys and values of ``ids[:cuts[-1]]`` in the canonical shape: piece by piece at the cut points.

    Each piece ``[cuts[k-1], cuts[k])`` is a batch-1 :func:`prefill` continuing from the entry of
    the piece before, so the entry of a cut is the same bits however often, and after whatever else,
    it is computed; the longest cut already stored is reused and only the pieces after it computed.
    With ``chunk > 0`` a piece longer than ``chunk`` tokens is itself cut every ``chunk`` tokens
    (:func:`canonical_cuts`): the same pieces a chunked request computes across scheduler steps
    (:func:`prefix_chain_steps`), so both give the same bits and share stored entries.

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        store: the prefix store, or None (every piece computed, nothing kept).
        ids: the request's token ids.
        cuts: increasing cut points (token counts), e.g. ``(frame head, static prefix, root
            segment)``; zeros and repeats are ignored.
        static: the cut that is a static prefix (stored as :attr:`PrefixEntry.static`), or 0.
        keep_static: store the static cut's entry (the engine admitted it).
        keep_end: store the last cut's entry (a state asked again reuses it whole).
        adapter: the LoRA adapter slot the caller routed these passes to (the entries' key).
        keep_first: store the first cut's entry (an adapter's frame head; the base's is pinned by
            the engine).
        chunk: the engine's chunk size (``EngineConfig.chunk_tokens``; 0: pieces are not cut).

    Returns:
        ``(entry, hidden, reused)``: the last cut's entry (None when ``cuts`` is empty), the ``(n,
        D)`` hidden states of the last piece computed (None when nothing was), and how many tokens
        came from the store.
    """
    return drain(prefix_chain_steps(runner, store, ids, cuts, static=static, keep_static=keep_static,
                                    keep_end=keep_end, adapter=adapter, keep_first=keep_first, chunk=chunk))


def prefix_chain_steps(runner, store: PrefixKVStore | None, ids: Sequence[int], cuts: Sequence[int], *,
                       static: int = 0, keep_static: bool = False, keep_end: bool = False, adapter: int = 0,
                       keep_first: bool = False, chunk: int = 0, context=None):
    """:func:`prefix_chain` as a generator: it yields (None) after each piece's forward pass and
    returns ``(entry, hidden, reused)``. A scheduler runs other passes between the yields; the
    entry built so far lives in the generator, never in the model, so they cannot touch it.

    ``context``: a callable returning a context manager entered around each piece's pass only
    (the LoRA routing of this request's adapter: other passes run between the yields).
    """
    given = sorted({int(c) for c in cuts if c > 0})
    points = canonical_cuts(given, chunk)
    entry, start = None, 0
    for k in range(len(points) - 1, -1, -1):  # the longest stored cut
        found = exact_entry(store, ids, points[k], adapter, cuts=tuple(points[:k + 1]))
        if found is not None:
            entry, start = found, k + 1
            break
    reused = len(entry) if entry is not None else 0
    if store is not None and entry is not None:
        # a cut to keep that lies inside the longer entry found (a state seen before, whose
        # schema is admitted only now): its entry is the found one's first tokens, the same bits
        # (computed along the same pieces; causal attention), so it is stored without a pass
        for k in range(start - 1):
            if (points[k] == static and keep_static) or (points[k] == given[0] and keep_first):
                if exact_entry(store, ids, points[k], adapter, cuts=tuple(points[:k + 1])) is None:
                    store.insert(leading_entry(entry, points[k], cuts=tuple(points[:k + 1]),
                                               static=points[k] == static))
    hidden = None
    for k in range(start, len(points)):
        with (context() if context is not None else contextlib.nullcontext()):
            entry, hidden = prefill(runner, ids[:points[k]], entry)
        entry.adapter, entry.cuts = adapter, tuple(points[:k + 1])
        last = k == len(points) - 1
        if points[k] == static:
            entry.static = True
        if store is not None and ((points[k] == static and keep_static) or (last and keep_end)
                                  or (points[k] == given[0] and keep_first)):
            store.insert(entry)
        yield
    return entry, hidden, reused


def causal_batch_hidden(runner, batch, requests, store: PrefixKVStore, *, head: int = 0, static: int = 0,
                        keep_static: bool = False, adapter: int = 0, chunk: int = 0) -> torch.Tensor:
    """(B, L, D) final hidden states of a causal batch (linear requests), reusing cached prefixes.

    The rows' common canonical prefix (:func:`prefix_chain`: the frame head, then ``static``
    leading tokens all rows share, the questions of a schema-first prompt) comes from ``store`` or is
    prefilled (the static piece stored when ``keep_static``: the engine admitted it). When the batch
    has several rows and their shared prefix is longer by ``store.min_tokens``, the rest is prefilled
    once for the batch (not stored: it is a piece of this batch, not of a request). Every row then
    runs only its tokens after that prefix, against the cache expanded to ``B`` rows, with position
    ids continuing from the prefix; right padding keeps the model's own causal attention exact.
    Positions inside the prefix hold zeros (they are never read: reads lie after the root segment).

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        batch: a causal :class:`~noulengine.engine.batching.Batch`.
        requests: the batch's compiled requests, in row order.
        store: the engine's prefix store (counts one query per request).
        head: the frame head's length (every request's first cut).
        static: the static prefix all rows share (0: none).
        keep_static: store the static piece.
        adapter: the LoRA adapter slot every row uses (the caller routes the passes to it).
        chunk: the engine's chunk size (the canonical pieces of :func:`prefix_chain`).
    """
    first = requests[0].token_ids
    shared = shared_root_prefix(requests)
    cuts = [c for c in (head, static) if 0 < c <= shared]
    entry, _, base_len = prefix_chain(runner, store, first, cuts, static=static if static in cuts else 0,
                                      keep_static=keep_static, adapter=adapter, keep_first=adapter != 0, chunk=chunk)
    if len(requests) > 1 and store.worth_storing(shared, entry):
        entry, _ = prefill(runner, first[:shared], entry)
    n = len(entry) if entry is not None else 0
    for row, r in enumerate(requests):
        store.record(r.input_tokens, base_len if row == 0 else n)
    if n == 0:
        return runner.hidden_states(batch)
    dev = runner.device
    rows, width = batch.input_ids.shape
    rest = runner.forward_with_cache(batch.input_ids[:, n:].to(dev), batch.position_ids[:, n:].to(dev), None,
                                     cache_for_rows(runner, entry, rows))
    hidden = torch.zeros(rows, width, rest.shape[-1], dtype=runner.dtype, device=dev)
    hidden[:, n:] = rest
    return hidden


def mixed_causal_batch_hidden(runner, batch, requests, store: PrefixKVStore, *, head: int, slots: list[int],
                              routing, chunk: int = 0) -> torch.Tensor:
    """(B, L, D) hidden states of a causal batch whose rows use different LoRA adapters.

    Each adapter's frame head comes from ``store`` (or is prefilled and kept, under that adapter:
    :func:`prefix_chain`), the heads are stacked one per row, and every row runs its remaining tokens
    in one pass with ``routing`` sending each row to its own adapter, so a mixed batch reuses the
    head as a single-adapter batch does. Without a head shared by every row, the batch runs whole.
    """
    shared = shared_root_prefix(requests)
    first = requests[0].token_ids
    if not 0 < head <= shared:
        with routing.use(slots):
            return runner.hidden_states(batch)
    heads, reused = {}, {}
    for slot in dict.fromkeys(slots):
        with routing.use(slot):
            heads[slot], _, reused[slot] = prefix_chain(runner, store, first, [head], adapter=slot, keep_first=slot != 0,
                                                          chunk=chunk)
    seen = set()
    for r, slot in zip(requests, slots):  # the first row of each adapter paid for its head when it was computed
        store.record(r.input_tokens, head if slot in seen or reused[slot] else 0)
        seen.add(slot)
    layers = len(heads[slots[0]].keys)
    entry = PrefixEntry(tuple(first[:head]), [torch.cat([heads[s].keys[i] for s in slots], 0) for i in range(layers)],
                        [torch.cat([heads[s].values[i] for s in slots], 0) for i in range(layers)])
    dev = runner.device
    rows, width = batch.input_ids.shape
    with routing.use(slots):
        rest = runner.forward_with_cache(batch.input_ids[:, head:].to(dev), batch.position_ids[:, head:].to(dev), None,
                                         cache_for_rows(runner, entry, rows))
    hidden = torch.zeros(rows, width, rest.shape[-1], dtype=runner.dtype, device=dev)
    hidden[:, head:] = rest
    return hidden
