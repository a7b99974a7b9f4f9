"""Triton readout kernel (CUDA): candidate-row gather + head matmul + log-softmax at read positions.

Same contract as :func:`noulengine.kernels.reference.term_logprobs_reference` (without a head
bias: the dispatcher in :mod:`noulengine.kernels` sends biased heads to the reference).

Two launches:

1. ``_lse_kernel``: grid (ceil(P / BLOCK_P), SPLITS). Each program owns BLOCK_P read positions
   and one contiguous slice of the vocabulary; it walks the slice in BLOCK_V-row tiles, forms the
   (BLOCK_P, BLOCK_V) logits with ``tl.dot`` over BLOCK_D chunks of the hidden size (float32
   accumulation), soft-caps them and keeps an online (running max, running sum of exp) pair.
   It writes one partial log-sum-exp per (position, split); the partials (P, SPLITS) are merged
   with ``torch.logsumexp``. Splitting the vocabulary keeps the GPU busy when P is small.
2. ``_term_kernel``: grid (T,). Each program gathers hidden row ``term_pos[t]`` and head row
   ``term_tok[t]`` (int64 offsets: V x D exceeds 2^31 for 128k-vocabulary 8B heads), dots them in
   float32, soft-caps and subtracts the position's log-sum-exp.

Importing this module without Triton or without a CUDA device raises ImportError, which the
dispatcher treats as "use the reference".
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("noulengine.kernels.triton_readout needs triton (pip install triton)") from exc
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    raise ImportError("noulengine.kernels.triton_readout needs a CUDA device")


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _lse_kernel(h_ptr, w_ptr, out_ptr, P, V, D, stride_hp, stride_wv, rows_per_split, softcap,
                HAS_SOFTCAP: tl.constexpr, IEEE: tl.constexpr, SPLITS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_V: tl.constexpr,
                BLOCK_D: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_p = (pid_p * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
    p_ok = offs_p < P
    v_start = pid_s.to(tl.int64) * rows_per_split
    v_end = tl.minimum(v_start + rows_per_split, V)
    run_max = tl.full((BLOCK_P,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK_P,), dtype=tl.float32)
    for v0 in range(v_start, v_end, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        v_ok = offs_v < v_end
        acc = tl.zeros((BLOCK_P, BLOCK_V), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = (d0 + tl.arange(0, BLOCK_D)).to(tl.int64)
            d_ok = offs_d < D
            h = tl.load(h_ptr + offs_p[:, None] * stride_hp + offs_d[None, :], mask=p_ok[:, None] & d_ok[None, :],
                        other=0.0)
            w = tl.load(w_ptr + offs_v[None, :] * stride_wv + offs_d[:, None], mask=v_ok[None, :] & d_ok[:, None],
                        other=0.0)
            if IEEE:  # float32 inputs: no silent TF32 rounding
                acc += tl.dot(h, w.to(h.dtype), input_precision="ieee", out_dtype=tl.float32)
            else:
                acc += tl.dot(h, w.to(h.dtype), out_dtype=tl.float32)
        if HAS_SOFTCAP:
            acc = _tanh(acc / softcap) * softcap
        acc = tl.where(v_ok[None, :], acc, float("-inf"))
        tile_max = tl.max(acc, axis=1)
        new_max = tl.maximum(run_max, tile_max)
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe_max) + tl.sum(tl.exp(acc - safe_max[:, None]), axis=1)
        run_max = new_max
    lse = tl.where(run_sum > 0, run_max + tl.log(run_sum), float("-inf"))
    tl.store(out_ptr + offs_p * SPLITS + pid_s, lse, mask=p_ok)


@triton.jit
def _term_kernel(h_ptr, w_ptr, pos_ptr, tok_ptr, lse_ptr, out_ptr, D, stride_hp, stride_wv, softcap,
                 HAS_SOFTCAP: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    p = tl.load(pos_ptr + t).to(tl.int64)
    v = tl.load(tok_ptr + t).to(tl.int64)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = (d0 + tl.arange(0, BLOCK_D)).to(tl.int64)
        d_ok = offs_d < D
        h = tl.load(h_ptr + p * stride_hp + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + v * stride_wv + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        acc += h * w
    logit = tl.sum(acc, axis=0)
    if HAS_SOFTCAP:
        logit = _tanh(logit / softcap) * softcap
    tl.store(out_ptr + t, logit - tl.load(lse_ptr + p))


def term_logprobs_triton(hidden: torch.Tensor, weight: torch.Tensor, term_pos: torch.Tensor, term_tok: torch.Tensor,
                         *, softcap: float | None = None, block_p: int = 16, block_v: int = 128, block_d: int = 64,
                         splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused readout on CUDA.

    Args:
        hidden: (P, D) read-position hidden states (bf16/fp16/fp32, CUDA).
        weight: (V, D) output-head weight on the same device (rows contiguous: stride(1) == 1).
        term_pos: (T,) int64 row of ``hidden`` per term; term_tok: (T,) int64 token id per term.
        softcap: final logit soft-cap (None or 0 for none).
        splits: vocabulary slices per position block (default: enough programs to fill the GPU).

    Returns:
        ``(term_logp, lse)``: (T,) and (P,) float32, as the reference.
    """
    if not (hidden.is_cuda and weight.is_cuda):
        raise ValueError("term_logprobs_triton needs CUDA tensors")
    hidden = hidden.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    p, d = hidden.shape
    v = weight.shape[0]
    if weight.dtype != hidden.dtype:
        hidden = hidden.to(weight.dtype)
    p_blocks = triton.cdiv(max(p, 1), block_p)
    if splits is None:
        sms = torch.cuda.get_device_properties(hidden.device).multi_processor_count
        splits = max(1, min(triton.cdiv(v, block_v), triton.cdiv(4 * sms, p_blocks)))
    rows_per_split = triton.cdiv(triton.cdiv(v, splits), block_v) * block_v
    splits = triton.cdiv(v, rows_per_split)
    partial = torch.empty((p, splits), dtype=torch.float32, device=hidden.device)
    cap = float(softcap or 0.0)
    if p > 0:
        _lse_kernel[(p_blocks, splits)](hidden, weight, partial, p, v, d, hidden.stride(0), weight.stride(0),
                                        rows_per_split, cap, HAS_SOFTCAP=bool(softcap),
                                        IEEE=hidden.dtype == torch.float32, SPLITS=splits,
                                        BLOCK_P=block_p, BLOCK_V=block_v, BLOCK_D=block_d)
    lse = torch.logsumexp(partial, dim=1)
    t = term_pos.numel()
    out = torch.empty((t,), dtype=torch.float32, device=hidden.device)
    if t > 0:
        _term_kernel[(t,)](hidden, weight, term_pos.to(torch.int64).contiguous(),
                           term_tok.to(torch.int64).contiguous(), lse, out, d, hidden.stride(0), weight.stride(0),
                           cap, HAS_SOFTCAP=bool(softcap), BLOCK_D=triton.next_power_of_2(min(d, 1024)))
    return out, lse
