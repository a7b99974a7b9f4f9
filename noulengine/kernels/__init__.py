"""Hot-path kernels. Each has a plain-torch reference (CPU, the test oracle).

:func:`term_logprobs` dispatches to the Triton kernel on CUDA when Triton is importable and no
gradient is needed, and to the torch reference otherwise.
"""

from __future__ import annotations

import torch

from noulengine.kernels.reference import candidate_logits_reference, term_logprobs_reference


def term_logprobs(hidden: torch.Tensor, weight: torch.Tensor, term_pos: torch.Tensor, term_tok: torch.Tensor, *,
                  bias: torch.Tensor | None = None, softcap: float | None = None):
    """See :func:`noulengine.kernels.reference.term_logprobs_reference` (same contract)."""
    # The Triton kernel has no backward: a training step (hidden states that need gradients) takes
    # the torch reference, which autograd differentiates (found on the first GPU training run).
    if hidden.is_cuda and bias is None and not (torch.is_grad_enabled() and hidden.requires_grad):
        try:
            from noulengine.kernels.triton_readout import term_logprobs_triton
        except ImportError:
            pass
        else:
            return term_logprobs_triton(hidden, weight, term_pos, term_tok, softcap=softcap)
    return term_logprobs_reference(hidden, weight, term_pos, term_tok, bias=bias, softcap=softcap)


__all__ = ["candidate_logits_reference", "term_logprobs", "term_logprobs_reference"]
