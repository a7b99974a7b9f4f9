"""Prefix KV cache for tree requests: prefill the shared prefix once, then every branch as a batch.

The tree path runs a request as one packed sequence of ``L = P + S`` tokens (prefix ``P``,
branches ``S``) under a dense ``(L, L)`` mask, so attention costs ``(P + S)^2`` pairs, most of them
masked (branch-to-other-branch). This path instead:

1. prefills the prefix alone with the model's own causal attention (``use_cache=True``), keeping
   its keys and values in a :class:`transformers.DynamicCache`;
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


def prefix_cached_hidden(runner, compiled: CompiledRequest) -> torch.Tensor:
    """(1, L, D) final hidden states of one compiled request, computed with a prefix KV cache.

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        compiled: one request (a root segment with at least one branch).

    Returns:
        The same tensor the tree path would give (within float tolerance), model dtype, on device.
    """
    from transformers import DynamicCache

    dev = runner.device
    p = sum(1 for s in compiled.segment_ids if s == 0)
    ids = torch.tensor(compiled.token_ids, dtype=torch.long)
    pos = torch.tensor(compiled.position_ids, dtype=torch.long)
    hidden = torch.empty(1, len(ids), runner.config.hidden_size, dtype=runner.dtype, device=dev)
    cache = DynamicCache(config=runner.config)
    out = runner.base(input_ids=ids[None, :p].to(dev), position_ids=pos[None, :p].to(dev), attention_mask=None,
                      past_key_values=cache, use_cache=True)
    hidden[0, :p] = out.last_hidden_state[0]
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
    for layer in cache.layers:  # one prefix for every row: a view, not a copy
        layer.keys = layer.keys.expand(b_rows, -1, -1, -1)
        layer.values = layer.values.expand(b_rows, -1, -1, -1)
    out = runner.base(input_ids=input_ids.to(dev), position_ids=position_ids.to(dev),
                      attention_mask=runner._device_mask(mask), past_key_values=cache, use_cache=True)
    branch_hidden = out.last_hidden_state
    for r, idx in enumerate(rows):
        hidden[0, torch.tensor(idx, device=dev)] = branch_hidden[r, :len(idx)]
    return hidden
