"""Prefix KV cache for tree requests: prefill the shared prefix once, then every branch as a batch.

The tree path runs a request as one packed sequence of ``L = P + S`` tokens (prefix ``P``,
branches ``S``) under a dense ``(L, L)`` mask, so attention costs ``(P + S)^2`` pairs, most of them
masked (branch-to-other-branch). This path instead:

1. prefills the prefix alone with the model's own causal attention (``use_cache=True``), keeping
   its keys and values in a :class:`transformers.DynamicCache` (with cross-request prefix
   caching, only the part after the longest cached prefix: :mod:`noulengine.engine.prefix_store`);
2. runs the branches as a batch of ``B`` rows (row ``r`` = branch ``r`` and its label-sequence
   candidates, packed in the tree's order), right-padded to ``b`` tokens, against the cached
   prefix: the cache is expanded to ``B`` rows without copying (``Tensor.expand``), each row gets
   the tree's own position ids (continuing from the prefix) and a ``(b, P + b)`` mask (the whole
   prefix, plus the tree mask restricted to its own branch). Attention costs ``B * b * (P + b)``.

The hidden states are scattered back to the packed positions, so the readout is the tree path's.
The tree path stays the reference (``tests/test_prefix_cache.py``: equal within 1e-5).

Not used (the tree path runs instead) for models with sliding-window layers (their cache keeps only
the last window of keys, which would misalign the prefix) and for flex attention.
"""

from __future__ import annotations

import torch

from noulengine.compile.layout import CompiledRequest


def prefix_cache_unsupported(runner) -> str | None:
    """Why a model cannot use the prefix cache path, or None when it can."""
    if runner.sliding_window is not None:
        return "sliding-window layers (the cache keeps only the last window of keys)"
    if runner.attn_implementation not in ("sdpa", "eager"):
        return f"attention implementation {runner.attn_implementation!r}"
    return None


def _branch_rows(compiled: CompiledRequest) -> list[list[int]]:
    """Per child of the root, the packed indices of its subtree (the branch and its candidates)."""
    parents = compiled.parents
    top: list[int] = []  # the root's child each segment descends from (-1 for the root)
    for s, p in enumerate(parents):
        top.append(-1 if p < 0 else (s if p == 0 else top[p]))
    rows: dict[int, list[int]] = {}
    for i, s in enumerate(compiled.segment_ids):
        if top[s] >= 0:
            rows.setdefault(top[s], []).append(i)
    return [rows[k] for k in sorted(rows)]


def prefix_cached_hidden(runner, compiled: CompiledRequest, store=None) -> torch.Tensor:
    """(1, L, D) final hidden states of one compiled request, computed with a prefix KV cache.

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        compiled: one request (a root segment with at least one branch).
        store: the engine's :class:`~noulengine.engine.prefix_store.PrefixKVStore` (cross-request
            prefix caching), or None. With a store, the prefill starts after the longest cached
            prefix of the request's root segment, and the whole root segment is stored for later
            requests on the same state (hidden states inside a reused prefix are zeros: no read
            position lies there).

    Returns:
        The same tensor the tree path would give at every position the prefill computed (within
        float tolerance), model dtype, on device.
    """
    from noulengine.engine.prefix_store import cache_for_rows, prefill

    dev = runner.device
    p = compiled.prefix_tokens
    ids = torch.tensor(compiled.token_ids, dtype=torch.long)
    pos = torch.tensor(compiled.position_ids, dtype=torch.long)
    hidden = torch.zeros(1, len(ids), runner.config.hidden_size, dtype=runner.dtype, device=dev)
    base = store.lookup(compiled.token_ids, p) if store is not None else None
    start = len(base) if base is not None else 0
    if start == p:
        entry = base
    else:
        entry, prefix_hidden = prefill(runner, compiled.token_ids[:p], base)
        hidden[0, start:p] = prefix_hidden
        if store is not None and store.worth_storing(p, base):
            store.insert(entry)
    if store is not None:
        store.record(compiled.input_tokens, start)
    rows = _branch_rows(compiled)
    if not rows:
        return hidden
    b_rows, width = len(rows), max(len(r) for r in rows)
    tree = compiled.attention_mask()
    input_ids = torch.full((b_rows, width), int(ids[0]), dtype=torch.long)
    position_ids = torch.zeros((b_rows, width), dtype=torch.long)
    mask = torch.zeros((b_rows, 1, width, p + width), dtype=torch.bool)
    diag = torch.arange(width)
    mask[:, 0, diag, p + diag] = True  # padding attends to itself: never an all-masked row
    for r, idx in enumerate(rows):
        n = len(idx)
        t = torch.tensor(idx)
        input_ids[r, :n] = ids[t]
        position_ids[r, :n] = pos[t]
        mask[r, 0, :n, :p] = True  # every branch token sees the whole prefix
        mask[r, 0, :n, p:p + n] = tree[t][:, t]
    branch_hidden = runner.forward_with_cache(input_ids.to(dev), position_ids.to(dev), runner._device_mask(mask),
                                              cache_for_rows(runner, entry, b_rows))
    for r, idx in enumerate(rows):
        hidden[0, torch.tensor(idx, device=dev)] = branch_hidden[r, :len(idx)]
    return hidden
