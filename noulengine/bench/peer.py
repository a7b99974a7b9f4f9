"""The bench's ``peer`` variant: a same-model decision library from PyPI on the same rows.

The peer is anyjev (``pip install 'noulengine[bench]'``; issue #15 measured 0.3.0): a
training-free readout library, run here the way its README's transformers path runs it, with
``HFBackend`` (one transformers forward per prompt batch, logits at the last position,
``batch_size=16``) and ``Decider(level="raw", prior="none")``: one prompt per state and
question, options listed by name after letters A, B, ..., a softmax over the letters' tokens.

It is given the very weights the engine runs (the engine's model, LoRA already merged, saved to a
temporary directory), so the two variants differ only in prompts and execution. Its prompts are
its own (shorter: option names without descriptions), so its answers are not compared with the
engine's; accuracy against the gold labels is reported for both instead.

Units: seconds (``time.perf_counter``), tokens (the peer's prompts tokenized as its backend
tokenizes them: ``encode(prompt, add_special_tokens=False)``).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from noulengine.records.schema import Request

PEER = "anyjev"
PEER_EXTRA = "pip install 'noulengine[bench]'"
PEER_BATCH_SIZE = 16  # HFBackend's default


def peer_unavailable() -> str | None:
    """Why the peer variant cannot run here (a message naming the fix), or None when it can."""
    try:
        import anyjev  # noqa: F401
        from anyjev.backends.hf import HFBackend  # noqa: F401
    except ImportError as exc:
        return f"peer variant skipped: {PEER} is not installed ({exc}); install it with {PEER_EXTRA}"
    return None


def start_peer(mode: str, engine):
    """The peer for the bench's ``--peer`` flag: ``(peer, skipped, refused)``.

    ``mode`` ``off``: no peer. ``auto``: a :class:`Peer` on ``engine``'s weights when installed, else
    ``skipped`` says why (printed). ``on``: ``refused`` is True when it is not installed (the command
    then exits 2). Messages go to stdout (skipped) or stderr (refused).
    """
    import sys

    if mode == "off":
        return None, None, False
    skipped = peer_unavailable()
    if skipped:
        print(f"bench: {skipped}", file=sys.stderr if mode == "on" else sys.stdout, flush=True)
        return None, skipped, mode == "on"
    peer = Peer(engine)
    print(f"bench: peer variant: {PEER} {peer.version} on the same weights", flush=True)
    return peer, None, False


def peer_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PEER)
    except PackageNotFoundError:
        return None


def _peer_question(q):
    """The peer's question for one of ours, and the permutation from its option order to our labels."""
    from anyjev.question import Question as PeerQuestion

    text = q.instructions if isinstance(q.instructions, str) else json.dumps(q.instructions, ensure_ascii=False)
    if q.type == "choice":
        return PeerQuestion.choice(text, list(q.labels)), list(range(len(q.labels)))
    if q.type == "noul":
        return PeerQuestion.noul(text), [1, 0]  # the peer's options are ("Yes", "No"); ours ("no", "yes")
    if q.type == "score":
        levels = [d if d else label for label, d in zip(q.labels, q.descriptions)]
        return PeerQuestion.score(text, levels=levels), list(range(len(q.labels)))
    raise ValueError(f"peer: question type {q.type!r} has no peer equivalent")


class Peer:
    """anyjev on the engine's own model.

    Args:
        engine: the bench's :class:`~noulengine.Engine` (its model is saved once for the peer).
        batch_size: prompts per forward pass (the peer's default, 16).

    Raises:
        RuntimeError: the peer is not installed (:func:`peer_unavailable`).
    """

    def __init__(self, engine, *, batch_size: int = PEER_BATCH_SIZE):
        why = peer_unavailable()
        if why:
            raise RuntimeError(why)
        from anyjev.backends.hf import HFBackend
        from anyjev.decider import Decider

        self._dir = tempfile.TemporaryDirectory(prefix="noulengine-peer-")
        path = Path(self._dir.name)
        engine.runner.model.save_pretrained(path)
        engine.tokenizer.save_pretrained(path)
        dtype = str(engine.runner.dtype).replace("torch.", "")
        self.backend = HFBackend(str(path), device=str(engine.runner.device), dtype=dtype, batch_size=batch_size)
        self.decider = Decider(self.backend, level="raw", prior="none")
        self.version = peer_version()

    def close(self) -> None:
        self._dir.cleanup()

    def prompt_tokens(self, requests: list[Request]) -> int:
        """Tokens of the prompts the peer builds for ``requests`` (one per state and question)."""
        from anyjev.readout import DEFAULT_SYSTEM, build_prompt, render_chat, resolve_labels
        from anyjev.state import render_state

        tok = self.backend.tokenizer
        total = 0
        for r in requests:
            for q in r.questions:
                pq, _ = _peer_question(q)
                labels, _ids = resolve_labels(tok, pq)
                spec = build_prompt(render_state(r.state), pq, list(range(pq.k)), DEFAULT_SYSTEM, labels)
                total += len(tok.encode(render_chat(tok, spec), add_special_tokens=False))
        return total

    def run(self, requests: list[Request]) -> tuple[list, list[float]]:
        """Answer every question of every request, one ``decide_batch`` call per distinct question.

        Returns:
            ``(answers, latency)``: per request, per question, the probabilities in our label
            order; per request, the wall seconds of the call that answered it.
        """
        groups: dict[str, list[tuple[int, int]]] = {}
        specs = {}
        for i, r in enumerate(requests):
            for j, q in enumerate(r.questions):
                key = json.dumps(q.spec(), sort_keys=True, ensure_ascii=False)
                groups.setdefault(key, []).append((i, j))
                specs[key] = q
        answers: list[list] = [[None] * len(r.questions) for r in requests]
        latency = [0.0] * len(requests)
        for key, slots in groups.items():
            pq, order = _peer_question(specs[key])
            t0 = time.perf_counter()
            decisions = self.decider.decide_batch([requests[i].state for i, _ in slots], pq)
            dt = time.perf_counter() - t0
            for (i, j), d in zip(slots, decisions):
                probs = [float(p) for p in d.probs]
                answers[i][j] = [probs[k] for k in order]
                latency[i] += dt
        return answers, latency
