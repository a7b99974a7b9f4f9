"""Readout: from hidden states at read positions to per-question candidate log-probabilities.

Pipeline, in order:

1. gather the final hidden states at the read positions of every question in the batch;
2. apply the output head to candidate rows only (plus a vocabulary-chunked log-sum-exp at the
   read positions for the normaliser), soft-cap, in float32;
3. sum each alternative's term log-probabilities (label sequences span several terms);
4. log-sum-exp the alternatives of each candidate (e.g. "yes"/"Yes");
5. one device-to-host copy; the rest (views, temperature, softmax) happens per question.
"""

from __future__ import annotations

import torch

from noulengine.compile.layout import CompiledRequest
from noulengine.kernels import term_logprobs


def batch_candidate_logprobs(hidden: torch.Tensor, head, requests: list[CompiledRequest],
                             indices: list[int], *, length_norm: bool = False) -> list[list[torch.Tensor]]:
    """Candidate log-probabilities for every question of every request in a batch.

    Args:
        hidden: (B, L, D) final hidden states, row b holding ``requests[indices[b]]``.
        head: :class:`~noulengine.engine.model_runner.HeadInfo`.
        requests, indices: the compiled requests and the batch's row order.
        length_norm: divide each alternative's summed log-probability by its number of terms
            (label-sequence: the text's tokens plus the end-of-answer token) before the
            alternatives are combined: a per-token mean score, not a log-probability (measured by
            ``experiments/length_norm.py``; serving and training use the sum). Single-term readouts
            are unchanged.

    Returns:
        Per row, per question: a (V, K) float64 CPU tensor of full-vocabulary log-probabilities
        of each candidate in each view.
    """
    b, width, _ = hidden.shape
    term_pos, term_tok, term_alt, alt_vc, shapes = [], [], [], [], []
    alt_base = vc_base = 0
    for row, idx in enumerate(indices):
        offset = row * width
        for plan in requests[idx].questions:
            term_pos.extend(p + offset for p in plan.term_pos)
            term_tok.extend(plan.term_tok)
            term_alt.extend(a + alt_base for a in plan.term_alt)
            alt_vc.extend(v + vc_base for v in plan.alt_vc)
            alt_base += len(plan.alt_vc)
            nvc = plan.num_views * plan.num_candidates
            shapes.append((plan.num_views, plan.num_candidates))
            vc_base += nvc
    device = hidden.device
    pos = torch.tensor(term_pos, dtype=torch.long)
    unique_pos, inverse = torch.unique(pos, return_inverse=True)
    flat = hidden.reshape(b * width, -1)
    h = flat.index_select(0, unique_pos.to(device))  # (P, D): read positions only
    term_logp, _ = term_logprobs(h, head.weight, inverse.to(device), torch.tensor(term_tok, device=device),
                                 bias=head.bias, softcap=head.softcap)
    alt_logp = torch.zeros(alt_base, dtype=torch.float32, device=device)
    term_alt_t = torch.tensor(term_alt, device=device)
    alt_logp.index_add_(0, term_alt_t, term_logp)
    if length_norm:
        alt_len = torch.zeros(alt_base, dtype=torch.float32, device=device)
        alt_len.index_add_(0, term_alt_t, torch.ones_like(term_logp))
        alt_logp = alt_logp / alt_len
    vc_index = torch.tensor(alt_vc, device=device)
    vc_max = torch.full((vc_base,), float("-inf"), dtype=torch.float32, device=device)
    vc_max.scatter_reduce_(0, vc_index, alt_logp, reduce="amax")
    vc_sum = torch.zeros(vc_base, dtype=torch.float32, device=device)
    vc_sum.index_add_(0, vc_index, torch.exp(alt_logp - vc_max[vc_index]))
    vc_logp = (vc_max + torch.log(vc_sum)).double().cpu()  # the one sync of the readout
    out: list[list[torch.Tensor]] = []
    start = 0
    it = iter(shapes)
    for idx in indices:
        per_q = []
        for _plan in requests[idx].questions:
            v, k = next(it)
            per_q.append(vc_logp[start:start + v * k].view(v, k))
            start += v * k
        out.append(per_q)
    return out
