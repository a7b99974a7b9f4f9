"""Compiled request layout: a token tree packed into one sequence, and what to read from it.

Segments form a tree (the shared prefix is the root, each question branch a child, each
label-sequence candidate a grandchild). They are packed parents-first into one sequence. A
token attends to the tokens of its own segment up to itself and to all tokens of its ancestor
segments; its position id is its depth in the tree, so every branch sees exactly the positions
it would have in a separate ``prefix + branch`` prompt.

Readout terms say which log-probabilities to read: ``log p(token | sequence up to position)``.
A candidate's log-probability is the log-sum-exp over its alternatives of the sum of their terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

READOUT_MODES = ("symbols", "label-token", "label-sequence")


@dataclass
class QuestionPlan:
    """How one question is read.

    ``V`` views (rotations of the option order for permutation debiasing; 1 otherwise) by ``K``
    candidates. Terms index alternatives, alternatives index ``view * K + candidate``.

    Attributes:
        field, type, labels: the question.
        mode: the readout mode used.
        rotations: the rotation ``r`` of each view (candidate ``k`` shown at slot ``(k - r) % K``).
        term_pos: (T,) positions in the request's packed sequence whose next-token distribution is read.
        term_tok: (T,) token ids read there.
        term_alt: (T,) alternative index of each term.
        alt_vc: (A,) view-candidate index ``v * K + k`` of each alternative.
        spec_key: hashable content key of the question and readout (for prior caching).
    """

    field: str
    type: str
    labels: tuple[str, ...]
    mode: str
    rotations: tuple[int, ...]
    term_pos: list[int] = field(default_factory=list)
    term_tok: list[int] = field(default_factory=list)
    term_alt: list[int] = field(default_factory=list)
    alt_vc: list[int] = field(default_factory=list)
    spec_key: str = ""

    @property
    def num_candidates(self) -> int:
        return len(self.labels)

    @property
    def num_views(self) -> int:
        return len(self.rotations)

    def add_alternative(self, view: int, cand: int, terms: list[tuple[int, int]]) -> None:
        alt = len(self.alt_vc)
        self.alt_vc.append(view * self.num_candidates + cand)
        for pos, tok in terms:
            self.term_pos.append(pos)
            self.term_tok.append(tok)
            self.term_alt.append(alt)


@dataclass
class CompiledRequest:
    """One request as a packed token tree.

    Attributes:
        token_ids: (L,) packed tokens.
        position_ids: (L,) tree depth of each token.
        segment_ids: (L,) segment of each token.
        parents: (S,) parent segment of each segment (-1 for the root).
        questions: one plan per question, in request order.
        input_tokens: distinct tokens fed to the model (== L).
        max_position: the largest position id + 1 (what the context window must hold).
        vision: the request's images as the model reads them
            (:class:`noulengine.vision.VisionInputs`: their expanded tokens sit in the prefix), or
            None for a text request.
        static_tokens: how many leading tokens do not depend on the state (the chat-template head;
            in the schema-first layout also the questions): the prefix requests asking the same
            questions share, which the engine's prefix store prefills once. 0 for image requests.
    """

    token_ids: list[int]
    position_ids: list[int]
    segment_ids: list[int]
    parents: list[int]
    questions: list[QuestionPlan]
    request_id: str | None = None
    vision: object | None = None
    static_tokens: int = 0

    @property
    def input_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def max_position(self) -> int:
        return max(self.position_ids) + 1 if self.position_ids else 0

    @property
    def prefix_tokens(self) -> int:
        """Tokens of the root segment (the shared prefix, packed first; position ids 0 .. n-1)."""
        return next((i for i, s in enumerate(self.segment_ids) if s != 0), len(self.segment_ids))

    @property
    def is_linear(self) -> bool:
        """True when the tree is one chain of segments (one question, one view, no
        label-sequence children): its attention mask is then exactly the causal mask and its
        position ids are ``0 .. L-1``, so the model's own causal attention computes it."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def ancestor_matrix(self) -> torch.Tensor:
        """(S, S) bool: ``[i, j]`` is True when segment j is segment i or one of its ancestors."""
        s = len(self.parents)
        anc = torch.eye(s, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                anc[i] |= anc[p]  # parents are packed (and so numbered) before children
        return anc

    def attention_mask(self) -> torch.Tensor:
        """(L, L) bool: ``[q, k]`` True when query token q may attend key token k."""
        seg = torch.tensor(self.segment_ids, dtype=torch.long)
        anc = self.ancestor_matrix()
        n = seg.numel()
        causal = torch.ones(n, n, dtype=torch.bool).tril_()
        return anc[seg[:, None], seg[None, :]] & causal


def common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading ids ``a`` and ``b`` share, at most ``limit``."""
    n = min(limit, len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def shared_root_prefix(requests: Sequence[CompiledRequest]) -> int:
    """The longest token prefix all ``requests`` share within every one's root segment."""
    first = requests[0].token_ids
    shared = min(r.prefix_tokens for r in requests)
    for r in requests[1:]:
        shared = common_prefix_length(first, r.token_ids, shared)
    return shared


class SequenceBuilder:
    """Appends segments to a packed token tree (parents before children)."""

    def __init__(self):
        self.token_ids: list[int] = []
        self.position_ids: list[int] = []
        self.segment_ids: list[int] = []
        self.parents: list[int] = []
        self._end_depth: list[int] = []  # depth after a segment's last token
        self._last_pos: list[int] = []  # packed index of a segment's last token (or its parent's)

    def add(self, ids, parent: int) -> int:
        """Append a segment; returns its index. An empty segment is allowed (a pure read point)."""
        seg = len(self.parents)
        depth = self._end_depth[parent] if parent >= 0 else 0
        last = self._last_pos[parent] if parent >= 0 else -1
        for i, t in enumerate(ids):
            self.token_ids.append(int(t))
            self.position_ids.append(depth + i)
            self.segment_ids.append(seg)
            last = len(self.token_ids) - 1
        self.parents.append(parent)
        self._end_depth.append(depth + len(ids))
        self._last_pos.append(last)
        return seg

    def last_position(self, seg: int) -> int:
        """Packed index whose next-token distribution continues segment ``seg``."""
        return self._last_pos[seg]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
