"""Paired bootstrap intervals for decision-level accuracy, resampling records (not decisions).

Two systems answered the same records. A record may hold several decisions (typed_decisions asks
five questions per ticket); its decisions share one piece of evidence, so they are resampled
together: each bootstrap replicate draws ``R`` record indices uniformly with replacement, and every
statistic of that replicate (each system's accuracy, their difference, an accuracy minus chance) is
computed on the same draw. The interval is the percentile interval of the replicates (Efron &
Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13); drawing both systems' scores from
the same resample is the paired bootstrap of Koehn, "Statistical Significance Tests for Machine
Translation Evaluation", EMNLP 2004.

Accuracy over a replicate is a ratio of sums, ``sum(correct[idx]) / sum(decisions[idx])``, exactly
as the scorer computes it over the whole suite (decision level, errors counted wrong).

:func:`replicate_accuracies` is the vectorised path; :func:`replicate_accuracies_reference` draws the
same indices one replicate at a time in plain Python, and the tests compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

N_RESAMPLES = 10_000
SEED = 0
CHUNK = 256  # replicates per vectorised step: a (CHUNK, R) index matrix; 7,600 AG News records = 15 MB


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided percentile interval (same units as ``value``)."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}

    @property
    def above_zero(self) -> bool:
        """The whole interval is above zero (a difference that the resampling does not explain)."""
        return self.low > 0

    @property
    def below_zero(self) -> bool:
        return self.high < 0


def _index_chunks(n_records: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """The replicates' record indices, ``CHUNK`` rows at a time: int64 arrays of shape
    ``(min(CHUNK, left), n_records)``, values in ``[0, n_records)``, from numpy's PCG64 with ``seed``.
    Both paths draw from this generator, so they see the same replicates."""
    rng = np.random.default_rng(seed)
    left = n_resamples
    while left > 0:
        k = min(CHUNK, left)
        yield rng.integers(0, n_records, size=(k, n_records), dtype=np.int64)
        left -= k


def _check(correct: np.ndarray, decisions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    correct = np.asarray(correct, dtype=np.float64)
    decisions = np.asarray(decisions, dtype=np.float64)
    if correct.ndim == 1:
        correct = correct[:, None]
    if correct.ndim != 2 or decisions.ndim != 1 or correct.shape[0] != decisions.shape[0]:
        raise ValueError(f"correct must be (R,) or (R, M) and decisions (R,) with the same R, got "
                         f"{correct.shape} and {decisions.shape}")
    if correct.shape[0] == 0:
        raise ValueError("no records to resample")
    if decisions.sum() <= 0:
        raise ValueError("the records hold no decisions")
    if (correct < 0).any() or (correct > decisions[:, None]).any():
        raise ValueError("correct must lie in [0, decisions] per record")
    return correct, decisions


def replicate_accuracies(correct, decisions, *, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Each system's accuracy on each bootstrap replicate.

    Args:
        correct: float or int array of shape ``(R,)`` or ``(R, M)``: per record, the number of its
            decisions each of ``M`` systems got right (a statistic of the same shape works too, e.g.
            the summed chance ``1/K`` of a record's decisions).
        decisions: shape ``(R,)``: the record's hard-labelled decisions (the same for every system).
        n_resamples: replicates (10,000 by default).
        seed: the generator's seed; the same seed gives the same replicates for every call with the
            same ``R``, so statistics computed in separate calls are still paired.

    Returns:
        float64 array ``(n_resamples, M)``: ``sum(correct[idx, m]) / sum(decisions[idx])``; a
        replicate that drew only records without decisions gives NaN (never with ``R`` records
        of which any has a decision and ``R >= 20``, in practice).

    Raises:
        ValueError: shapes disagree, there are no records or no decisions, or a count is outside
            ``[0, decisions]``.
    """
    correct, decisions = _check(correct, decisions)
    out = []
    for idx in _index_chunks(len(decisions), n_resamples, seed):
        num = correct[idx].sum(axis=1)  # (k, M)
        den = decisions[idx].sum(axis=1)  # (k,)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(num / den[:, None])
    return np.concatenate(out, axis=0)


def replicate_accuracies_reference(correct, decisions, *, n_resamples: int = N_RESAMPLES,
                                   seed: int = SEED) -> np.ndarray:
    """:func:`replicate_accuracies` one replicate and one record at a time (the slow reference)."""
    correct, decisions = _check(correct, decisions)
    rows = []
    for idx in _index_chunks(len(decisions), n_resamples, seed):
        for draw in idx.tolist():
            den = sum(float(decisions[i]) for i in draw)
            rows.append([sum(float(correct[i, m]) for i in draw) / den if den else float("nan")
                         for m in range(correct.shape[1])])
    return np.asarray(rows, dtype=np.float64)


def percentile_interval(point: float, replicates: np.ndarray, level: float = 0.95) -> Interval:
    """``point`` with the ``level`` percentile interval of ``replicates`` (NaN replicates dropped).

    Raises:
        ValueError: ``level`` outside (0, 1), or no finite replicate.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    reps = np.asarray(replicates, dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        raise ValueError("no finite bootstrap replicate")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(reps, [tail, 100 - tail])
    return Interval(float(point), float(low), float(high))
