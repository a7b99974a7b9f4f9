"""Scoring lm-eval loglikelihood requests with the engine's forward passes.

Pipeline for a list of ``(context ids, continuation ids)`` requests:

1. group them by context into packed token trees (:func:`noulengine.lmeval.tree.build_trees`);
2. route each tree the way :class:`~noulengine.engine.engine.Engine` routes a compiled request:
   linear trees (one continuation, or only one-token continuations) through the model's own causal
   attention; longer trees, where the model allows it, through the prefix KV cache (the context
   prefilled once, every branch against it); the rest through the dense tree mask;
3. plan each route's batches longest first under the padded-token budget
   (:func:`~noulengine.engine.batching.plan_batches`), several contexts per pass;
4. per pass: final hidden states (:class:`~noulengine.engine.model_runner.ModelRunner`), then the
   full-vocabulary log-probability and greedy flag of every term at its read position
   (:func:`noulengine.lmeval.readout.token_logprobs`), one device-to-host copy;
5. per request: the sum of its terms' log-probabilities, and whether every term was greedy.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from noulengine.engine.batching import collate, plan_batches
from noulengine.engine.prefix_cache import prefix_cache_unsupported, prefix_cached_hidden_batch
from noulengine.lmeval.readout import token_logprobs
from noulengine.lmeval.tree import ContinuationTree, build_trees


@dataclass
class ScoringConfig:
    """How requests are packed into passes (defaults: :class:`~noulengine.engine.config.EngineConfig`'s).

    Attributes:
        max_length: the context window as lm-eval's ``hf`` backend sees it (left truncation).
        batch_tokens: padded tokens (rows x width) per forward pass at most.
        max_batch_size: contexts (trees) per forward pass at most.
        prefix_cache_min_tokens: trees of at least this many packed tokens use the prefix KV cache
            (where the model allows it); smaller ones the dense tree mask.
        pad_id: the padding token id.
    """

    max_length: int
    batch_tokens: int = 8192
    max_batch_size: int = 64
    prefix_cache_min_tokens: int = 1024
    pad_id: int = 0


def route(tree: ContinuationTree, cache_ok: bool, config: ScoringConfig) -> str:
    """``causal``, ``cached`` or ``tree``: the pass a tree runs in (see the module docstring)."""
    if tree.compiled.is_linear:
        return "causal"
    if cache_ok and tree.input_tokens >= config.prefix_cache_min_tokens:
        return "cached"
    return "tree"


def score_requests(runner, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], config: ScoringConfig, *,
                   slot: int = 0, routing=None,
                   progress: Callable[[int], None] | None = None) -> list[tuple[float, bool]]:
    """``(log-likelihood, is_greedy)`` of every request, in input order.

    Args:
        runner: the engine's :class:`~noulengine.engine.model_runner.ModelRunner`.
        pairs: ``(context ids, continuation ids)`` per request (non-empty; see
            :func:`~noulengine.lmeval.tree.scored_context`).
        config: packing and truncation settings.
        slot: the LoRA adapter slot every pass runs under (0: the model as loaded).
        routing: the engine's :class:`~noulengine.engine.lora.LoraRouting` (None: no adapters).
        progress: called with the number of requests finished after each pass.

    Returns:
        Per request: the sum over its continuation tokens of ``log_softmax`` (float32, full
        vocabulary) at the position before each, as a Python float; and whether each of those
        tokens is the argmax there.

    Raises:
        noulengine.lmeval.tree.LoglikelihoodRequestError: an empty context or continuation, or a
            continuation longer than ``config.max_length``.
    """
    trees = build_trees(pairs, max_length=config.max_length)
    cache_ok = prefix_cache_unsupported(runner) is None
    by_route: dict[str, list[int]] = {"cached": [], "causal": [], "tree": []}
    for i, tree in enumerate(trees):
        by_route[route(tree, cache_ok, config)].append(i)
    compiled = [t.compiled for t in trees]
    total = torch.zeros(len(pairs), dtype=torch.float64)
    missed = torch.zeros(len(pairs), dtype=torch.long)  # terms that are not the argmax, per request

    def routed():
        return routing.use(slot) if routing is not None else contextlib.nullcontext()

    with torch.inference_mode():
        for kind, members in by_route.items():
            for part in plan_batches([trees[i].input_tokens for i in members], batch_tokens=config.batch_tokens,
                                     max_batch_size=config.max_batch_size):
                indices = [members[j] for j in part]
                if kind == "cached":
                    hidden = prefix_cached_hidden_batch(runner, compiled, indices, store=None,
                                                        slots={i: slot for i in indices}, routing=routing)
                else:
                    with routed():
                        hidden = runner.hidden_states(collate(compiled, indices, pad_id=config.pad_id,
                                                              causal=kind == "causal"))
                logp, ok, req = _read(hidden, [trees[i] for i in indices], runner.head)
                total.index_add_(0, req, logp.double())
                missed.index_add_(0, req, (~ok).long())
                if progress is not None:
                    progress(sum(len(trees[i].requests) for i in indices))
    return [(float(v), m == 0) for v, m in zip(total.tolist(), missed.tolist())]


def _read(hidden: torch.Tensor, trees: list[ContinuationTree], head) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every term of a pass: ``(logp (T,) float32, greedy (T,) bool, request index (T,) int64)``, on CPU.

    ``hidden``: (B, L, D) final hidden states, row ``b`` holding ``trees[b]``'s packed tokens.
    """
    b, width, _ = hidden.shape
    pos, tok, req = [], [], []
    for row, tree in enumerate(trees):
        pos.extend(p + row * width for p in tree.term_pos)
        tok.extend(tree.term_tok)
        req.extend(tree.term_req)
    dev = hidden.device
    unique_pos, inverse = torch.unique(torch.tensor(pos, dtype=torch.long), return_inverse=True)
    h = hidden.reshape(b * width, -1).index_select(0, unique_pos.to(dev))  # (P, D): read positions only
    logp, ok = token_logprobs(h, head, inverse.to(dev), torch.tensor(tok, dtype=torch.long, device=dev))
    return logp.cpu(), ok.cpu(), torch.tensor(req, dtype=torch.long)  # the pass's one device-to-host copy
