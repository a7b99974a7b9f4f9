"""Packing compiled requests into padded batches under a token budget, longest first."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from noulengine.compile.layout import CompiledRequest


@dataclass
class Batch:
    """Tensors for one forward pass over ``B`` requests padded to ``L`` tokens.

    Attributes:
        indices: the requests' indices in the caller's list, in row order.
        input_ids: (B, L) int64.
        position_ids: (B, L) int64 tree depths (0 on padding).
        mask: (B, 1, L, L) bool, True = may attend. Padding rows attend to themselves only, so
            no row is ever fully masked (no NaN). None for a causal batch (every request
            linear, right-padded): the model's own causal attention runs with no dense mask,
            and no real token can see a pad, which all come after it.
        real_tokens: tokens that are not padding.
        vision: ``(row, prefix_tokens, inputs)`` for each row whose request has images
            (:class:`noulengine.vision.VisionInputs`), in row order; empty for text batches.
    """

    indices: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor | None
    real_tokens: int
    vision: list = field(default_factory=list)

    @property
    def causal(self) -> bool:
        """True for a batch run through the model's own causal attention (``mask`` is None)."""
        return self.mask is None

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def padding_share(self) -> float:
        return 1.0 - self.real_tokens / max(self.padded_tokens, 1)


def plan_batches(lengths: list[int], *, batch_tokens: int, max_batch_size: int = 64,
                 max_row_padding: float = 0.125) -> list[list[int]]:
    """Group request indices into batches, longest first, each within ``batch_tokens`` padded tokens.

    Args:
        lengths: packed tokens per request.
        batch_tokens: padded tokens (rows x width) per batch at most.
        max_batch_size: rows per batch at most.
        max_row_padding: a request joins the current batch only if padding it to the batch width
            wastes at most this share of its row (0.125: 1/8); padding is pure wasted compute on
            a CPU, where one long row already runs the matmuls near peak.

    A request longer than the budget still gets a batch of its own (it was already accepted by
    the compiler's limits). Sorting by length keeps padding small and makes an out-of-memory
    error happen on the first batch, not the last.

    Returns:
        Batches of request indices; every index appears exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]  # first is the longest
        too_short = lengths[i] < width * (1.0 - max_row_padding)
        if current and ((len(current) + 1) * width > batch_tokens or len(current) >= max_batch_size or too_short):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def collate(requests: list[CompiledRequest], indices: list[int], *, pad_id: int = 0, causal: bool = False) -> Batch:
    """Pad the selected compiled requests into one :class:`Batch` (CPU tensors).

    Args:
        causal: build a causal batch (no dense mask; see :attr:`Batch.mask`). Every selected
            request must be linear (:attr:`CompiledRequest.is_linear`).

    Raises:
        ValueError: ``causal`` with a request that is not linear or has images (image rows need
            the tree path's merged embeddings and masks).
    """
    rows = [requests[i] for i in indices]
    b, width = len(rows), max(r.input_tokens for r in rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((b, width), dtype=torch.long)
    if causal:
        bad = [i for i, r in zip(indices, rows) if not r.is_linear]
        if bad:
            raise ValueError(f"causal batch with non-linear requests at {bad}: their trees need the tree mask")
        with_images = [i for i, r in zip(indices, rows) if r.vision is not None]
        if with_images:
            raise ValueError(f"causal batch with image requests at {with_images}: they run on the tree path")
        mask = None
    else:
        mask = torch.zeros((b, 1, width, width), dtype=torch.bool)
        diag = torch.arange(width)
        mask[:, 0, diag, diag] = True  # padding attends to itself: never an all-masked row
    real = 0
    vision = []
    for row, r in enumerate(rows):
        n = r.input_tokens
        real += n
        if r.vision is not None:
            vision.append((row, r.prefix_tokens, r.vision))
        input_ids[row, :n] = torch.tensor(r.token_ids, dtype=torch.long)
        position_ids[row, :n] = torch.tensor(r.position_ids, dtype=torch.long)
        if mask is not None:
            mask[row, 0, :n, :n] = r.attention_mask()
    return Batch(indices=list(indices), input_ids=input_ids, position_ids=position_ids, mask=mask, real_tokens=real,
                 vision=vision)
