"""Expected calibration error with equal-width confidence bins (Guo et al. 2017, eq. 3).

Bin ``i`` of ``n_bins`` covers ``(i/n, (i+1)/n]``; the first bin also takes confidence 0, so a
confidence of exactly ``1/n`` lands in bin 0 and exactly 1.0 in bin ``n-1``. Bins are assigned
with :func:`torch.bucketize` on the inner edges ``i/n`` (computed as ``i / n`` in float64, so a
Python ``1/15`` matches its edge exactly) and accumulated with ``scatter_add``; there is no
per-bin Python loop.

``ECE = sum_i (|B_i| / N) * |acc(B_i) - conf(B_i)|`` over non-empty bins, where ``acc`` is the
share of correct rows and ``conf`` the mean confidence in the bin.

With ``expected=True`` a row's correctness may be an *expected* correctness in ``[0, 1]`` (the
known-distribution pilot uses the reference probability of the predicted option) instead of 0/1;
the bins and the formula are the same, so there is one ECE in the project.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

N_BINS = 15


@dataclass(frozen=True)
class CalibrationBins:
    """Per-bin totals, each an ``(n_bins,)`` float64 tensor.

    Attributes:
        counts: rows per bin.
        correct: correct rows per bin.
        confidence_sum: sum of confidences per bin.
        edges: the ``n_bins + 1`` bin edges ``0, 1/n, ..., 1``.
    """

    counts: torch.Tensor
    correct: torch.Tensor
    confidence_sum: torch.Tensor
    edges: torch.Tensor

    @property
    def accuracy(self) -> torch.Tensor:
        """Per-bin accuracy; NaN for empty bins."""
        return self.correct / self.counts

    @property
    def confidence(self) -> torch.Tensor:
        """Per-bin mean confidence; NaN for empty bins."""
        return self.confidence_sum / self.counts


def _f64(x) -> torch.Tensor:
    """Python numbers go straight to float64 (``torch.as_tensor`` alone would pass via float32)."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(x, dtype=torch.float64)


def _check(confidences, correct, expected: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    c = _f64(confidences)
    if c.dtype == torch.bool:
        raise ValueError("confidences must be real numbers, got dtype torch.bool")
    c = c.to(torch.float64)
    if c.ndim != 1:
        raise ValueError(f"confidences must have shape (N,), got {tuple(c.shape)}")
    if c.shape[0] == 0:
        raise ValueError("confidences must hold at least one row")
    if not bool(torch.isfinite(c).all()) or bool(((c < 0) | (c > 1)).any()):
        raise ValueError("confidences must be finite and within [0, 1]")
    ok = _f64(correct).to(torch.float64)
    if ok.shape != c.shape:
        raise ValueError(f"correct must have shape {tuple(c.shape)}, got {tuple(ok.shape)}")
    if expected:
        if not bool(torch.isfinite(ok).all()) or bool(((ok < 0) | (ok > 1)).any()):
            raise ValueError("expected correctness must be finite and within [0, 1]")
    elif bool(((ok != 0) & (ok != 1)).any()):
        raise ValueError("correct must hold only 0/1 (or booleans)")
    return c, ok


def bin_edges(n_bins: int = N_BINS) -> torch.Tensor:
    """The ``n_bins + 1`` edges ``i / n_bins`` (float64), exact for each ``i``."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins}")
    return torch.arange(n_bins + 1, dtype=torch.float64) / n_bins


def bin_index(confidences, n_bins: int = N_BINS) -> torch.Tensor:
    """Bin of each confidence, ``(N,)`` int64: ``i`` such that ``i/n < c <= (i+1)/n`` (0 -> bin 0)."""
    c = _f64(confidences).to(torch.float64)
    inner = bin_edges(n_bins)[1:-1]
    return torch.bucketize(c, inner, right=False)


def calibration_bins(confidences, correct, n_bins: int = N_BINS, *, expected: bool = False) -> CalibrationBins:
    """Accumulate counts, correct rows and confidence per bin.

    Args:
        confidences: ``(N,)`` floats in ``[0, 1]`` (usually the maximum probability).
        correct: ``(N,)`` booleans or 0/1.
        n_bins: number of equal-width bins.
        expected: ``correct`` holds expected correctness in ``[0, 1]`` rather than 0/1.

    Raises:
        ValueError: empty input, wrong shapes, confidences outside ``[0, 1]`` or non-0/1 ``correct``
            (outside ``[0, 1]`` with ``expected``).
    """
    c, ok = _check(confidences, correct, expected)
    idx = bin_index(c, n_bins)
    zeros = torch.zeros(n_bins, dtype=torch.float64)
    counts = zeros.scatter_add(0, idx, torch.ones_like(c))
    right = zeros.scatter_add(0, idx, ok)
    conf = zeros.scatter_add(0, idx, c)
    return CalibrationBins(counts=counts, correct=right, confidence_sum=conf, edges=bin_edges(n_bins))


def expected_calibration_error(confidences, correct, n_bins: int = N_BINS, *, expected: bool = False) -> torch.Tensor:
    """ECE as a 0-d float64 tensor in ``[0, 1]``; see the module docstring for the definition
    (``expected``: ``correct`` is an expected correctness in ``[0, 1]``)."""
    bins = calibration_bins(confidences, correct, n_bins, expected=expected)
    n = bins.counts.sum()
    gap = (bins.correct - bins.confidence_sum).abs()  # = |B| * |acc - conf| for each bin
    return gap.sum() / n
