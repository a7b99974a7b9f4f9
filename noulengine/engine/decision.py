"""Engine outputs: one :class:`Answer` per question, one :class:`Decision` per request."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from noulengine.compile.layout import QuestionPlan
from noulengine.records.errors import NonFiniteLogitsError


@dataclass
class Answer:
    """Probabilities over one question's candidates.

    Attributes:
        type: ``choice`` | ``score`` | ``noul``.
        labels: candidate labels in criteria order.
        probabilities: label -> p in criteria order, summing to 1 (after temperature).
        confidence: max p.
        label: the argmax label.
        value: ``choice``: the original label; ``noul``: P(yes); ``score``: the expected level
            (sum_k k * p_k, may be non-integer).
        logprobs: the candidates' combined log-probabilities before temperature (the logits that
            temperature scaling divides; softmax(logprobs / T) == probabilities).
        x_mass: the candidates' raw probability mass under the model before renormalisation
            (sum of candidate probabilities in the unrotated view); near 0 flags a prompt whose
            candidates get almost no probability.
        readout: the readout mode used.
        temperature: the temperature applied (1.0 when uncalibrated).
        flip_rate: with permutation debiasing, the share of rotations whose argmax differs from
            the unrotated view's; None otherwise.
        level_texts: ``score`` only: level number -> the level's description as given in the
            question (``{"0": "can wait", ...}``; None where a level has none), so an answer reads
            "1 (this week)", not only "1". Empty for other types.
        source: ``"model"`` (the decision model's argmax) or ``"escalated"`` (``label`` is a
            generative LLM's answer, :mod:`noulengine.escalate`; ``probabilities``,
            ``confidence``, ``logprobs`` and a score's or noul's ``value`` stay the decision
            model's).
        escalation: for a question under the escalation threshold: what happened (``status``:
            ``escalated``, ``invalid_answer``, ``timeout``, ``unreachable``, ``http_error``,
            ``bad_response``, ``budget`` or ``deadline``; ``reason``, ``model_label``,
            ``model_confidence``, ``llm_label``, ``usage`` tokens, ``latency_s`` in seconds);
            None when escalation did not apply.
    """

    type: str
    labels: tuple[str, ...]
    probabilities: dict[str, float]
    confidence: float
    label: str
    value: float | str
    logprobs: list[float]
    x_mass: float
    readout: str
    temperature: float = 1.0
    flip_rate: float | None = None
    debias: str = "none"
    level_texts: dict[str, str | None] = field(default_factory=dict)
    source: str = "model"
    escalation: dict | None = None

    @property
    def level_text(self) -> str | None:
        """The argmax level's description (``score`` answers), else None."""
        return self.level_texts.get(self.label)

    @classmethod
    def from_dict(cls, d: dict) -> "Answer":
        """Rebuild an answer from :meth:`to_dict` output (a predictions file row's answer).

        Raises:
            KeyError, TypeError: not an answer dict.
        """
        return cls(type=d["type"], labels=tuple(d["labels"]), probabilities=dict(d["probabilities"]),
                   confidence=float(d["confidence"]), label=d["label"], value=d[d["type"]],
                   logprobs=list(d["logprobs"]), x_mass=float(d["x_mass"]), readout=d["readout"],
                   temperature=float(d.get("temperature", 1.0)), flip_rate=d.get("flip_rate"),
                   debias=d.get("debias", "none"), level_texts=dict(d.get("level_texts") or {}),
                   source=d.get("source", "model"), escalation=d.get("escalation"))

    def to_dict(self) -> dict:
        d = {"type": self.type, "labels": list(self.labels), "probabilities": self.probabilities,
             "confidence": self.confidence, "label": self.label, self.type: self.value,
             "logprobs": self.logprobs, "x_mass": self.x_mass, "readout": self.readout,
             "temperature": self.temperature, "debias": self.debias, "source": self.source}
        if self.escalation is not None:
            d["escalation"] = self.escalation
        if self.flip_rate is not None:
            d["flip_rate"] = self.flip_rate
        if self.type == "score":
            d["level_texts"] = dict(self.level_texts)
            d["level_text"] = self.level_text
        return d


@dataclass
class Decision:
    """The answers to one request, or the error that stopped it.

    Attributes:
        id: the request's id (None if it had none).
        answers: field -> :class:`Answer`, in question order (empty when ``error`` is set).
        input_tokens: packed tokens fed to the model for this request.
        latency_s: seconds of preprocessing + inference for this request (CUDA synchronised;
            model loading and warm-up excluded; a batched request counts its own compile time
            plus the wall time of the batch it rode in).
        error: ``{"error_type", "message", ...}`` for a failed request, else None.
        escalation: when escalation ran: ``{"escalated", "sent", "kept", "prompt_tokens",
            "completion_tokens", "wall_s"}`` (:func:`noulengine.escalate.runner.summarize`),
            else None.
    """

    id: str | None
    answers: dict[str, Answer] = field(default_factory=dict)
    input_tokens: int = 0
    latency_s: float = 0.0
    error: dict | None = None
    escalation: dict | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        usage = {"input_tokens": self.input_tokens}
        if self.escalation is not None:
            usage["escalation"] = self.escalation
        return {"id": self.id, "answers": {k: a.to_dict() for k, a in self.answers.items()},
                "usage": usage, "latency_s": self.latency_s, "error": self.error}


def make_answer(plan: QuestionPlan, view_logprobs: torch.Tensor, *, temperature: float = 1.0,
                prior_logprobs: torch.Tensor | None = None, debias: str = "none",
                descriptions: tuple | None = None) -> Answer:
    """Turn (V, K) float64 candidate log-probabilities into an :class:`Answer`.

    Views (rotations) are combined by averaging log-probabilities, which cancels an additive
    position bias; a contextual prior (K,) is subtracted (p / prior, Zhao et al. 2021); then
    ``softmax(logits / T)`` in float64. Temperature never changes the argmax (T > 0).
    ``descriptions`` (the question's, one per label) fill a score answer's ``level_texts``.

    Raises:
        NonFiniteLogitsError: any NaN or infinite candidate log-probability (or contextual prior):
            a NaN is never an answer, and ``argmax`` of NaNs would silently pick the first label.
        ValueError: a temperature that is not a finite positive number.
    """
    logp = view_logprobs.double()
    finite = torch.isfinite(logp)
    if not bool(finite.all()) or (prior_logprobs is not None and not bool(torch.isfinite(prior_logprobs).all())):
        bad = int((~finite).sum())
        raise NonFiniteLogitsError(f"question {plan.field!r}: the model produced non-finite candidate logits "
                                   f"({bad} of {logp.numel()} values NaN or infinite); no answer is given",
                                   field=plan.field)
    logits = logp.mean(dim=0)
    if prior_logprobs is not None:
        logits = logits - prior_logprobs.double()
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite positive number, got {temperature!r}")
    probs = torch.softmax(logits / temperature, dim=0)
    k = int(torch.argmax(probs))
    labels = plan.labels
    p_list = probs.tolist()
    if plan.type == "noul":
        value: float | str = p_list[1]
    elif plan.type == "score":
        value = float(sum(i * p for i, p in enumerate(p_list)))
    else:
        value = labels[k]
    flip = None
    if logp.shape[0] > 1:
        view_argmax = logp.argmax(dim=1)
        flip = float((view_argmax[1:] != view_argmax[0]).double().mean())
    return Answer(type=plan.type, labels=labels, probabilities=dict(zip(labels, p_list)), confidence=max(p_list),
                  label=labels[k], value=value, logprobs=logits.tolist(),
                  x_mass=float(torch.exp(torch.logsumexp(logp[0], dim=0))), readout=plan.mode,
                  temperature=float(temperature), flip_rate=flip, debias=debias,
                  level_texts=_level_texts(plan, descriptions))


def _level_texts(plan: QuestionPlan, descriptions: tuple | None) -> dict:
    if plan.type != "score" or descriptions is None:
        return {}
    return dict(zip(plan.labels, descriptions))
