"""lm-eval loglikelihood requests as packed token trees: each context once, its continuations as branches.

A request is ``(context ids, continuation ids)``, tokenised as lm-eval's ``hf`` backend tokenises
it (:mod:`noulengine.lmeval.model`). The ``hf`` backend runs ``context + continuation`` once per
request and reads ``log p(continuation[j] | everything before it)`` for every ``j``. The same
numbers come from one tree per distinct context:

* the root segment is the context (positions ``0 .. n-1``);
* every continuation's tokens but its last are fed as a branch below it, continuations that start
  with the same tokens sharing those tokens (a token trie, chains packed as one segment);
* a continuation's term ``j`` is read at the packed index of the token before it: the context's
  last token for ``j = 0``, its own token ``j - 1`` in the trie after that.

The tree is an ordinary :class:`~noulengine.compile.layout.CompiledRequest` (with no questions), so
the engine's batching, tree mask, causal path and prefix KV cache run it unchanged. One-token
continuations need no branch at all: a context whose continuations are all one token long (letter
choices) is a linear request, one causal pass read at its last position.

Truncation follows the ``hf`` backend exactly: the input it runs is
``(context + continuation)[-(max_length + 1):][:-1]``, so a request whose context and continuation
together pass ``max_length + 1`` tokens loses context tokens from the left. The tree's context is
that truncated context, and requests are grouped by it (a longer continuation can truncate more).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from noulengine.compile.layout import CompiledRequest, SequenceBuilder


class LoglikelihoodRequestError(ValueError):
    """A loglikelihood request that cannot be scored (an empty context or continuation, or a
    continuation longer than the model's context window). The message names the request and rule."""


@dataclass
class ContinuationTree:
    """One context and the continuations scored after it, as a packed token tree.

    Attributes:
        compiled: the packed tree (root = the context; branches = continuations without their last
            token); ``compiled.questions`` is empty: the terms below say what to read.
        requests: the caller's indices of the requests in this tree, in the order given.
        term_pos: (T,) packed index whose next-token distribution each term reads.
        term_tok: (T,) the token id each term reads there.
        term_req: (T,) the caller's request index each term belongs to (a request's terms sum to
            its log-likelihood).
    """

    compiled: CompiledRequest
    requests: list[int] = field(default_factory=list)
    term_pos: list[int] = field(default_factory=list)
    term_tok: list[int] = field(default_factory=list)
    term_req: list[int] = field(default_factory=list)

    @property
    def input_tokens(self) -> int:
        return self.compiled.input_tokens


def scored_context(context: Sequence[int], continuation: Sequence[int], max_length: int,
                   index: int = 0) -> tuple[int, ...]:
    """The context the ``hf`` backend conditions ``continuation`` on, after its left truncation.

    ``(context + continuation)[-(max_length + 1):]`` without the continuation: all of ``context``
    when both fit in ``max_length + 1`` tokens, else its last ``max_length + 1 - len(continuation)``.

    Raises:
        LoglikelihoodRequestError: an empty context or continuation, or a continuation longer than
            ``max_length`` (the ``hf`` backend asserts the same).
    """
    if not context:
        raise LoglikelihoodRequestError(f"request {index}: the context has no tokens (expected at least 1: an "
                                        "empty context string is given the prefix token before this point)")
    if not continuation:
        raise LoglikelihoodRequestError(f"request {index}: the continuation has no tokens (expected at least 1)")
    if len(continuation) > max_length:
        raise LoglikelihoodRequestError(f"request {index}: the continuation has {len(continuation)} tokens, more than "
                                        f"max_length {max_length} (the model's context window)")
    keep = max_length + 1 - len(continuation)
    return tuple(context[-keep:]) if len(context) > keep else tuple(context)


def build_trees(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, max_length: int) -> list[ContinuationTree]:
    """Group ``(context ids, continuation ids)`` pairs by their (truncated) context into trees.

    Args:
        pairs: one ``(context, continuation)`` pair of token id lists per request.
        max_length: the model's context window as the ``hf`` backend sees it (its ``max_length``).

    Returns:
        One :class:`ContinuationTree` per distinct context, in order of first appearance; every
        request index appears in exactly one tree, with ``len(continuation)`` terms.

    Raises:
        LoglikelihoodRequestError: see :func:`scored_context`.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, cont) in enumerate(pairs):
        groups.setdefault(scored_context(ctx, cont, max_length, i), []).append(i)
    return [_tree(context, members, [pairs[i][1] for i in members]) for context, members in groups.items()]


def _tree(context: tuple[int, ...], members: list[int], continuations: list[Sequence[int]]) -> ContinuationTree:
    """The packed tree of one context and its continuations (see the module docstring)."""
    # a token trie of every continuation but its last token: node 0 is the context's end
    children: list[dict[int, int]] = [{}]
    token: list[int] = [-1]
    paths: list[list[int]] = []  # per request: the trie node of each fed token
    for cont in continuations:
        node, path = 0, []
        for t in cont[:-1]:
            nxt = children[node].get(int(t))
            if nxt is None:
                nxt = len(children)
                children[node][int(t)] = nxt
                children.append({})
                token.append(int(t))
            node = nxt
            path.append(node)
        paths.append(path)
    builder = SequenceBuilder()
    root = builder.add(context, -1)
    packed = {0: builder.last_position(root)}  # trie node -> packed index of its token
    stack = [(child, root) for child in reversed(list(children[0].values()))]
    while stack:  # depth first, parents packed before children; a chain of single children is one segment
        node, parent_seg = stack.pop()
        chain = [node]
        while len(children[chain[-1]]) == 1:
            chain.append(next(iter(children[chain[-1]].values())))
        start = builder.num_tokens
        seg = builder.add([token[n] for n in chain], parent_seg)
        for k, n in enumerate(chain):
            packed[n] = start + k
        stack.extend((child, seg) for child in reversed(list(children[chain[-1]].values())))
    compiled = CompiledRequest(token_ids=builder.token_ids, position_ids=builder.position_ids,
                               segment_ids=builder.segment_ids, parents=builder.parents, questions=[])
    tree = ContinuationTree(compiled, requests=list(members))
    for req, cont, path in zip(members, continuations, paths):
        for j, t in enumerate(cont):
            tree.term_pos.append(packed[path[j - 1]] if j else packed[0])
            tree.term_tok.append(int(t))
            tree.term_req.append(req)
    return tree
