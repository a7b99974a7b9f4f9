"""The training objective, computed with the engine's own forward pass and readout.

A training example is a compiled request (one packed tree: shared prefix, one branch per
question; under label-sequence one child branch per candidate text) plus each question's gold
candidate. A question's candidate scores ``s_k`` are its full-vocabulary candidate
log-probabilities, read through exactly the readout inference uses
(:func:`noulengine.engine.readout.batch_candidate_logprobs`), whatever the readout: ``symbols``
(the symbol token), ``label-token`` (the first token of the candidate's text, spellings summed),
``label-sequence`` (the log-likelihood of the text plus the end-of-answer token) or ``auto``
(per question one of those). So what is trained is what is served:

* ``full`` (default): ``-s_gold``, the gold candidate's probability over the whole vocabulary,
  which is ``candidates`` plus ``-log x_mass`` (``x_mass = sum_k exp(s_k)``, the candidate mass
  the engine serves): the model also learns to put its mass on the candidates (``x_mass`` near 1
  at inference);
* ``candidates``: ``-log softmax(s)[gold]``, the candidates renormalised among themselves (what
  inference reports as probabilities).

Soft targets (``targets[field].probabilities``) replace the one-hot gold by the gold
distribution: ``-sum_k p_k log q_k`` (the same identity holds: the ``p_k`` sum to 1).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from noulengine.compile.layout import CompiledRequest
from noulengine.engine.batching import collate
from noulengine.engine.readout import batch_candidate_logprobs
from noulengine.train.data import TrainRow, permuted_request

LOSSES = ("full", "candidates")


@dataclass
class TrainExample:
    """One compiled training row.

    Attributes:
        row: the checked training row.
        compiled: its packed token tree (options possibly permuted).
        gold: (Q,) gold candidate index per question in the compiled option order (-1: soft only).
        soft: per question a (K,) float64 gold distribution in compiled order, or None.
    """

    row: TrainRow
    compiled: CompiledRequest
    gold: list[int]
    soft: list[torch.Tensor | None]


def compile_example(compiler, row: TrainRow, rng: random.Random | None = None) -> TrainExample:
    """Compile ``row`` (options permuted by ``rng`` when given) with the engine's compiler.

    Raises:
        OverlengthError, RecordError: from the compiler (never truncated).
    """
    request = permuted_request(row.record.request, rng)
    compiled = compiler.compile(request)
    gold, soft = [], []
    original = {q.field: q for q in row.record.request.questions}
    for q, label, dist in zip(request.questions, row.gold, row.soft):
        gold.append(q.labels.index(label) if label is not None else -1)
        if dist is None:
            soft.append(None)
        else:
            by_label = dict(zip(original[q.field].labels, dist))
            soft.append(torch.tensor([by_label[lab] for lab in q.labels], dtype=torch.float64))
    return TrainExample(row, compiled, gold, soft)


def question_loss(view_logprobs: torch.Tensor, gold: int, soft: torch.Tensor | None, loss: str) -> torch.Tensor:
    """The loss of one question.

    Args:
        view_logprobs: (V, K) full-vocabulary candidate log-probabilities (view 0 is read; training
            compiles without permutation views).
        gold: gold candidate index (ignored when ``soft`` is given).
        soft: optional (K,) gold distribution.
        loss: ``"full"`` or ``"candidates"``.

    Returns:
        A scalar float64 tensor (nats).
    """
    lp = view_logprobs[0]
    if loss == "candidates":
        lp = lp - torch.logsumexp(lp, dim=0)
    elif loss != "full":
        raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}")
    if soft is not None:
        return -(soft.to(lp.dtype) * lp).sum()
    return -lp[gold]


@dataclass
class StepOutput:
    """Per-batch results: the per-question losses (autograd on) and how many argmaxes were right."""

    losses: list[torch.Tensor]
    correct: int

    @property
    def num_questions(self) -> int:
        return len(self.losses)

    def mean_loss(self) -> torch.Tensor:
        return torch.stack(self.losses).mean()


def batch_losses(runner, examples: list[TrainExample], indices: list[int], *, loss: str = "full",
                 pad_id: int = 0, autocast_dtype: torch.dtype | None = None) -> StepOutput:
    """Forward one padded batch of training examples and return every question's loss.

    The batch is collated exactly like inference (:func:`noulengine.engine.batching.collate`:
    tree attention mask, position ids restarting after the shared prefix) and run through
    :meth:`ModelRunner.forward_hidden` (autograd on).
    """
    compiled = [e.compiled for e in examples]
    batch = collate(compiled, indices, pad_id=pad_id)
    if autocast_dtype is not None:
        with torch.autocast(runner.device.type, dtype=autocast_dtype):
            hidden = runner.forward_hidden(batch)
    else:
        hidden = runner.forward_hidden(batch)
    per_row = batch_candidate_logprobs(hidden, runner.head, compiled, indices)
    losses, correct = [], 0
    for row, idx in enumerate(indices):
        ex = examples[idx]
        for j, lp in enumerate(per_row[row]):
            losses.append(question_loss(lp, ex.gold[j], ex.soft[j], loss))
            want = ex.gold[j] if ex.soft[j] is None else int(torch.argmax(ex.soft[j]))
            correct += int(int(torch.argmax(lp[0].detach())) == want)
    return StepOutput(losses, correct)
