"""Plain-torch reference for the readout hot path (runs anywhere; the test oracle for kernels).

Only answer positions reach the output head, and the full-vocabulary projection is formed in
vocabulary chunks only to get the log-sum-exp normaliser at those positions.
"""

from __future__ import annotations

import torch


def _softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    # Gemma 2/3 final logit soft-capping: cap * tanh(logits / cap).
    return logits if not cap else torch.tanh(logits / cap) * cap


def term_logprobs_reference(hidden: torch.Tensor, weight: torch.Tensor, term_pos: torch.Tensor,
                            term_tok: torch.Tensor, *, bias: torch.Tensor | None = None,
                            softcap: float | None = None, vocab_chunk: int = 16384) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of chosen tokens at chosen positions.

    Args:
        hidden: (P, D) final normalised hidden states at the read positions (any float dtype).
        weight: (V, D) output-head weight (``lm_head.weight``); not modified.
        term_pos: (T,) int64 row of ``hidden`` for each term.
        term_tok: (T,) int64 token id for each term.
        bias: optional (V,) output-head bias.
        softcap: final logit soft-cap (None or 0 for none).
        vocab_chunk: vocabulary rows per matmul chunk (bounds memory at P x chunk floats).

    Returns:
        ``(term_logp, lse)``: (T,) float32 ``log softmax(logits[term_pos])[term_tok]`` and (P,)
        float32 log-sum-exp of each read position's full-vocabulary logits.
    """
    h = hidden.float()
    p = h.shape[0]
    lse = torch.full((p,), float("-inf"), dtype=torch.float32, device=h.device)
    for start in range(0, weight.shape[0], vocab_chunk):
        w = weight[start:start + vocab_chunk].float()
        logits = h @ w.T  # (P, chunk)
        if bias is not None:
            logits = logits + bias[start:start + vocab_chunk].float()
        lse = torch.logaddexp(lse, torch.logsumexp(_softcap(logits, softcap), dim=-1))
    term_logits = (h[term_pos] * weight[term_tok].float()).sum(-1)  # (T,)
    if bias is not None:
        term_logits = term_logits + bias[term_tok].float()
    term_logits = _softcap(term_logits, softcap)
    return term_logits - lse[term_pos], lse


def candidate_logits_reference(hidden: torch.Tensor, weight: torch.Tensor, term_pos: torch.Tensor,
                               term_tok: torch.Tensor, *, bias: torch.Tensor | None = None,
                               softcap: float | None = None) -> torch.Tensor:
    """(T,) float32 raw logits of chosen tokens at chosen positions (no normaliser)."""
    logits = (hidden[term_pos].float() * weight[term_tok].float()).sum(-1)
    if bias is not None:
        logits = logits + bias[term_tok].float()
    return _softcap(logits, softcap)
