"""Prefix KV cache for tree requests: prefill the shared prefix once, then every branch as a batch.

The tree path runs a request as one packed sequence of ``L = P + S`` tokens (prefix ``P``,
branches ``S``) under a dense ``(L, L)`` mask, so attention costs ``(P + S)^2`` pairs, most of them
masked (branch-to-other-branch). This path instead, for a batch of tree requests planned like any
other batch (longest first, under the token budget):

1. prefills the requests' prefixes as one right-padded batch with the model's own causal
   attention (``use_cache=True``), keeping their keys and values in a
   :class:`transformers.DynamicCache` (with cross-request prefix caching, only the part after
   the longest stored prefix they share, and nothing for a prefix stored whole:
   :mod:`noulengine.engine.prefix_store`);
2. runs the branches of every request as one batch of rows (row ``r`` = all branches of one
   request with their label-sequence candidates, packed in the tree's order), right-padded to
   ``b`` tokens, against its own request's cached prefix (padded to the longest prefix ``P``, the
   padding masked out): each row gets the tree's own position ids (continuing from the prefix)
   and a ``(b, P + b)`` mask (its request's prefix, plus the tree mask among its branches, which
   keeps each branch apart). Attention costs ``requests * b * (P + b)``; each prefix's keys and
   values are read once per request, not once per branch.

The hidden states are scattered back to the packed positions, so the readout is the tree path's.
The tree path stays the reference (``tests/test_prefix_cache.py``: equal within 1e-5).

Not used (the tree path runs instead) for models with sliding-window layers (their cache keeps only
the last window of keys, which would misalign the prefix) and for flex attention.
"""

from __future__ import annotations

import torch

from noulengine.compile.layout import CompiledRequest, shared_root_prefix


def prefix_cache_unsupported(runner) -> str | None:
    """Why a model cannot use the prefix cache path (nor cross-request prefix caching), or None."""
    if runner.sliding_window is not None:
        return "sliding-window layers (the cache keeps only the last window of keys)"
    cfg = runner.config
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) is not False:
        # Mistral-style configs: a window for every layer, no layer_types (the cache keeps the window only)
        return "sliding-window attention (the cache keeps only the last window of keys)"
    if getattr(runner, "quantized", False):
        # dynamic int8 scales activations per input tensor: a prefix computed apart is not exact
        return "dynamic int8 quantization (activation scales depend on what is computed together)"
    if runner.attn_implementation not in ("sdpa", "eager"):
        return f"attention implementation {runner.attn_implementation!r}"
    return None


def prefix_cached_hidden(runner, compiled: CompiledRequest, store=None, *, head: int = 0) -> torch.Tensor:
    """(1, L, D) final hidden states of one compiled request (:func:`prefix_cached_hidden_batch`
    with one request; give ``head``, the frame head's length, with a store shared with an engine)."""
    return prefix_cached_hidden_batch(runner, [compiled], [0], store=store, head=head)


def prefix_cached_hidden_batch(runner, requests: list[CompiledRequest], indices: list[int],
                               store=None, *, head: int = 0, static: dict[int, int] | None = None,
                               keep_static: frozenset[int] | set[int] = frozenset(), slots: dict[int, int] | None = None,
                               routing=None, chunk: int = 0) -> torch.Tensor:
    """(B, L, D) final hidden states of ``B`` tree requests, computed with prefix KV caches.

    Two steps for the whole batch:

    1. each request's prefix (its root segment) in the canonical shape
       (:func:`~noulengine.engine.prefix_store.prefix_chain`: the frame head, its static prefix,
       the rest, each a batch-1 prefill continuing from the one before), the pieces ``store``
       holds reused: a request whose whole prefix is stored (the same state again) computes
       nothing, and gets exactly the bits it would have computed, so the store's content never
       changes an answer;
    2. the branches of every request as one batch of rows against the cached prefixes: row
       ``r`` holds one request's branches with their label-sequence candidates, the tree's own
       position ids, its prefix keys/values (padded to the longest prefix; the padding masked
       out) and the tree mask among its branches.

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        requests, indices: the compiled requests and the batch's row order (row ``b`` holds
            ``requests[indices[b]]``); each request has a root segment and at least one branch.
        store: the engine's :class:`~noulengine.engine.prefix_store.PrefixKVStore` (cross-request
            prefix caching), or None. Each request's whole prefix is stored for later requests on
            the same state; hidden states inside the prefix are zeros (no read lies there).
        head: the frame head's length (every request's first cut; 0: none).
        static: request index -> its static prefix length (the questions of a schema-first prompt,
            a cut of its chain); absent: none.
        keep_static: request indices whose static prefix the engine admitted to the store.
        slots: request index -> its LoRA adapter slot (absent or 0: the base); each request's
            prefix passes run under its adapter and are stored under it, the branch pass routes
            each row to its request's adapter (:mod:`noulengine.engine.lora`).
        routing: the engine's :class:`~noulengine.engine.lora.LoraRouting` (None: no adapters).
        chunk: the engine's chunk size: prefix pieces longer than it are cut (the canonical pieces
            of :func:`~noulengine.engine.prefix_store.prefix_chain`; 0: not cut).

    Returns:
        The tree path's hidden states (within float tolerance) at every position this call
        computed, model dtype, on device; ``L`` = the longest request.
    """
    import contextlib

    from noulengine.engine.prefix_store import PrefixEntry, cache_for_rows, prefix_chain

    slots = slots or {}

    def routed(rows):
        return routing.use(rows) if routing is not None else contextlib.nullcontext()

    dev = runner.device
    rows_req = [requests[i] for i in indices]
    width = max(c.input_tokens for c in rows_req)
    hidden = torch.zeros(len(rows_req), width, runner.config.hidden_size, dtype=runner.dtype, device=dev)
    prefix_len = [c.prefix_tokens for c in rows_req]

    # 1. prefixes: per request, (keys, values) per layer of shape (1, h, p, d), in the canonical shape
    static = static or {}
    prefix_kv: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    for b, (i, c) in enumerate(zip(indices, rows_req)):
        p, s = prefix_len[b], static.get(i, 0)
        cuts = [x for x in (head, s, p) if 0 < x <= p]
        keep_end = store is not None and p - max([x for x in (head, s) if x < p] or [0]) >= store.min_tokens
        slot = slots.get(i, 0)
        with routed(slot):
            entry, last_hidden, reused = prefix_chain(runner, store, c.token_ids, cuts, static=s if s in cuts else 0,
                                                      keep_static=i in keep_static, keep_end=keep_end, adapter=slot,
                                                      keep_first=slot != 0, chunk=chunk)
        if store is not None:
            store.record(c.input_tokens, reused)
        if last_hidden is not None:
            hidden[b, p - last_hidden.shape[0]:p] = last_hidden
        prefix_kv.append((entry.keys, entry.values))

    # 2. branches: one row per (request, child of its root)
    # 2. one row per request: all its branches (and label-sequence candidates) packed as in the tree,
    # against its own prefix once; the tree mask keeps every branch apart. (A row per branch would
    # copy the request's prefix keys/values once per branch: measured 2x slower on CPU for 5 branches.)
    plan = [(b, list(range(prefix_len[b], c.input_tokens))) for b, c in enumerate(rows_req)
            if c.input_tokens > prefix_len[b]]
    if not plan:
        return hidden
    p_max = max(prefix_len)
    b_width = max(len(idx) for _, idx in plan)
    n_rows = len(plan)
    input_ids = torch.zeros((n_rows, b_width), dtype=torch.long)
    position_ids = torch.zeros((n_rows, b_width), dtype=torch.long)
    mask = torch.zeros((n_rows, 1, b_width, p_max + b_width), dtype=torch.bool)
    diag = torch.arange(b_width)
    mask[:, 0, diag, p_max + diag] = True  # padding attends to itself: never an all-masked row
    for r, (b, idx) in enumerate(plan):
        c = rows_req[b]
        k, p = len(idx), prefix_len[b]
        input_ids[r, :k] = torch.tensor(c.token_ids[p:], dtype=torch.long)
        position_ids[r, :k] = torch.tensor(c.position_ids[p:], dtype=torch.long)
        mask[r, 0, :k, :p] = True  # every branch token sees its own request's whole prefix
        mask[r, 0, :k, p_max:p_max + k] = c.attention_mask()[p:, p:]
    row_request = torch.tensor([b for b, _ in plan], device=dev)
    layers_k, layers_v = [], []
    for layer in range(len(prefix_kv[0][0])):
        k0 = prefix_kv[0][0][layer]
        keys = k0.new_zeros((len(rows_req), k0.shape[1], p_max, k0.shape[3]))
        values = torch.zeros_like(keys)
        for b, (ks, vs) in enumerate(prefix_kv):
            keys[b, :, :prefix_len[b]] = ks[layer][0]
            values[b, :, :prefix_len[b]] = vs[layer][0]
        layers_k.append(keys.index_select(0, row_request) if n_rows != len(rows_req) else keys)
        layers_v.append(values.index_select(0, row_request) if n_rows != len(rows_req) else values)
    branch_cache = cache_for_rows(runner, PrefixEntry((), layers_k, layers_v), n_rows)
    with routed([slots.get(indices[b], 0) for b, _ in plan]):
        branch_hidden = runner.forward_with_cache(input_ids.to(dev), position_ids.to(dev), runner._device_mask(mask),
                                                  branch_cache)
    for r, (b, idx) in enumerate(plan):
        hidden[b, torch.tensor(idx, device=dev)] = branch_hidden[r, :len(idx)]
    return hidden


def chunked_hidden_steps(runner, request: CompiledRequest, store=None, *, chunk: int, head: int = 0, static: int = 0,
                         keep_static: bool = False, slot: int = 0, routing=None):
    """One large request's final hidden states, computed in canonical chunks across scheduler steps.

    A generator: it yields (None) after each forward pass and returns the ``(1, L, D)`` hidden
    states (model dtype, on device; zeros inside the prefix before its last piece, where nothing is
    read). The passes, each batch 1 and at most ``chunk`` new tokens:

    1. the prefix (root segment) along its canonical cut points
       (:func:`~noulengine.engine.prefix_store.prefix_chain_steps`: the frame head, the static
       prefix, the root, and every ``chunk`` tokens inside a longer piece), stored pieces reused;
    2. the tokens after the prefix (branches, label-sequence candidates, a linear request's tail),
       in packed order, ``chunk`` at a time: chunk ``[s, e)`` runs against the cache of every token
       before ``s`` (the prefix and the earlier chunks; the cache grows by each chunk's keys and
       values) with the ``(e - s, e)`` rows of the request's own tree mask, so each token sees
       exactly its ancestors, as in the tree path.

    Every pass's shapes and inputs depend on the request and ``chunk`` alone, never on what runs
    between the steps (other requests' passes use their own caches), so interleaving other work
    leaves the bits unchanged (``tests/test_chunked_scheduling.py``: ``torch.equal``); the tree path
    stays the reference (within float tolerance).

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        request: a compiled text request (no images).
        store: the engine's prefix store, or None; the whole prefix is stored when long enough
            (a state asked again reuses it), the static prefix when ``keep_static``.
        chunk: tokens per pass at most (``EngineConfig.chunk_tokens``, > 0).
        head, static, keep_static: the frame head's length, the request's static prefix length (0:
            none) and whether the engine admitted it to the store.
        slot, routing: the request's LoRA adapter slot and the engine's routing (None: no adapters);
            entered around each pass only, since other passes run between the steps.
    """
    import contextlib

    from noulengine.engine.prefix_store import cache_for_rows, prefix_chain_steps

    if chunk <= 0:
        raise ValueError(f"chunked_hidden_steps: chunk must be > 0, got {chunk}")

    def routed():
        return routing.use(slot) if routing is not None else contextlib.nullcontext()

    dev = runner.device
    p, n = request.prefix_tokens, request.input_tokens
    cuts = [x for x in (head, static, p) if 0 < x <= p]
    keep_end = store is not None and p - max([x for x in (head, static) if x < p] or [0]) >= store.min_tokens
    entry, last_hidden, reused = yield from prefix_chain_steps(
        runner, store, request.token_ids, cuts, static=static if static in cuts else 0, keep_static=keep_static,
        keep_end=keep_end, adapter=slot, keep_first=slot != 0, chunk=chunk, context=routed)
    if store is not None:
        store.record(n, reused)
    hidden = torch.zeros(1, n, runner.config.hidden_size, dtype=runner.dtype, device=dev)  # (1, L, D)
    if last_hidden is not None:
        hidden[0, p - last_hidden.shape[0]:p] = last_hidden
    if n == p:
        return hidden
    ids = torch.tensor(request.token_ids, dtype=torch.long)  # (L,)
    pos = torch.tensor(request.position_ids, dtype=torch.long)  # (L,)
    tree = request.attention_mask()  # (L, L) bool
    cache = cache_for_rows(runner, entry, 1)  # the prefix's keys/values; each chunk's are appended
    for s in range(p, n, chunk):
        e = min(s + chunk, n)
        with routed():
            out = runner.forward_with_cache(ids[None, s:e].to(dev), pos[None, s:e].to(dev),
                                            runner._device_mask(tree[None, None, s:e, :e].contiguous()), cache)  # (1, e - s, D)
        hidden[0, s:e] = out[0]
        yield
    return hidden
