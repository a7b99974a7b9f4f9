"""Tree attention as a ``torch.nn.attention.flex_attention`` BlockMask (the CUDA path).

The engine's packed batch (:func:`noulengine.engine.batching.collate`) describes, per row, a
token tree: segment ids, each segment's parent and each token's position id (tree depth). The
dense (B, 1, L, L) boolean mask costs B x L^2 bytes and makes sdpa visit every tile; a BlockMask
stores only which (128 x 128) tiles are non-empty, so flex attention skips the tiles that a
branch cannot see (other branches, padding).

The mask rule (identical to ``collate``'s dense mask, which the tests check element by element)::

    allowed(b, q, k) = (k <= q and q < n_b and k < n_b and anc_b[seg_b[q], seg_b[k]]
                        [and pos_b[q] - pos_b[k] < window])  or  q == k

``anc_b[i, j]`` is True when segment j is segment i or one of its ancestors; ``n_b`` is row b's
real length; padding attends to itself only (never an all-masked row).

transformers (5.x) accepts a BlockMask as ``attention_mask`` when the model's attention
implementation is ``flex_attention``: a 4D mask is used as is
(``masking_utils._preprocess_mask_arguments``) and ``integrations.flex_attention`` hands a
BlockMask to ``flex_attention(block_mask=...)``. Position ids must still be passed explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from noulengine.compile.layout import CompiledRequest
from noulengine.engine.batching import Batch

FLEX = "flex_attention"


@dataclass
class TreeTensors:
    """Per-row tree description of a padded batch (all on one device).

    Attributes:
        seg: (B, L) int64 segment id of each token (0 on padding).
        anc: (B, S, S) bool ancestor-or-self relation, S = most segments in any row.
        pos: (B, L) int64 position ids (tree depth; 0 on padding).
        length: (B,) int64 real tokens per row.
    """

    seg: torch.Tensor
    anc: torch.Tensor
    pos: torch.Tensor
    length: torch.Tensor


def tree_tensors(requests: list[CompiledRequest], batch: Batch, device: torch.device | str = "cpu") -> TreeTensors:
    """Gather the tree tensors for ``batch`` (rows ``batch.indices`` of ``requests``)."""
    rows = [requests[i] for i in batch.indices]
    b, width = batch.input_ids.shape
    s_max = max(len(r.parents) for r in rows)
    seg = torch.zeros((b, width), dtype=torch.long)
    anc = torch.zeros((b, s_max, s_max), dtype=torch.bool)
    length = torch.zeros((b,), dtype=torch.long)
    for row, r in enumerate(rows):
        n = r.input_tokens
        seg[row, :n] = torch.tensor(r.segment_ids, dtype=torch.long)
        s = len(r.parents)
        anc[row, :s, :s] = r.ancestor_matrix()
        length[row] = n
    return TreeTensors(seg.to(device), anc.to(device), batch.position_ids.to(device), length.to(device))


def tree_mask_mod(t: TreeTensors, sliding_window: int | None = None):
    """A flex ``mask_mod(b, h, q_idx, kv_idx) -> bool`` for the tree rule above.

    Written with tensor ops only, so it also evaluates on broadcast index tensors on CPU
    (:func:`dense_mask`), which is how the tests compare it with ``collate``'s mask.
    """

    def mask_mod(b, h, q_idx, kv_idx):
        n = t.length[b]
        real = (q_idx < n) & (kv_idx < n)
        tree = t.anc[b, t.seg[b, q_idx], t.seg[b, kv_idx]]
        allowed = real & (kv_idx <= q_idx) & tree
        if sliding_window is not None:
            allowed = allowed & ((t.pos[b, q_idx] - t.pos[b, kv_idx]) < sliding_window)
        return allowed | (q_idx == kv_idx)

    return mask_mod


def dense_mask(t: TreeTensors, sliding_window: int | None = None) -> torch.Tensor:
    """(B, 1, L, L) bool: the mask_mod evaluated on every (b, q, k) by broadcasting (any device)."""
    b, width = t.seg.shape
    dev = t.seg.device
    bi = torch.arange(b, device=dev)[:, None, None]
    qi = torch.arange(width, device=dev)[None, :, None]
    ki = torch.arange(width, device=dev)[None, None, :]
    return tree_mask_mod(t, sliding_window)(bi, 0, qi, ki)[:, None]


def block_mask(t: TreeTensors, sliding_window: int | None = None, *, block_size: int = 128):
    """A flex-attention BlockMask of shape (B, 1, L, L) on ``t``'s device (heads broadcast)."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, width = t.seg.shape
    return create_block_mask(tree_mask_mod(t, sliding_window), B=b, H=None, Q_LEN=width, KV_LEN=width,
                             device=t.seg.device, BLOCK_SIZE=block_size)


def batch_attention_mask(requests: list[CompiledRequest], batch: Batch, device, sliding_window: int | None = None):
    """What the model runner passes as ``attention_mask`` on the flex path.

    Returns a BlockMask, or for models with sliding-window layers the mapping
    ``{"full_attention": BlockMask, "sliding_attention": BlockMask}`` transformers expects.
    """
    t = tree_tensors(requests, batch, device)
    if sliding_window is None:
        return block_mask(t)
    return {"full_attention": block_mask(t), "sliding_attention": block_mask(t, sliding_window)}


def batch_mask_mod(batch: Batch, device, sliding_window: int | None = None):
    """A mask_mod reading ``collate``'s dense (B, 1, L, L) mask (what the model runner has).

    The dense mask already holds the tree rule; this only adds the sliding window on position ids.
    """
    mask = batch.mask.to(device)
    pos = batch.position_ids.to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = mask[b, 0, q_idx, kv_idx]
        if sliding_window is not None:
            allowed = allowed & (((pos[b, q_idx] - pos[b, kv_idx]) < sliding_window) | (q_idx == kv_idx))
        return allowed

    return mask_mod


def runner_attention_mask(batch: Batch, device, sliding_window: int | None = None, *, block_size: int = 128):
    """The model runner's flex ``attention_mask`` for a collated batch.

    Returns a (B, 1, L, L) BlockMask, or ``{"full_attention": ..., "sliding_attention": ...}``
    for models with sliding-window layers.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    b, width = batch.input_ids.shape

    def make(window):
        return create_block_mask(batch_mask_mod(batch, device, window), B=b, H=None, Q_LEN=width, KV_LEN=width,
                                 device=device, BLOCK_SIZE=block_size)

    if sliding_window is None:
        return make(None)
    return {"full_attention": make(None), "sliding_attention": make(sliding_window)}


def use_flex_attention(engine, enable: bool = True) -> None:
    """Switch an engine's model to flex attention (CUDA only) or back to sdpa.

    Raises:
        RuntimeError: the engine's model is not on CUDA (flex attention on CPU needs a compiler
            toolchain and is not the engine's CPU path).
    """
    runner = engine.runner
    if enable and runner.device.type != "cuda":
        raise RuntimeError("flex attention is used on CUDA only; the CPU path keeps sdpa with a dense mask")
    impl = FLEX if enable else "sdpa"
    runner.model.set_attn_implementation(impl)
    runner.attn_implementation = impl
