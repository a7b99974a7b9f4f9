"""Readout for lm-eval: full-vocabulary token log-probabilities and greedy flags at read positions.

Pipeline, in order (what lm-eval's ``hf`` backend computes from the whole sequence's logits, here
from the read positions only):

1. cast the read positions' final hidden states to float32;
2. per vocabulary chunk: logits = hidden @ W_chunk^T (+ bias), soft-capped as the model's forward
   caps them; keep a running log-sum-exp (the normaliser), a running max and its first index
   (``argmax``), and the logit of each term's token when it falls in the chunk;
3. ``log p = logit(token) - logsumexp``; greedy = ``argmax == token`` (``torch.argmax`` picks the
   first of equal maxima, and so does the chunked scan: a later chunk wins only when strictly larger).

The token's logit is taken from the same matmul as the normaliser, so ``log p`` is exactly the
``log_softmax`` of the head's logits up to float32 summation order.
"""

from __future__ import annotations

import torch


LOGITS_BUDGET = 1 << 25  # float32 logits held at once (128 MiB): P x vocab_chunk at most


def token_logprobs(hidden: torch.Tensor, head, read: torch.Tensor, tokens: torch.Tensor, *,
                   vocab_chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities over the full vocabulary, and greedy flags, of chosen tokens.

    Args:
        hidden: (P, D) final normalised hidden states at the read positions (model dtype, any
            device); not modified.
        head: the output head (:class:`~noulengine.engine.model_runner.HeadInfo`: (V, D) weight,
            optional (V,) bias, soft-cap).
        read: (T,) int64 row of ``hidden`` each term reads (same device as ``hidden``).
        tokens: (T,) int64 token id each term reads (same device).
        vocab_chunk: vocabulary rows per matmul; None: 16,384, fewer when ``P`` is large, so that
            at most :data:`LOGITS_BUDGET` float32 logits are held at once (a perplexity window of
            8,192 read positions takes 4,096-row chunks).

    Returns:
        ``(logp, greedy)``: (T,) float32 ``log_softmax(logits[read])[tokens]`` and (T,) bool
        ``argmax(logits[read]) == tokens``, on ``hidden``'s device (no host sync here).
    """
    h = hidden.float()  # (P, D)
    p, t = h.shape[0], tokens.shape[0]
    if vocab_chunk is None:
        vocab_chunk = max(1024, min(16384, LOGITS_BUDGET // max(p, 1)))
    dev = h.device
    lse = torch.full((p,), float("-inf"), dtype=torch.float32, device=dev)
    best = torch.full((p,), float("-inf"), dtype=torch.float32, device=dev)
    best_idx = torch.zeros(p, dtype=torch.long, device=dev)
    term_logit = torch.zeros(t, dtype=torch.float32, device=dev)
    weight, bias, cap = head.weight, head.bias, head.softcap
    for start in range(0, weight.shape[0], vocab_chunk):
        w = weight[start:start + vocab_chunk]
        n = w.shape[0]
        logits = h @ w.float().T  # (P, n) float32
        if bias is not None:
            logits = logits + bias[start:start + n].float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
        chunk_max, chunk_idx = logits.max(dim=-1)  # first index of the chunk's max
        better = chunk_max > best  # strict: an equal max in a later chunk keeps the earlier index
        best = torch.where(better, chunk_max, best)
        best_idx = torch.where(better, chunk_idx + start, best_idx)
        inside = (tokens >= start) & (tokens < start + n)
        picked = logits[read, (tokens - start).clamp(0, n - 1)]  # (T,)
        term_logit = torch.where(inside, picked, term_logit)
    return term_logit - lse[read], best_idx[read] == tokens
