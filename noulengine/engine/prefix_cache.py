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


def prefix_cached_hidden(runner, compiled: CompiledRequest, store=None) -> torch.Tensor:
    """(1, L, D) final hidden states of one compiled request (:func:`prefix_cached_hidden_batch`
    with one request)."""
    return prefix_cached_hidden_batch(runner, [compiled], [0], store=store)


def prefix_cached_hidden_batch(runner, requests: list[CompiledRequest], indices: list[int],
                               store=None, *, static: int = 0) -> torch.Tensor:
    """(B, L, D) final hidden states of ``B`` tree requests, computed with prefix KV caches.

    Two passes for the whole batch:

    1. the requests' prefixes (root segments) as one right-padded causal batch, after the
       longest prefix they all share that ``store`` holds (usually the frame head); a request
       whose whole prefix is stored (the same state again) skips this pass;
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
            the same state; hidden states inside a reused prefix are zeros (no read lies there).
        static: leading tokens the rows share whatever their state (a static prefix the engine
            admitted: the questions of a schema-first prompt), prefilled and stored before the
            prefixes' pass when not stored yet; 0 stores none.

    Returns:
        The tree path's hidden states (within float tolerance) at every position this call
        computed, model dtype, on device; ``L`` = the longest request.
    """
    from noulengine.engine.prefix_store import PrefixEntry, cache_for_rows, store_static_prefix

    dev = runner.device
    rows_req = [requests[i] for i in indices]
    width = max(c.input_tokens for c in rows_req)
    hidden = torch.zeros(len(rows_req), width, runner.config.hidden_size, dtype=runner.dtype, device=dev)
    prefix_len = [c.prefix_tokens for c in rows_req]

    # 1. prefixes: per request, (keys, values) per layer of shape (1, h, p, d)
    prefix_kv: list[tuple[list[torch.Tensor], list[torch.Tensor]] | None] = [None] * len(rows_req)
    todo = []
    for b, c in enumerate(rows_req):
        whole = store.lookup(c.token_ids, prefix_len[b]) if store is not None else None
        if whole is not None and len(whole) == prefix_len[b]:
            prefix_kv[b] = (whole.keys, whole.values)
            store.record(c.input_tokens, len(whole))
        else:
            todo.append(b)
    if todo:
        first = rows_req[todo[0]].token_ids
        # shorter than every todo prefix: a stored entry as long as one would have been a whole hit
        shared = shared_root_prefix([rows_req[b] for b in todo])
        base = store.lookup(first, shared) if store is not None else None
        found = len(base) if base is not None else 0  # what came from the cache (the first row's hit)
        if store is not None:
            base = store_static_prefix(runner, store, first, min(static, shared), base)
        n = len(base) if base is not None else 0
        span = max(prefix_len[b] for b in todo) - n
        ids = torch.zeros((len(todo), span), dtype=torch.long)
        pos = torch.zeros((len(todo), span), dtype=torch.long)
        for row, b in enumerate(todo):
            k = prefix_len[b] - n
            ids[row, :k] = torch.tensor(rows_req[b].token_ids[n:prefix_len[b]], dtype=torch.long)
            pos[row, :k] = torch.arange(n, prefix_len[b])
        cache = cache_for_rows(runner, base, len(todo))
        # right padding: the model's own causal mask is exact for every real token
        out = runner.forward_with_cache(ids.to(dev), pos.to(dev), None, cache)
        for row, b in enumerate(todo):
            p = prefix_len[b]
            hidden[b, n:p] = out[row, :p - n]
            keys = [layer.keys[row:row + 1, :, :p] for layer in cache.layers]
            values = [layer.values[row:row + 1, :, :p] for layer in cache.layers]
            prefix_kv[b] = (keys, values)
            if store is not None:
                # the row that paid for a static prefix prefilled just now counts it as a miss
                store.record(rows_req[b].input_tokens, found if row == 0 else n)
                if store.worth_storing(p, base):  # copies: a view (even a contiguous one) keeps the batch alive
                    store.insert(PrefixEntry(tuple(rows_req[b].token_ids[:p]), [k.clone() for k in keys],
                                             [v.clone() for v in values]))

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
    branch_hidden = runner.forward_with_cache(input_ids.to(dev), position_ids.to(dev), runner._device_mask(mask),
                                              branch_cache)
    for r, (b, idx) in enumerate(plan):
        hidden[b, torch.tensor(idx, device=dev)] = branch_hidden[r, :len(idx)]
    return hidden
