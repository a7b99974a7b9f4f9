"""The bench's variants on identical token ids: ``naive`` and ``batched`` transformers baselines
built from the engine's own compiled prompts, and the ``engine`` itself.

Prompts come from the engine's compiler (:meth:`Engine.compile`): a prompt is the chain of
segments from the root to a segment that holds read positions, so all variants evaluate identical
token ids; a read at packed index ``t`` is prompt index ``position_ids[t]`` (tree depth).
Probabilities are compared after the same renormalisation (:func:`make_answer` on each variant's
(V, K) candidate log-probabilities).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from noulengine.compile.layout import CompiledRequest
from noulengine.engine.decision import make_answer
from noulengine.records.schema import Request

# engine_tree: the engine with its causal path and prefix cache off (every request through the dense tree mask)
VARIANTS = ("naive", "batched", "engine", "engine_tree")


# --------------------------------------------------------------------------- prompts
@dataclass
class Prompt:
    """One baseline prompt: ``ids`` (prefix + branch chain) and the reads it serves.

    ``reads``: (prompt index, token id, term index in the request's flattened terms).
    """

    ids: list[int]
    reads: list[tuple[int, int, int]]


@dataclass
class Prepared:
    """A request compiled once, with its baseline prompts."""

    request: Request
    compiled: CompiledRequest
    prompts: list[Prompt]

    @property
    def num_terms(self) -> int:
        return sum(len(p.term_pos) for p in self.compiled.questions)


def baseline_prompts(c: CompiledRequest) -> list[Prompt]:
    """Per segment holding read positions: the root-to-segment token chain and its reads."""
    seg_tokens: dict[int, list[int]] = {}
    for tok, seg in zip(c.token_ids, c.segment_ids):
        seg_tokens.setdefault(seg, []).append(tok)
    by_seg: dict[int, list[tuple[int, int, int]]] = {}
    term = 0
    for plan in c.questions:
        for pos, tok in zip(plan.term_pos, plan.term_tok):
            by_seg.setdefault(c.segment_ids[pos], []).append((c.position_ids[pos], tok, term))
            term += 1
    prompts = []
    for seg, reads in by_seg.items():
        chain, s = [], seg
        while s >= 0:
            chain.append(s)
            s = c.parents[s]
        ids = [t for s in reversed(chain) for t in seg_tokens.get(s, [])]
        assert all(0 <= r[0] < len(ids) for r in reads), "read position outside its prompt"
        prompts.append(Prompt(ids, reads))
    return prompts


def answers_from_terms(c: CompiledRequest, term_logp: torch.Tensor) -> list[list[float]]:
    """Per question: candidate probabilities from flattened term log-probs (engine's rules)."""
    out, start = [], 0
    for plan in c.questions:
        t = term_logp[start:start + len(plan.term_pos)].double()
        start += len(plan.term_pos)
        alt = torch.zeros(len(plan.alt_vc), dtype=torch.float64).index_add_(0, torch.tensor(plan.term_alt), t)
        nvc = plan.num_views * plan.num_candidates
        vc = torch.full((nvc,), float("-inf"), dtype=torch.float64)
        for a, v in enumerate(plan.alt_vc):
            vc[v] = torch.logaddexp(vc[v], alt[a])
        ans = make_answer(plan, vc.view(plan.num_views, plan.num_candidates))
        out.append([ans.probabilities[label] for label in plan.labels])
    return out


# --------------------------------------------------------------------------- variants
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def run_naive(model, items: list[Prepared], device) -> tuple[list, list[float]]:
    """One full-head forward per prompt. Returns (answers per request, seconds per request)."""
    answers, lat = [], []
    for it in items:
        _sync(device)
        t0 = time.perf_counter()
        term_logp = torch.empty(it.num_terms)
        for pr in it.prompts:
            logits = model(input_ids=torch.tensor([pr.ids], device=device), use_cache=False).logits[0]  # (L, V)
            for pos, tok, term in pr.reads:
                term_logp[term] = torch.log_softmax(logits[pos].float(), dim=-1)[tok].item()
        lat.append(time.perf_counter() - t0)
        answers.append(answers_from_terms(it.compiled, term_logp))
    return answers, lat


@torch.inference_mode()
def run_batched(model, items: list[Prepared], device, *, batch_tokens: int, pad_id: int,
                max_batch_size: int = 64) -> tuple[list, list[float], int]:
    """All prompts of all requests, longest first, left-padded into batches under ``batch_tokens``.

    Returns (answers per request, seconds per request = sum of its batches' times, padded tokens).
    """
    from noulengine.engine.batching import plan_batches

    flat = [(i, pr) for i, it in enumerate(items) for pr in it.prompts]
    term_logp = [torch.empty(it.num_terms) for it in items]
    lat = [0.0] * len(items)
    padded = 0
    for idx in plan_batches([len(pr.ids) for _, pr in flat], batch_tokens=batch_tokens, max_batch_size=max_batch_size):
        _sync(device)
        t0 = time.perf_counter()
        rows = [flat[j] for j in idx]
        width = max(len(pr.ids) for _, pr in rows)
        keep = max(len(pr.ids) - min(r[0] for r in pr.reads) for _, pr in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (_, pr) in enumerate(rows):
            ids[r, width - len(pr.ids):] = torch.tensor(pr.ids)
            mask[r, width - len(pr.ids):] = 1
        pos_ids = (mask.cumsum(-1) - 1).clamp_(min=0)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos_ids.to(device),
                       logits_to_keep=keep, use_cache=False).logits  # (B, keep, V)
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        for r, (i, pr) in enumerate(rows):
            for pos, tok, term in pr.reads:
                term_logp[i][term] = logp[r, keep - (len(pr.ids) - pos), tok]
        dt = time.perf_counter() - t0
        padded += ids.numel()
        for i in {i for i, _ in rows}:
            lat[i] += dt
    return [answers_from_terms(it.compiled, t) for it, t in zip(items, term_logp)], lat, padded


def run_engine(engine, items: list[Prepared]) -> tuple[list, list[float], float]:
    """``engine.decide_batch``. Returns (answers, per-request latency_s, padding share)."""
    decisions = engine.decide_batch([it.request for it in items], on_error="raise")
    answers = [[[d.answers[p.field].probabilities[label] for label in p.labels] for p in it.compiled.questions]
               for d, it in zip(decisions, items)]
    return answers, [d.latency_s for d in decisions], float(getattr(engine, "last_padding_share", 0.0))



def max_prob_diff(a: list, b: list) -> float:
    return max((abs(x - y) for ra, rb in zip(a, b) for qa, qb in zip(ra, rb) for x, y in zip(qa, qb)), default=0.0)

