"""Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks", sec. 4.2).

One scalar ``T > 0`` divides every logit: ``p = softmax(z / T)``. ``T`` is fitted on held-out
rows by minimising the mean negative log-likelihood (nats) of the gold candidates. Dividing by a
positive constant keeps the order of the logits, so the argmax (the decision) never changes; only
the confidence does.

Questions may have different candidate counts ``K``: the rows are packed into one
``(N, K_max)`` float64 tensor, padded with ``-inf`` where a boolean mask is False, so the loss is
a single vectorised ``logsumexp``.

The optimiser is ``torch.optim.LBFGS`` with a strong-Wolfe line search on ``u = log T`` (so ``T``
stays positive); ``u`` is clamped to ``[log lo, log hi]`` inside the loss, so ``T`` never leaves
``bounds`` (if the optimiser produces a non-finite ``log T``, the best finite evaluation, or
``init``, is kept). Reaching a bound, a non-finite loss and a fit that stops before the gradient is small
are all reported on :class:`TemperatureFit`, never hidden.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

GRAD_TOL = 1e-6  # |dNLL/dlog T| below which a fit counts as converged
_CHANGE_TOL = 1e-15  # LBFGS tolerance_change: loss/step changes below float64 resolution


@dataclass
class TemperatureFit:
    """The result of :func:`fit_temperature`.

    Attributes:
        temperature: fitted ``T`` (dimensionless, within the bounds).
        log_temperature: ``log T``.
        nll_before: mean NLL of the gold labels at ``T = 1`` (nats per row).
        nll_after: mean NLL at the fitted ``T`` (nats per row).
        converged: the final gradient ``|dNLL/dlog T|`` is at most ``GRAD_TOL``, or ``T`` sits on
            a bound with the gradient pointing out of the interval (a constrained optimum), and
            the loss is finite.
        hit_bound: ``T`` ended on the lower or upper bound.
        iterations: LBFGS iterations run.
        n: rows fitted.
        gradient: final ``dNLL/dlog T`` (unclamped).
        warnings: human-readable notes on anything doubtful (bound hit, non-finite loss, no
            convergence within ``max_iter``).
    """

    temperature: float
    log_temperature: float
    nll_before: float
    nll_after: float
    converged: bool
    hit_bound: bool
    iterations: int
    n: int
    gradient: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """A JSON-able copy (non-finite floats become None)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


# ---------------------------------------------------------------------------------------------
# Packing and argument checks.


def pack_logits(logits: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack 1-D logit tensors of varying length into one padded tensor.

    Args:
        logits: ``N`` tensors of shape ``(K_i,)`` (any real dtype), ``K_i >= 1``.

    Returns:
        ``(z, mask)``: ``z`` is ``(N, K_max)`` float64 holding the logits and 0.0 in padding
        (finite, so gradients stay finite); ``mask`` is ``(N, K_max)`` bool, True on real entries.
        The loss applies ``-inf`` where ``mask`` is False.

    Raises:
        ValueError: empty list, a tensor that is not 1-D or is empty, or a non-finite logit.
    """
    if len(logits) == 0:
        raise ValueError("logits must hold at least one row")
    rows = []
    for i, z in enumerate(logits):
        t = torch.as_tensor(z, dtype=torch.float64) if not isinstance(z, torch.Tensor) else z.detach().to(torch.float64)
        if t.ndim != 1 or t.shape[0] < 1:
            raise ValueError(f"logits[{i}] must be a non-empty 1-D tensor, got shape {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"logits[{i}] must be finite")
        rows.append(t)
    lengths = torch.tensor([r.shape[0] for r in rows])
    k_max = int(lengths.max())
    z = torch.zeros(len(rows), k_max, dtype=torch.float64)
    for i, r in enumerate(rows):
        z[i, : r.shape[0]] = r
    mask = torch.arange(k_max)[None, :] < lengths[:, None]
    return z, mask


def _check_labels(labels, mask: torch.Tensor) -> torch.Tensor:
    y = torch.as_tensor(labels)
    if y.is_floating_point() or y.dtype == torch.bool:
        raise ValueError(f"labels must be integer indices, got dtype {y.dtype}")
    y = y.to(torch.int64)
    n = mask.shape[0]
    if y.shape != (n,):
        raise ValueError(f"labels must have shape ({n},) to match logits, got {tuple(y.shape)}")
    lengths = mask.sum(dim=1)
    if bool(((y < 0) | (y >= lengths)).any()):
        bad = int(((y < 0) | (y >= lengths)).nonzero()[0])
        raise ValueError(f"labels[{bad}] = {int(y[bad])} is not a candidate index of a row with {int(lengths[bad])} candidates")
    return y


def _check_options(init: float, bounds: tuple[float, float], max_iter: int, tol: float) -> None:
    lo, hi = bounds
    if not (0 < lo < hi and math.isfinite(hi)):
        raise ValueError(f"bounds must satisfy 0 < lo < hi < inf, got {bounds}")
    if not lo <= init <= hi:
        raise ValueError(f"init must lie within bounds {bounds}, got {init}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be at least 1, got {max_iter}")
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")


# ---------------------------------------------------------------------------------------------
# Loss and fit.


def mean_nll(z: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Mean NLL (nats) of ``labels`` under ``softmax(z / T)`` over the masked candidates.

    Args:
        z: ``(N, K)`` float64 padded logits (finite); mask: ``(N, K)`` bool; labels: ``(N,)`` int64;
        temperature: 0-d float64 tensor (may require grad).
    """
    scaled = torch.where(mask, z / temperature, torch.tensor(-math.inf, dtype=torch.float64))
    gold = scaled.gather(1, labels[:, None]).squeeze(1)
    return (torch.logsumexp(scaled, dim=1) - gold).mean()


def fit_temperature(
    logits: Sequence[torch.Tensor],
    labels: Sequence[int] | torch.Tensor,
    *,
    init: float = 1.0,
    bounds: tuple[float, float] = (0.05, 20.0),
    max_iter: int = 100,
    tol: float = 1e-9,
) -> TemperatureFit:
    """Fit one temperature by minimising the mean gold-label NLL (Guo et al. 2017).

    Args:
        logits: ``N`` 1-D tensors, row ``i`` of shape ``(K_i,)`` (the candidates' logits; ``K_i``
            may differ between rows). Converted to float64.
        labels: ``(N,)`` gold candidate indices, ``0 <= labels[i] < K_i``.
        init: starting temperature, within ``bounds``.
        bounds: ``(lo, hi)``, ``0 < lo < hi``; the fitted ``T`` is clamped into it.
        max_iter: LBFGS iterations at most.
        tol: LBFGS ``tolerance_grad``: stop once ``|dNLL/dlog T| <= tol``. (LBFGS also stops
            when a step or loss change falls under ``1e-15``, near float64 resolution.)

    Returns:
        A :class:`TemperatureFit`; see its attributes for the convergence and bound reports.

    Raises:
        NonFiniteFitError: the loss or its gradient was non-finite at any evaluation (logits that
            overflow once divided by ``T``): no temperature from such a fit is trustworthy.
        ValueError: empty or malformed logits, non-finite logits, labels out of range, bad options.
    """
    _check_options(init, bounds, max_iter, tol)
    z, mask = pack_logits(logits)
    y = _check_labels(labels, mask)
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    warnings: list[str] = []

    u = torch.tensor(math.log(init), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([u], lr=1.0, max_iter=max_iter, tolerance_grad=tol, tolerance_change=_CHANGE_TOL,
                            history_size=10, line_search_fn="strong_wolfe")
    saw_nonfinite = False
    best: list[float] = []  # [loss, log T] of the best finite evaluation

    def closure():
        nonlocal saw_nonfinite
        opt.zero_grad()
        loss = mean_nll(z, mask, y, torch.exp(u.clamp(lo, hi)))
        value = float(loss.detach())
        if not math.isfinite(value):
            saw_nonfinite = True
        elif not best or value < best[0]:
            best[:] = [value, float(u.detach())]
        loss.backward()
        if u.grad is not None and not math.isfinite(float(u.grad)):
            saw_nonfinite = True
        return loss

    with torch.no_grad():
        nll_before = float(mean_nll(z, mask, y, torch.tensor(1.0, dtype=torch.float64)))
    opt.step(closure)
    iterations = int(opt.state[u].get("n_iter", 0))

    log_t = float(u.detach())
    if not math.isfinite(log_t):
        fallback = best[1] if best else math.log(init)
        warnings.append(f"the optimiser left finite values; fell back to T = {math.exp(min(max(fallback, lo), hi)):.6g} "
                        f"({'best finite evaluation' if best else 'init'})")
        log_t = fallback
    log_t = min(max(log_t, lo), hi)
    v = torch.tensor(log_t, dtype=torch.float64, requires_grad=True)
    nll_after_t = mean_nll(z, mask, y, torch.exp(v))
    nll_after_t.backward()
    nll_after, grad = float(nll_after_t.detach()), float(v.grad)
    at_lo, at_hi = log_t <= lo, log_t >= hi
    hit_bound = at_lo or at_hi

    finite = math.isfinite(nll_after) and math.isfinite(grad)
    if saw_nonfinite or not finite:
        raise NonFiniteFitError(f"non-finite loss or gradient during the temperature fit of {int(y.shape[0])} rows "
                                f"(logits that overflow once divided by T, max |logit| "
                                f"{float(z.masked_fill(~mask, 0).abs().max()):.3g}); no temperature is given")
    stationary = abs(grad) <= GRAD_TOL or (at_lo and grad > 0) or (at_hi and grad < 0)
    converged = finite and stationary
    if hit_bound and finite:
        side, value = ("lower", bounds[0]) if at_lo else ("upper", bounds[1])
        warnings.append(f"temperature hit the {side} bound {value}; the unconstrained optimum lies beyond it")
    if finite and not stationary:
        warnings.append(f"did not converge: |dNLL/dlog T| = {abs(grad):.3g} > {GRAD_TOL} after {iterations} "
                        f"iterations (max_iter={max_iter})")
    temperature = bounds[0] if at_lo else bounds[1] if at_hi else math.exp(log_t)
    return TemperatureFit(temperature=temperature, log_temperature=log_t, nll_before=nll_before,
                          nll_after=nll_after, converged=converged, hit_bound=hit_bound,
                          iterations=iterations, n=int(y.shape[0]), gradient=grad, warnings=warnings)


class NonFiniteFitError(ValueError):
    """A temperature fit met a non-finite loss or gradient (see :func:`fit_temperature`)."""


# ---------------------------------------------------------------------------------------------
# Applying a temperature.


def _check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be finite and positive, got {temperature!r}")
    return t


def apply_temperature(logits, temperature: float):
    """Divide logits by ``T``: a tensor of any shape (same dtype back) or a list of 1-D tensors.

    The order of each row's logits, hence its argmax, is unchanged (up to float rounding, which
    can only merge two values that were a rounding step apart).

    Raises:
        ValueError: ``temperature`` is not finite and positive.
    """
    t = _check_temperature(temperature)
    if isinstance(logits, (list, tuple)):
        return [torch.as_tensor(z) / t for z in logits]
    return torch.as_tensor(logits) / t


def calibrated_probabilities(logits, temperature: float):
    """``softmax(logits / T)`` over the last dimension (a tensor, or a list of 1-D tensors)."""
    scaled = apply_temperature(logits, temperature)
    if isinstance(scaled, list):
        return [torch.softmax(s, dim=-1) for s in scaled]
    return torch.softmax(scaled, dim=-1)


# ---------------------------------------------------------------------------------------------
# One temperature per group, with fallback to parent groups.

GLOBAL = "global"


def default_parent(key: str) -> str | None:
    """``"a+b+c" -> "a+b" -> "a" -> "global" -> None`` (e.g. ``"choice+4"`` -> ``"choice"``)."""
    if key == GLOBAL:
        return None
    head, sep, _ = key.rpartition("+")
    return head if sep and head else GLOBAL


@dataclass
class GroupFit:
    """The temperature a group uses.

    Attributes:
        group: the group key.
        n_rows: rows in the group (its own rows plus those of every descendant group).
        temperature: the temperature to apply to this group.
        source: the group whose fit is used (``group`` itself unless it fell back).
        fallback: the chain walked, ``[group, ..., source]`` (length 1 when no fallback).
        fit: this group's own :class:`TemperatureFit`, or None when it had under ``min_rows`` rows.
    """

    group: str
    n_rows: int
    temperature: float
    source: str
    fallback: list[str]
    fit: TemperatureFit | None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("group", "n_rows", "temperature", "source", "fallback")}
        d["fit"] = self.fit.to_dict() if self.fit is not None else None
        return d


def _parent_fn(parent):
    if parent is None:
        return default_parent
    if callable(parent):
        return parent
    return lambda key: parent.get(key, GLOBAL if key != GLOBAL else None)


def _chain(key: str, parent_of) -> list[str]:
    chain = [key]
    while chain[-1] != GLOBAL:
        nxt = parent_of(chain[-1])
        nxt = GLOBAL if nxt is None else nxt
        if nxt in chain or len(chain) > 64:
            raise ValueError(f"the parent chain of group {key!r} loops: {chain + [nxt]}")
        chain.append(nxt)
    return chain


def fit_grouped(
    items: Sequence[tuple[torch.Tensor, int]],
    group_keys: Sequence[str],
    *,
    min_rows: int = 50,
    parent=None,
    **fit_kwargs,
) -> dict[str, GroupFit]:
    """Fit one temperature per group; a group with fewer than ``min_rows`` rows uses its parent's.

    Every item belongs to its leaf group and to each ancestor of it (``parent`` chain, ending at
    ``"global"``, which holds every row). Each group with at least ``min_rows`` rows gets its own
    :func:`fit_temperature`; ``"global"`` is always fitted (with a warning on its fit when it has
    fewer than ``min_rows`` rows). A group without its own fit walks up its chain to the nearest
    fitted ancestor, and the walk is recorded in :attr:`GroupFit.fallback`.

    Args:
        items: ``N`` pairs ``(logits, label)``: a ``(K_i,)`` logit tensor and the gold index.
        group_keys: ``N`` leaf group keys, e.g. ``"choice+4"`` (type + option count).
        min_rows: rows a group needs for its own temperature.
        parent: how keys nest: None (:func:`default_parent`, splitting on ``"+"``), a
            ``key -> parent`` mapping (missing keys go to ``"global"``) or a callable.
        **fit_kwargs: passed to :func:`fit_temperature` (``init``, ``bounds``, ...).

    Returns:
        ``{group: GroupFit}`` for every leaf and ancestor group, ``"global"`` included.

    Raises:
        NonFiniteFitError: a group's fit met a non-finite loss or gradient (the message names the
            group and its row count).
        ValueError: no items, ``len(items) != len(group_keys)``, ``min_rows < 1``, a looping parent
            chain, a non-finite logit (naming its group and row), or anything
            :func:`fit_temperature` rejects.
    """
    if len(items) == 0:
        raise ValueError("items must hold at least one (logits, label) pair")
    if len(items) != len(group_keys):
        raise ValueError(f"group_keys must have one key per item: {len(group_keys)} keys for {len(items)} items")
    if min_rows < 1:
        raise ValueError(f"min_rows must be at least 1, got {min_rows}")
    for i, ((z, _), key) in enumerate(zip(items, group_keys)):
        if not bool(torch.isfinite(torch.as_tensor(z, dtype=torch.float64)).all()):
            raise ValueError(f"group {key!r}: row {i} has non-finite logits {torch.as_tensor(z).tolist()}")
    parent_of = _parent_fn(parent)
    chains = {key: _chain(key, parent_of) for key in dict.fromkeys(group_keys)}
    members: dict[str, list[int]] = {}
    for i, key in enumerate(group_keys):
        for g in chains[key]:
            members.setdefault(g, []).append(i)

    own: dict[str, TemperatureFit] = {}
    for g, rows in members.items():
        if len(rows) >= min_rows or g == GLOBAL:
            try:
                fit = fit_temperature([items[i][0] for i in rows], [int(items[i][1]) for i in rows], **fit_kwargs)
            except NonFiniteFitError as exc:
                raise NonFiniteFitError(f"group {g!r} ({len(rows)} rows): {exc}") from None
            if len(rows) < min_rows:
                fit.warnings.append(f"global group has only {len(rows)} rows (< min_rows={min_rows})")
            own[g] = fit

    out: dict[str, GroupFit] = {}
    for g, rows in members.items():
        walk = _chain(g, parent_of)
        used = next(i for i, h in enumerate(walk) if h in own)
        src = walk[used]
        out[g] = GroupFit(group=g, n_rows=len(rows), temperature=own[src].temperature, source=src,
                          fallback=walk[: used + 1], fit=own.get(g))
    return out


def temperature_for(fits: dict[str, GroupFit], key: str, parent=None) -> float:
    """The temperature for ``key`` at inference time, walking up the chain for unseen keys.

    Raises:
        KeyError: neither ``key`` nor any ancestor (not even ``"global"``) is in ``fits``.
    """
    for g in _chain(key, _parent_fn(parent)):
        if g in fits:
            return fits[g].temperature
    raise KeyError(f"no temperature for {key!r} or any of its parents")
