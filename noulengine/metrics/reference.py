"""A benchmark family's own scoring rules, reported beside the generic metrics.

Some published benchmarks score with rules that differ from the generic scorer's in small but
visible ways: the order of candidates that breaks ties (zh-decision-bench lists a yes/no question
as ``true, false``, so an exact 50/50 answer counts as "true"; the generic scorer's noul order is
``no, yes``), the ECE bins (15 equal-width bins closed on the right, or equal-mass bins), the NLL
floor (``1e-15`` instead of ``1e-12``), ordinal errors in the source's own numeric values, and
posterior-only questions that have no hard label at all. A suite that follows such a protocol
puts it on every record's metadata (``record.metadata["protocol"]``, a JSON object, never seen by
the model)::

    {"family": "zh-decision-bench",
     "ece_bins": "equal-width" | "equal-mass", "n_bins": 15, "nll_floor": 1e-12,
     "test_time_refit": false,                  # optional: said in the report
     "diagnostic_only": "why the generic accuracy is no headline score",   # optional
     "fields": {field: {"order": [engine indices in the source's candidate order],
                        "values": [the source's numeric value of each engine candidate],
                        "unsupported": "why this question cannot be answered"}},
     "unscored": [fields asked but scored by no metric]}

and :class:`~noulengine.metrics.scorer.Scorer` adds a ``"reference"`` block, per suite and per
slice, computed here (pure Python, float64):

* ``accuracy`` / ``accuracy_scored``: the source's argmax: the first maximum in the source's
  candidate order (``order``), errors counted wrong / over scored decisions;
* ``nll`` with the protocol's floor, and ``nll_floored``; ``brier`` (multiclass sum of squares);
* ``ece``: top-label confidence (max p) against the source argmax's correctness, with
  ``equal-width`` bins ``(i/n, (i+1)/n]`` (edges ``i * (1/n)``, the last one 1.0, as
  ``numpy.linspace`` makes them; a confidence of exactly 0 falls in no bin) or ``equal-mass``
  bins (decisions sorted by confidence, stable, cut into ``n`` runs of sizes differing by at most
  one, the larger runs first, as ``numpy.array_split``);
* ``ordinal_mae_values``: ``|sum_k p_k v_k - v_gold|`` in the source's values (score questions
  that carry ``values``);
* ``posterior``: for decisions with a gold distribution and no hard label, ``mae`` =
  ``mean_k |p_k - q_k|`` (for a yes/no question, ``|P(yes) - q(yes)|``) and ``cross_entropy`` =
  ``-sum_k q_k log max(p_k, floor)``; they enter no accuracy and no ECE;
* ``unsupported``: decisions whose question the engine cannot answer (a video), counted as
  errors ``unsupported_modality`` in coverage, never dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

ECE_BINS = ("equal-width", "equal-mass")


@dataclass(frozen=True)
class Protocol:
    """The suite-level rules (the same on every record of a suite)."""

    family: str
    ece_bins: str = "equal-width"
    n_bins: int = 15
    nll_floor: float = 1e-12
    test_time_refit: bool | None = None
    diagnostic_only: str | None = None


@dataclass(frozen=True)
class FieldRule:
    """One question's rules.

    Attributes:
        order: the engine's candidate indices listed in the source's candidate order (None: the
            same order); the reference argmax takes the first maximum in this order.
        values: the source's numeric value of each engine candidate (score questions), for
            ordinal errors in the source's units.
        unsupported: why the engine cannot answer this question (None: it can).
    """

    order: tuple[int, ...] | None = None
    values: tuple[float, ...] | None = None
    unsupported: str | None = None


def parse_protocol(raw: Any) -> Protocol | None:
    """The :class:`Protocol` of a record's ``metadata["protocol"]`` (None when absent).

    Raises:
        ValueError: a malformed protocol object (a suite adapter's bug, not a data error).
    """
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("family"), str):
        raise ValueError(f"metadata['protocol'] must be an object with a 'family' string, got {raw!r}")
    bins = raw.get("ece_bins", "equal-width")
    if bins not in ECE_BINS:
        raise ValueError(f"protocol ece_bins must be one of {list(ECE_BINS)}, got {bins!r}")
    n_bins = int(raw.get("n_bins", 15))
    floor = float(raw.get("nll_floor", 1e-12))
    if n_bins < 1 or not 0.0 < floor < 1.0:
        raise ValueError(f"protocol n_bins must be >= 1 and nll_floor in (0, 1), got {n_bins}, {floor}")
    return Protocol(family=raw["family"], ece_bins=bins, n_bins=n_bins, nll_floor=floor,
                    test_time_refit=raw.get("test_time_refit"), diagnostic_only=raw.get("diagnostic_only"))


def parse_field_rule(raw: Any, num_candidates: int) -> FieldRule:
    """The :class:`FieldRule` of ``protocol["fields"][field]`` (an empty rule when absent).

    Raises:
        ValueError: ``order`` is not a permutation of the candidates, or ``values`` has the wrong length.
    """
    if not raw:
        return FieldRule()
    order = raw.get("order")
    if order is not None:
        order = tuple(int(i) for i in order)
        if sorted(order) != list(range(num_candidates)):
            raise ValueError(f"protocol order {list(order)} is not a permutation of 0..{num_candidates - 1}")
    values = raw.get("values")
    if values is not None:
        values = tuple(float(v) for v in values)
        if len(values) != num_candidates:
            raise ValueError(f"protocol values {list(values)} must give one value per candidate ({num_candidates})")
    return FieldRule(order=order, values=values, unsupported=raw.get("unsupported"))


# ---------------------------------------------------------------------------------------------
# The rules, one function each (tests call them directly with hand-computed values).


def source_argmax(probs: Sequence[float], order: Sequence[int] | None = None) -> int:
    """The engine index the source predicts: the first maximum when candidates are visited in
    the source's order (``order``: engine indices in source order; None: engine order)."""
    visit = range(len(probs)) if order is None else order
    best = None
    for k in visit:
        if best is None or probs[k] > probs[best]:
            best = k
    return best


def nll(p_gold: float, floor: float) -> float:
    """``-log(max(p_gold, floor))`` in nats."""
    return -math.log(max(p_gold, floor))


def brier(probs: Sequence[float], gold: int) -> float:
    """``sum_k (p_k - 1[k = gold])^2``."""
    return sum((p - (1.0 if k == gold else 0.0)) ** 2 for k, p in enumerate(probs))


def equal_width_edges(n_bins: int) -> list[float]:
    """``0, 1/n, ..., 1`` as ``numpy.linspace(0, 1, n + 1)`` makes them (``i * (1/n)``, last 1.0)."""
    step = 1.0 / n_bins
    return [i * step for i in range(n_bins)] + [1.0]


def ece_equal_width(conf: Sequence[float], correct: Sequence[float], n_bins: int = 15) -> float:
    """Top-label ECE with equal-width bins closed on the right, ``(lo, hi]``."""
    n = len(conf)
    if n == 0:
        raise ValueError("ECE needs at least one decision")
    edges = equal_width_edges(n_bins)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        idx = [i for i, c in enumerate(conf) if lo < c <= hi]
        if idx:
            total += len(idx) / n * abs(sum(conf[i] for i in idx) / len(idx) - sum(correct[i] for i in idx) / len(idx))
    return total


def ece_equal_mass(conf: Sequence[float], correct: Sequence[float], n_bins: int = 15) -> float:
    """Top-label ECE with equal-mass bins: decisions sorted by confidence (stable), cut into
    ``min(n_bins, N)`` consecutive runs whose sizes differ by at most one (larger runs first)."""
    n = len(conf)
    if n == 0:
        raise ValueError("ECE needs at least one decision")
    order = sorted(range(n), key=lambda i: conf[i])
    bins = min(n_bins, n)
    size, extra = divmod(n, bins)
    total, start = 0.0, 0
    for b in range(bins):
        idx = order[start:start + size + (1 if b < extra else 0)]
        start += len(idx)
        total += len(idx) / n * abs(sum(conf[i] for i in idx) / len(idx) - sum(correct[i] for i in idx) / len(idx))
    return total


def expected_value(probs: Sequence[float], values: Sequence[float]) -> float:
    """``sum_k p_k v_k``."""
    return sum(p * v for p, v in zip(probs, values))


def posterior_mae(probs: Sequence[float], gold: Sequence[float]) -> float:
    """``mean_k |p_k - q_k|`` (a yes/no question: ``|P(yes) - q(yes)|``)."""
    return sum(abs(p - q) for p, q in zip(probs, gold)) / len(probs)


def cross_entropy(probs: Sequence[float], gold: Sequence[float], floor: float) -> float:
    """``-sum_k q_k log max(p_k, floor)`` in nats (terms with ``q_k = 0`` are 0)."""
    return -sum(q * math.log(max(p, floor)) for p, q in zip(probs, gold) if q > 0)


# ---------------------------------------------------------------------------------------------
# The block, over the scorer's decisions (objects with probs, gold, gold_distribution, error,
# scored, type, protocol and rule attributes: noulengine.metrics.scorer.Decision).


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def describe_rules(p: Protocol) -> dict:
    """The protocol's rules in words (repeated in the block so a reader needs no code)."""
    bins = (f"{p.n_bins} equal-width bins closed on the right, (i/{p.n_bins}, (i+1)/{p.n_bins}]"
            if p.ece_bins == "equal-width" else f"{p.n_bins} equal-mass bins (sorted by confidence)")
    out = {"ece_bins": bins, "nll_floor": p.nll_floor,
           "argmax": "first maximum in the source's candidate order"}
    if p.test_time_refit is not None:
        out["test_time_refit"] = p.test_time_refit
    return out


def reference_block(decisions: Sequence[Any]) -> dict | None:
    """The ``"reference"`` report block for the decisions that carry a protocol (None if none).

    Raises:
        ValueError: the decisions mix protocols of different families or settings.
    """
    ruled = [d for d in decisions if getattr(d, "protocol", None) is not None]
    if not ruled:
        return None
    protos = {d.protocol for d in ruled}
    if len(protos) > 1:
        raise ValueError(f"decisions carry {len(protos)} different protocols; score one suite at a time")
    proto = ruled[0].protocol
    hard = [d for d in ruled if d.gold is not None]
    hard_scored = [d for d in hard if d.scored]
    out: dict[str, Any] = {"family": proto.family, "rules": describe_rules(proto), "hard_labelled": len(hard),
                           "scored": len(hard_scored)}
    preds = {id(d): source_argmax(d.probs, d.rule.order if d.rule else None) for d in hard_scored}
    correct = [1.0 if preds[id(d)] == d.gold else 0.0 for d in hard_scored]
    out["accuracy"] = sum(correct) / len(hard) if hard else None
    out["accuracy_scored"] = _mean(correct)
    out["nll"] = _mean([nll(d.probs[d.gold], proto.nll_floor) for d in hard_scored])
    out["nll_floored"] = sum(1 for d in hard_scored if d.probs[d.gold] <= proto.nll_floor)
    out["brier"] = _mean([brier(d.probs, d.gold) for d in hard_scored])
    out["ece"] = None
    if hard_scored:
        conf = [max(d.probs) for d in hard_scored]
        fn = ece_equal_width if proto.ece_bins == "equal-width" else ece_equal_mass
        out["ece"] = fn(conf, correct, proto.n_bins)
    valued = [d for d in hard_scored if d.type == "score" and d.rule is not None and d.rule.values is not None]
    out["ordinal_values"] = {"n": len(valued), "mae": _mean(
        [abs(expected_value(d.probs, d.rule.values) - d.rule.values[d.gold]) for d in valued])}
    post = [d for d in ruled if d.gold is None and d.gold_distribution is not None]
    post_scored = [d for d in post if d.scored]
    out["posterior"] = {"n": len(post), "scored": len(post_scored),
                        "mae": _mean([posterior_mae(d.probs, d.gold_distribution) for d in post_scored]),
                        "cross_entropy": _mean([cross_entropy(d.probs, d.gold_distribution, proto.nll_floor)
                                                for d in post_scored])}
    out["unsupported"] = sum(1 for d in ruled if d.rule is not None and d.rule.unsupported)
    if proto.diagnostic_only:
        out["diagnostic_only"] = proto.diagnostic_only
    return out


def reference_lines(metrics: dict) -> list[str]:
    """Markdown lines for a suite's ``reference`` block (empty without one), for report.md."""
    ref = (metrics or {}).get("reference")
    if not ref:
        return []

    def f(x, pct=False):
        return "n/a" if x is None else (f"{100 * x:.1f}%" if pct else f"{x:.4f}")

    rules = ref.get("rules", {})
    lines = ["", f"Protocol `{ref.get('family')}` (the source's own rules: argmax = {rules.get('argmax')}; ECE "
             f"{rules.get('ece_bins')}; NLL floor {rules.get('nll_floor'):g}"
             + ("; no test-time temperature refit" if rules.get("test_time_refit") is False else "") + "):", "",
             "| metric | generic | reference |", "|---|---:|---:|",
             f"| accuracy | {f(metrics.get('accuracy'), True)} | {f(ref.get('accuracy'), True)} |",
             f"| NLL | {f(metrics.get('nll'))} | {f(ref.get('nll'))} |",
             f"| Brier | {f(metrics.get('brier'))} | {f(ref.get('brier'))} |",
             f"| ECE | {f(metrics.get('ece'))} | {f(ref.get('ece'))} |"]
    ov = ref.get("ordinal_values") or {}
    if ov.get("n"):
        lines.append(f"| ordinal MAE (source values) | {f((metrics.get('ordinal') or {}).get('mae'))} | {f(ov['mae'])} |")
    post = ref.get("posterior") or {}
    if post.get("n"):
        lines.append(f"| posterior MAE ({post['scored']} of {post['n']} posterior-only) | n/a | {f(post['mae'])} |")
        lines.append(f"| posterior cross-entropy | n/a | {f(post['cross_entropy'])} |")
    uns = ref.get("unscored") or {}
    if uns.get("questions"):
        lines.append(f"\n{uns['questions']} question(s) on {uns['rows']} row(s) have no expected answer: asked, "
                     "marked unscored, counted in no metric.")
    if ref.get("unsupported"):
        lines.append(f"\n{ref['unsupported']} decision(s) are unsupported by this engine (counted as errors in "
                     "coverage).")
    if ref.get("diagnostic_only"):
        lines.append(f"\nNote: {ref['diagnostic_only']}")
    return lines
