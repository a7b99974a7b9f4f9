"""Plain metric functions on probability tensors (float64).

Conventions shared by every function here:

* ``probs``: ``(N, K)`` floating tensor, one row per decision, candidates in criteria order.
  Questions with fewer than ``K`` candidates are padded with zeros on the right; a zero padding
  slot never changes any metric below.
* ``target``: ``(N,)`` integer tensor of gold candidate indices in ``[0, K)``.
* ``gold``: ``(N, K)`` floating tensor of gold distributions (soft gold), zero-padded the same way.
* ``num_levels``: ``(N,)`` integer tensor, the real number of candidates per row (ordinal only).
* Inputs are converted to float64 before any arithmetic; results are float64 tensors.
* ``reduction="mean"`` returns a 0-d tensor (the mean over rows); ``"none"`` the ``(N,)`` values.

Every function checks its arguments first and raises ``ValueError`` naming the rule broken
(wrong rank or shape, empty input, out-of-range index). Probability validity (finite, in
``[0, 1]``, sums to 1) is checked per answer upstream, see :mod:`noulengine.metrics.validation`.

Definitions:

* accuracy: ``1[argmax_k p_k = y]`` (ties resolve to the first maximal candidate).
* NLL: ``-log(max(p_y, 1e-12))``, natural log (nats), no renormalisation.
* Brier (multiclass, Brier 1950): ``sum_k (p_k - 1[k = y])^2``, in ``[0, 2]``.
* ordinal MAE: ``|sum_k k p_k - y|`` in levels.
* RPS (ranked probability score, Epstein 1969), ``K`` levels:
  ``1/(K-1) * sum_{j=0}^{K-2} (F_j - G_j)^2`` with ``F``, ``G`` the predicted and gold CDFs.
* KL(q || p) = ``sum_k q_k (log q_k - log max(p_k, 1e-12))``, terms with ``q_k = 0`` are 0 (nats).
* Brier against a distribution: ``sum_k (p_k - q_k)^2``.
* total variation distance: ``0.5 * sum_k |p_k - q_k|``.
* ROC AUC of a score against binary gold (:func:`binary_auc`): the probability that a random
  positive scores above a random negative, ties counted one half; the Mann-Whitney U statistic
  over ``n_pos * n_neg`` (Mann & Whitney 1947; Hanley & McNeil 1982, *Radiology* 143:29).
"""

from __future__ import annotations

import torch

from noulengine.metrics.constants import PROB_FLOOR  # re-exported: F.PROB_FLOOR

_REDUCTIONS = ("mean", "none")


# ---------------------------------------------------------------------------------------------
# Argument checks (kept apart from the arithmetic, torchmetrics style).


def _as_f64(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):  # Python floats straight to float64, never via float32
        x = torch.as_tensor(x, dtype=torch.float64)
    t = x
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"{name} must be a real-valued tensor, got dtype {t.dtype}")
    return t.to(torch.float64)


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {list(_REDUCTIONS)}, got {reduction!r}")


def _check_probs(probs, name: str = "probs") -> torch.Tensor:
    p = _as_f64(probs, name)
    if p.ndim != 2:
        raise ValueError(f"{name} must have shape (N, K), got {tuple(p.shape)}")
    if p.shape[0] == 0:
        raise ValueError(f"{name} must have at least one row")
    if p.shape[1] < 1:
        raise ValueError(f"{name} must have at least one candidate column")
    return p


def _check_target(target, n: int, k: int) -> torch.Tensor:
    t = torch.as_tensor(target)
    if t.is_floating_point() or t.dtype == torch.bool:
        raise ValueError(f"target must hold integer indices, got dtype {t.dtype}")
    t = t.to(torch.int64)
    if t.shape != (n,):
        raise ValueError(f"target must have shape ({n},) to match probs, got {tuple(t.shape)}")
    if n and (int(t.min()) < 0 or int(t.max()) >= k):
        raise ValueError(f"target indices must lie in [0, {k}), got range [{int(t.min())}, {int(t.max())}]")
    return t


def _check_pair(probs, gold) -> tuple[torch.Tensor, torch.Tensor]:
    p = _check_probs(probs, "probs")
    q = _check_probs(gold, "gold")
    if p.shape != q.shape:
        raise ValueError(f"probs and gold must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return p, q


def _check_levels(num_levels, target: torch.Tensor, k: int) -> torch.Tensor:
    n = target.shape[0]
    lv = torch.as_tensor(num_levels)
    if lv.ndim == 0:
        lv = lv.expand(n)
    if lv.is_floating_point() or lv.dtype == torch.bool:
        raise ValueError(f"num_levels must hold integers, got dtype {lv.dtype}")
    lv = lv.to(torch.int64)
    if lv.shape != (n,):
        raise ValueError(f"num_levels must have shape ({n},), got {tuple(lv.shape)}")
    if int(lv.min()) < 2 or int(lv.max()) > k:
        raise ValueError(f"num_levels must lie in [2, {k}], got range [{int(lv.min())}, {int(lv.max())}]")
    if bool((target >= lv).any()):
        raise ValueError("every target level must be below its row's num_levels")
    return lv


def _reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    return values.mean() if reduction == "mean" else values


# ---------------------------------------------------------------------------------------------
# Hard-label metrics.


def accuracy(probs, target, *, reduction: str = "mean") -> torch.Tensor:
    """Share of rows whose most probable candidate is the gold one (first maximum wins ties)."""
    _check_reduction(reduction)
    p = _check_probs(probs)
    y = _check_target(target, p.shape[0], p.shape[1])
    return _reduce((p.argmax(dim=1) == y).to(torch.float64), reduction)


def nll(probs, target, *, reduction: str = "mean") -> torch.Tensor:
    """Negative log-likelihood of the gold label, ``-log(max(p_y, 1e-12))`` in nats (no renormalising)."""
    _check_reduction(reduction)
    p = _check_probs(probs)
    y = _check_target(target, p.shape[0], p.shape[1])
    p_gold = p.gather(1, y[:, None]).squeeze(1)
    return _reduce(-torch.log(p_gold.clamp_min(PROB_FLOOR)), reduction)


def brier(probs, target, *, reduction: str = "mean") -> torch.Tensor:
    """Multiclass Brier score ``sum_k (p_k - 1[k = y])^2`` per row (range ``[0, 2]``)."""
    _check_reduction(reduction)
    p = _check_probs(probs)
    y = _check_target(target, p.shape[0], p.shape[1])
    onehot = torch.zeros_like(p).scatter_(1, y[:, None], 1.0)
    return _reduce(((p - onehot) ** 2).sum(dim=1), reduction)


# ---------------------------------------------------------------------------------------------
# Ordinal metrics (score questions: candidate k is level k).


def expected_level(probs) -> torch.Tensor:
    """``sum_k k p_k`` per row, shape ``(N,)`` float64 (zero padding contributes nothing)."""
    p = _check_probs(probs)
    levels = torch.arange(p.shape[1], dtype=torch.float64)
    return (p * levels).sum(dim=1)


def ordinal_mae(probs, target, *, reduction: str = "mean") -> torch.Tensor:
    """Absolute difference between the expected level and the gold level, in levels."""
    _check_reduction(reduction)
    p = _check_probs(probs)
    y = _check_target(target, p.shape[0], p.shape[1])
    return _reduce((expected_level(p) - y.to(torch.float64)).abs(), reduction)


def rps(probs, target, num_levels, *, reduction: str = "mean") -> torch.Tensor:
    """Ranked probability score ``1/(K-1) sum_{j<K-1} (F_j - G_j)^2`` with each row's own ``K``.

    Args:
        num_levels: ``(N,)`` integers (or one int for all rows), the real level count ``K >= 2``
            of each row; columns at or past ``K - 1`` are masked out.
    """
    _check_reduction(reduction)
    p = _check_probs(probs)
    y = _check_target(target, p.shape[0], p.shape[1])
    lv = _check_levels(num_levels, y, p.shape[1])
    cols = torch.arange(p.shape[1])
    cdf_pred = p.cumsum(dim=1)
    cdf_gold = (cols[None, :] >= y[:, None]).to(torch.float64)
    mask = cols[None, :] < (lv - 1)[:, None]
    sq = torch.where(mask, (cdf_pred - cdf_gold) ** 2, torch.zeros((), dtype=torch.float64))
    return _reduce(sq.sum(dim=1) / (lv - 1).to(torch.float64), reduction)


# ---------------------------------------------------------------------------------------------
# Soft-gold metrics (a gold distribution q per row).


def kl_divergence(gold, probs, *, reduction: str = "mean") -> torch.Tensor:
    """``KL(q || p) = sum_k q_k (log q_k - log max(p_k, 1e-12))`` in nats; ``q_k = 0`` terms are 0.

    Note the argument order follows the notation: ``gold`` (q) first, then ``probs`` (p).
    """
    _check_reduction(reduction)
    p, q = _check_pair(probs, gold)
    logp = torch.log(p.clamp_min(PROB_FLOOR))
    pos = q > 0
    logq = torch.log(torch.where(pos, q, torch.ones((), dtype=torch.float64)))
    terms = torch.where(pos, q * (logq - logp), torch.zeros((), dtype=torch.float64))
    return _reduce(terms.sum(dim=1), reduction)


def brier_distribution(probs, gold, *, reduction: str = "mean") -> torch.Tensor:
    """Brier score against a gold distribution, ``sum_k (p_k - q_k)^2`` per row."""
    _check_reduction(reduction)
    p, q = _check_pair(probs, gold)
    return _reduce(((p - q) ** 2).sum(dim=1), reduction)


def total_variation(probs, gold, *, reduction: str = "mean") -> torch.Tensor:
    """Total variation distance ``0.5 * sum_k |p_k - q_k|`` per row (range ``[0, 1]``)."""
    _check_reduction(reduction)
    p, q = _check_pair(probs, gold)
    return _reduce(0.5 * (p - q).abs().sum(dim=1), reduction)


def binary_auc(scores, positive) -> torch.Tensor:
    """ROC AUC of ``scores`` for the binary gold ``positive`` (e.g. P(yes) against "gold is yes").

    Computed from average ranks (ties share a rank, so a tied positive/negative pair counts 1/2):
    ``AUC = (R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)`` with ``R_pos`` the positives' rank
    sum, which equals the pairwise definition ``P(s_pos > s_neg) + 0.5 P(s_pos = s_neg)``. 0.5 is
    no separation (a constant score), 1.0 every positive above every negative.

    Args:
        scores: ``(N,)`` real tensor (float64 after conversion).
        positive: ``(N,)`` boolean or 0/1 tensor, True where the gold is the positive class.

    Returns:
        0-d float64 tensor in ``[0, 1]``.

    Raises:
        ValueError: not two 1-d tensors of the same length; a non-finite score; ``positive`` not
            0/1; no positive or no negative (the AUC is undefined).
    """
    s = _as_f64(scores, "scores")
    y = torch.as_tensor(positive)
    if s.ndim != 1 or y.ndim != 1 or s.shape != y.shape:
        raise ValueError(f"scores and positive must be 1-d tensors of one length, got {tuple(s.shape)} and "
                         f"{tuple(y.shape)}")
    if not torch.isfinite(s).all():
        raise ValueError("scores must be finite")
    if y.dtype != torch.bool:
        if not ((y == 0) | (y == 1)).all():
            raise ValueError("positive must be boolean or 0/1")
        y = y == 1
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"the AUC needs positives and negatives, got {n_pos} positive and {n_neg} negative")
    order = torch.argsort(s, stable=True)
    sorted_s = s[order]
    ranks = torch.empty_like(s)
    # average rank (1-based) of each run of equal scores
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    avg = ends - (counts.to(torch.float64) - 1) / 2
    ranks[order] = avg[inverse]
    r_pos = ranks[y].sum()
    return (r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
