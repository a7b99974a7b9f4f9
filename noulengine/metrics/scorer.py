"""Score engine answers against record targets: counts, proper scores, calibration, slices.

Usage (torchmetrics style: arguments checked, then ``update`` per record, ``compute`` at the end)::

    scorer = Scorer()
    for record, answer_map in pairs:
        scorer.update(record, answer_map)
    report = scorer.compute()          # JSON-able dict

or ``score(pairs)``. ``answer_map`` is the engine output for one record::

    {"answers": {field: {"type", "labels", "probabilities": {label: p}, "confidence", "label"}},
     "error": None | str}

A *decision* is one target field of one record that has gold (a label, a distribution or both).
A decision is *scored* when its answer passes :func:`~noulengine.metrics.validation.validate_answer`;
otherwise it is an *error* (``missing_prediction`` when the answer map has ``"missing": True``,
``unreadable_line`` when it has a true ``"unreadable"`` (external scoring: the row's prediction
line is not valid JSON), ``record_error``, ``missing_answer`` for a missing field,
``invalid_answer``): it is never correct and it lowers coverage.

Report keys (every metric in float64, ``None`` where no decision qualifies, never 0):

* ``counts``: ``decisions``, ``hard_labelled``, ``soft_labelled``, ``scored``, ``errors``,
  ``coverage`` (scored / decisions) and ``error_kinds``.
* ``accuracy``: correct / hard-labelled decisions, errors counted wrong (decision level, so a
  row with three fields counts three times). ``accuracy_scored``: the same over scored decisions.
* ``rows_all_correct``: share of rows whose hard-labelled fields are all correct.
* ``nll``, ``brier``, ``ece``: hard-label scores over scored hard-labelled decisions; confidence
  for ECE is the maximum normalised probability (the answer's own ``confidence`` is not used).
* ``nll_floored``: how many of those decisions put a gold probability at or below the NLL floor
  (``1e-12``): each adds ``-log(1e-12) = 27.6`` nats to ``nll`` whatever its true probability, so
  a few of them can dominate it; ``warnings`` says so when there are any.
* ``ordinal``: ``{"n", "mae", "rps"}`` over scored hard-labelled ``score`` decisions.
* ``noul``: ``{"n", "yes_auc", "p_yes_median_yes", "p_yes_median_no"}`` over scored
  hard-labelled ``noul`` decisions: how far P(yes) separates gold-yes from gold-no answers (ROC
  AUC, :func:`~noulengine.metrics.functional.binary_auc`; 0.5 = P(yes) carries no information
  whatever the accuracy) and the median P(yes) of each side; ``None`` where a side is empty.
* ``answer_concentration``: per field, the label the model answers most often and its share beside
  the gold's most common label and its share; ``constant`` marks a field answered with one label
  on at least 95% of its (20 or more) decisions where the gold's most common label covers under
  80% (:func:`answer_concentration`); each such field adds a sentence to ``warnings``.
* ``distribution``: ``{"n", "kl", "brier_vs_distribution", "tvd", "status"}`` over scored
  decisions with a gold distribution; ``status`` is ``"unavailable"`` (values ``None``) when none.
* ``slots``: predicted vs gold share per candidate slot (see :mod:`noulengine.metrics.slots`).
* ``baselines``: accuracies a model must beat, over the same hard-labelled decisions:
  ``chance`` (mean ``1/K``, a uniform guess), ``majority`` (always answering each field's most
  frequent gold option, by field and option count: the majority-class rate of a fixed-option
  question) and ``majority_slot`` (always answering the most frequent gold position). Both
  majorities are read off the gold labels being scored, so they are upper bounds on any constant
  answer. ``warnings`` holds a plain sentence when ``accuracy`` is at or below one of them.
* ``slices``: ``{dimension: {value: <the same report without slices>}}`` for the dimensions
  ``suite`` (``record.metadata["suite"]``), ``type``, ``field`` and ``category``, then one per
  ``metadata_slices`` key (``record.metadata[key]`` as a string, e.g. a suite manifest's
  ``"slices": ["level"]``); a dimension is left out when no decision has a value for it, and a
  missing value is keyed ``"<none>"``.
* ``reference``: only for records carrying a benchmark family's own rules
  (``record.metadata["protocol"]``): the source's accuracy (its tie order), NLL floor, ECE bins,
  ordinal errors in its own values, posterior-only losses, unscored and unsupported questions
  (:mod:`noulengine.metrics.reference`); in every slice too.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from noulengine.metrics import functional as F
from noulengine.metrics.calibration import N_BINS, expected_calibration_error
from noulengine.metrics.reference import FieldRule, Protocol, parse_field_rule, parse_protocol, reference_block
from noulengine.metrics.slots import slot_shares
from noulengine.metrics.validation import answer_probabilities, validate_answer
from noulengine.records.schema import Question, Record

SLICE_DIMENSIONS = ("suite", "type", "field", "category")
NONE_KEY = "<none>"


@dataclass(frozen=True)
class Decision:
    """One scored (or errored) target field; an internal row of the scorer, exposed for tests."""

    row: int
    field: str
    type: str
    category: str | None
    suite: str | None
    num_candidates: int
    gold: int | None
    gold_distribution: tuple[float, ...] | None
    probs: tuple[float, ...] | None
    error: str | None
    metadata: tuple[tuple[str, str | None], ...] = ()  # the record's metadata_slices values
    protocol: Protocol | None = None  # the suite's own scoring rules (record.metadata["protocol"])
    rule: FieldRule | None = None  # this question's rules under that protocol
    labels: tuple[str, ...] = ()  # the question's candidate labels, in order (constant-answer report)

    @property
    def scored(self) -> bool:
        return self.probs is not None

    @property
    def predicted(self) -> int | None:
        if self.probs is None:
            return None
        return max(range(len(self.probs)), key=lambda k: (self.probs[k], -k))

    @property
    def correct(self) -> bool:
        return self.gold is not None and self.predicted == self.gold

    def slice_value(self, dimension: str) -> str | None:
        if dimension in SLICE_DIMENSIONS:
            return getattr(self, dimension)
        return dict(self.metadata).get(dimension)


def _check_update_args(record: Any, answer_map: Any) -> None:
    if not isinstance(record, Record):
        raise TypeError(f"record must be a noulengine.records.schema.Record, got {type(record).__name__}")
    if not isinstance(answer_map, dict):
        raise TypeError(f"answer_map must be a dict with 'answers' and 'error', got {type(answer_map).__name__}")
    answers = answer_map.get("answers")
    if answers is not None and not isinstance(answers, dict):
        raise TypeError(f"answer_map['answers'] must be a field -> answer dict, got {type(answers).__name__}")
    questions = {q.field for q in record.request.questions}
    unknown = [f for f in record.targets if f not in questions]
    if unknown:
        raise ValueError(f"record {record.id!r}: targets for unknown questions {unknown}")


def _gold(question: Question, target) -> tuple[int | None, tuple[float, ...] | None]:
    labels = list(question.labels)
    gold = labels.index(target.label) if target.label is not None else None
    dist = None
    if target.probabilities is not None:
        dist = tuple(float(target.probabilities.get(lab, 0.0)) for lab in labels)
    return gold, dist


class Scorer:
    """Accumulates decisions with :meth:`update`; :meth:`compute` returns the report dict.

    Args:
        n_bins: ECE bins (15 by default).
        slice_by: slice dimensions to report, a subset of :data:`SLICE_DIMENSIONS`.
        metadata_slices: record metadata keys to slice by as well (values as strings), e.g.
            ``("level",)``; none may be named like a built-in dimension.
    """

    def __init__(self, *, n_bins: int = N_BINS, slice_by: Sequence[str] = SLICE_DIMENSIONS,
                 metadata_slices: Sequence[str] = ()):
        bad = [d for d in slice_by if d not in SLICE_DIMENSIONS]
        if bad:
            raise ValueError(f"slice_by must name dimensions from {list(SLICE_DIMENSIONS)}, got {bad}")
        clash = [k for k in metadata_slices if k in SLICE_DIMENSIONS or not isinstance(k, str)]
        if clash:
            raise ValueError(f"metadata_slices must be metadata keys other than {list(SLICE_DIMENSIONS)}, got {clash}")
        self.n_bins = n_bins
        self.slice_by = tuple(slice_by)
        self.metadata_slices = tuple(dict.fromkeys(metadata_slices))
        self.reset()

    def reset(self) -> None:
        self.decisions: list[Decision] = []
        self.unscored: list[tuple[int, str]] = []  # (row, field): asked, with no gold, scored by no metric
        self._family: str | None = None
        self._rows = 0

    def update(self, record: Record, answer_map: dict) -> None:
        """Add one record's decisions.

        Raises:
            TypeError: ``record`` is not a Record or ``answer_map`` is not shaped as documented.
            ValueError: the record has targets for questions it does not ask.
        """
        _check_update_args(record, answer_map)
        row = self._rows
        self._rows += 1
        questions = {q.field: q for q in record.request.questions}
        answers = answer_map.get("answers") or {}
        record_error = answer_map.get("error")
        meta = record.metadata if isinstance(record.metadata, dict) else {}
        suite = meta.get("suite")
        sliced = tuple((k, None if meta.get(k) is None else str(meta[k])) for k in self.metadata_slices)
        raw_protocol = meta.get("protocol")
        protocol = parse_protocol(raw_protocol)
        if protocol is not None:
            self._family = protocol.family
            self.unscored += [(row, f) for f in raw_protocol.get("unscored", ()) if f in questions]
        for fld, target in record.targets.items():
            q = questions[fld]
            gold, dist = _gold(q, target)
            if gold is None and dist is None:
                continue
            rule = None
            if protocol is not None:
                rule = parse_field_rule((raw_protocol.get("fields") or {}).get(fld), q.num_candidates)
            probs, error = None, None
            if rule is not None and rule.unsupported:  # never answerable here: an error, visible in coverage
                error = "unsupported_modality"
            elif answer_map.get("missing"):  # no prediction row at all (external scoring)
                error = "missing_prediction"
            elif answer_map.get("unreadable"):  # a prediction line that names this row but cannot be read
                error = "unreadable_line"
            elif record_error is not None:
                error = "record_error"
            elif fld not in answers:
                error = "missing_answer"
            elif validate_answer(answers[fld], q.labels):
                error = "invalid_answer"
            else:
                probs = tuple(answer_probabilities(answers[fld], q.labels))
            self.decisions.append(Decision(
                row=row, field=fld, type=q.type, category=record.category,
                suite=str(suite) if suite is not None else None, num_candidates=q.num_candidates,
                gold=gold, gold_distribution=dist, probs=probs, error=error, metadata=sliced,
                protocol=protocol, rule=rule, labels=tuple(q.labels),
            ))

    def reliability_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(confidences, correct)`` float64 tensors of the scored hard-labelled decisions,
        ready for :func:`noulengine.metrics.reliability.plot_reliability`."""
        rows = [d for d in self.decisions if d.scored and d.gold is not None]
        conf = torch.tensor([max(d.probs) for d in rows], dtype=torch.float64)
        ok = torch.tensor([float(d.correct) for d in rows], dtype=torch.float64)
        return conf, ok

    def compute(self) -> dict:
        """The JSON-able report described in the module docstring."""
        report = summarize(self.decisions, n_bins=self.n_bins)
        slices = {}
        for dim in self.slice_by + self.metadata_slices:
            values = [d.slice_value(dim) for d in self.decisions]
            if all(v is None for v in values):
                continue
            groups: dict[str, list[Decision]] = {}
            for d, v in zip(self.decisions, values):
                groups.setdefault(NONE_KEY if v is None else v, []).append(d)
            slices[dim] = {k: summarize(g, n_bins=self.n_bins) for k, g in sorted(groups.items())}
        report["slices"] = slices
        if self.unscored:
            report.setdefault("reference", {"family": self._family})["unscored"] = {
                "questions": len(self.unscored), "rows": len({r for r, _ in self.unscored})}
        return report


def score(pairs: Iterable[tuple[Record, dict]], **kwargs) -> dict:
    """Score ``(record, answer_map)`` pairs in one call; ``kwargs`` go to :class:`Scorer`."""
    scorer = Scorer(**kwargs)
    for record, answer_map in pairs:
        scorer.update(record, answer_map)
    return scorer.compute()


# ---------------------------------------------------------------------------------------------
# Summaries of a list of decisions.


def _padded(rows: list[tuple[float, ...]]) -> torch.Tensor:
    k = max(len(r) for r in rows)
    out = torch.zeros(len(rows), k, dtype=torch.float64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
    return out


def _f(t: torch.Tensor) -> float:
    return float(t.item())


def summarize(decisions: Sequence[Decision], *, n_bins: int = N_BINS) -> dict:
    """The report (without slices) for one set of decisions."""
    n = len(decisions)
    hard = [d for d in decisions if d.gold is not None]
    soft = [d for d in decisions if d.gold_distribution is not None]
    scored = [d for d in decisions if d.scored]
    kinds: dict[str, int] = {}
    for d in decisions:
        if d.error is not None:
            kinds[d.error] = kinds.get(d.error, 0) + 1
    out: dict[str, Any] = {
        "counts": {
            "decisions": n,
            "hard_labelled": len(hard),
            "soft_labelled": len(soft),
            "scored": len(scored),
            "errors": n - len(scored),
            "coverage": len(scored) / n if n else None,
            "error_kinds": dict(sorted(kinds.items())),
        },
    }
    n_correct = sum(d.correct for d in hard)
    hard_scored = [d for d in hard if d.scored]
    out["accuracy"] = n_correct / len(hard) if hard else None
    out["accuracy_scored"] = n_correct / len(hard_scored) if hard_scored else None

    rows: dict[int, bool] = {}
    for d in hard:
        rows[d.row] = rows.get(d.row, True) and d.correct
    out["rows_all_correct"] = sum(rows.values()) / len(rows) if rows else None
    out["rows"] = len(rows)

    out.update({"nll": None, "nll_floored": 0, "brier": None, "ece": None, "slots": []})
    if hard_scored:
        p = _padded([d.probs for d in hard_scored])
        y = torch.tensor([d.gold for d in hard_scored], dtype=torch.int64)
        correct = (p.argmax(dim=1) == y).to(torch.float64)
        out["nll"] = _f(F.nll(p, y))
        out["nll_floored"] = int((p.gather(1, y[:, None]).squeeze(1) <= F.PROB_FLOOR).sum())
        out["brier"] = _f(F.brier(p, y))
        out["ece"] = _f(expected_calibration_error(p.max(dim=1).values, correct, n_bins))
        out["slots"] = slot_shares(p.argmax(dim=1), y, num_slots=p.shape[1])

    out["baselines"] = baselines(hard)
    out["warnings"] = baseline_warnings(out["accuracy"], out["baselines"])
    if out["nll_floored"]:
        out["warnings"].append(f"{out['nll_floored']} of {len(hard_scored)} scored decisions gave the gold label a "
                               f"probability at or below the NLL floor {F.PROB_FLOOR:g}; each adds "
                               f"{-math.log(F.PROB_FLOOR):.1f} nats to NLL")

    ordinal = [d for d in hard_scored if d.type == "score"]
    out["ordinal"] = {"n": len(ordinal), "mae": None, "rps": None}
    if ordinal:
        p = _padded([d.probs for d in ordinal])
        y = torch.tensor([d.gold for d in ordinal], dtype=torch.int64)
        lv = torch.tensor([d.num_candidates for d in ordinal], dtype=torch.int64)
        out["ordinal"].update(mae=_f(F.ordinal_mae(p, y)), rps=_f(F.rps(p, y, lv)))

    out["noul"] = noul_separation([d for d in hard_scored if d.type == "noul"])
    out["answer_concentration"] = answer_concentration(hard_scored)
    out["warnings"] += constant_answer_warnings(out["answer_concentration"])

    soft_scored = [d for d in soft if d.scored]
    dist = {"n": len(soft_scored), "kl": None, "brier_vs_distribution": None, "tvd": None,
            "status": "unavailable"}
    if soft_scored:
        p = _padded([d.probs for d in soft_scored])
        q = _padded([d.gold_distribution for d in soft_scored])
        dist.update(kl=_f(F.kl_divergence(q, p)), brier_vs_distribution=_f(F.brier_distribution(p, q)),
                    tvd=_f(F.total_variation(p, q)), status="ok")
    out["distribution"] = dist
    reference = reference_block(decisions)
    if reference is not None:
        out["reference"] = reference
    return out


def noul_separation(nouls: Sequence[Decision]) -> dict:
    """The ``noul`` block of the report (see module doc) for scored hard-labelled yes/no decisions
    (candidates ``("no", "yes")``: P(yes) is ``probs[1]``)."""
    p_yes = {True: [d.probs[1] for d in nouls if d.gold == 1], False: [d.probs[1] for d in nouls if d.gold == 0]}
    out = {"n": len(nouls), "yes_auc": None,
           "p_yes_median_yes": statistics.median(p_yes[True]) if p_yes[True] else None,
           "p_yes_median_no": statistics.median(p_yes[False]) if p_yes[False] else None}
    if p_yes[True] and p_yes[False]:
        out["yes_auc"] = _f(F.binary_auc(torch.tensor([d.probs[1] for d in nouls], dtype=torch.float64),
                                         torch.tensor([d.gold == 1 for d in nouls])))
    return out


# A field answered with one label on at least this share of its decisions, where the gold's most
# common label covers under GOLD_SHARE_MAX, is a *constant answer*: the model ignores the evidence
# for that field (issue #45 found v5 answering needs_human "no" on all 100 sampled rows by hand).
CONSTANT_SHARE_MIN = 0.95
GOLD_SHARE_MAX = 0.80
CONSTANT_MIN_DECISIONS = 20  # fewer decisions than this: the shares are reported, never flagged


def answer_concentration(decisions: Sequence[Decision]) -> list[dict]:
    """Per field, how concentrated the model's answers are beside the gold's.

    Args:
        decisions: scored hard-labelled decisions (``probs`` and ``gold`` set).

    Returns:
        One dict per field name, in order of first appearance: ``field``, ``n`` (decisions),
        ``answer_label`` and ``answer_share`` (the label the model picked most often, by label text,
        and the share of decisions picking it), ``gold_label`` and ``gold_share`` (the same for the
        gold labels), ``constant`` (True when ``answer_share >= CONSTANT_SHARE_MIN``, ``gold_share <
        GOLD_SHARE_MAX`` and ``n >= CONSTANT_MIN_DECISIONS``). Labels are compared as text, so a
        field whose options differ from record to record (tool names) is concentrated only when the
        same label text wins; ties go to the label seen first.
    """
    groups: dict[str, list[Decision]] = {}
    for d in decisions:
        if d.scored and d.gold is not None:
            groups.setdefault(d.field, []).append(d)
    out = []
    for fld, ds in groups.items():
        def top(names: list[str]) -> tuple[str, float]:
            counts: dict[str, int] = {}
            for name in names:
                counts[name] = counts.get(name, 0) + 1
            label = max(counts, key=counts.get)  # dicts keep insertion order: ties go to the first seen
            return label, counts[label] / len(names)

        def text(d: Decision, k: int) -> str:
            return d.labels[k] if d.labels else str(k)

        answer, a_share = top([text(d, d.predicted) for d in ds])
        gold, g_share = top([text(d, d.gold) for d in ds])
        out.append({"field": fld, "n": len(ds), "answer_label": answer, "answer_share": a_share,
                    "gold_label": gold, "gold_share": g_share,
                    "constant": len(ds) >= CONSTANT_MIN_DECISIONS and a_share >= CONSTANT_SHARE_MIN
                    and g_share < GOLD_SHARE_MAX})
    return out


def constant_answer_warnings(concentration: Sequence[dict]) -> list[str]:
    """One plain sentence per field :func:`answer_concentration` marks ``constant``."""
    return [f"field {c['field']!r} is answered {c['answer_label']!r} on {100 * c['answer_share']:.1f}% of its "
            f"{c['n']} decisions, where the gold's most common label ({c['gold_label']!r}) covers "
            f"{100 * c['gold_share']:.1f}%: a constant answer that ignores the evidence"
            for c in concentration if c["constant"]]


def baselines(hard: Sequence[Decision]) -> dict:
    """Chance, majority and majority-slot accuracy over hard-labelled decisions (see module doc)."""
    if not hard:
        return {"chance": None, "majority": None, "majority_slot": None}
    chance = sum(1.0 / d.num_candidates for d in hard) / len(hard)
    by_field: dict[tuple, dict[int, int]] = {}
    slots: dict[int, int] = {}
    for d in hard:
        counts = by_field.setdefault((d.field, d.num_candidates), {})
        counts[d.gold] = counts.get(d.gold, 0) + 1
        slots[d.gold] = slots.get(d.gold, 0) + 1
    majority = sum(max(c.values()) for c in by_field.values()) / len(hard)
    return {"chance": chance, "majority": majority, "majority_slot": max(slots.values()) / len(hard)}


def baseline_warnings(accuracy: float | None, base: dict) -> list[str]:
    """Plain sentences for an accuracy at or below chance or the majority answer."""
    if accuracy is None or base.get("chance") is None:
        return []
    out = []
    if accuracy <= base["chance"]:
        out.append(f"accuracy {100 * accuracy:.1f}% is at or below chance ({100 * base['chance']:.1f}%, a uniform "
                   "guess): these answers carry no information")
    if accuracy <= base["majority"]:
        out.append(f"accuracy {100 * accuracy:.1f}% is at or below always answering each question's most frequent "
                   f"gold option ({100 * base['majority']:.1f}%)")
    return out
