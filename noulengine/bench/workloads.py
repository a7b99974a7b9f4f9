"""The bench's workloads: Typed-Decisions states, one long state asked 16 and 32 questions, and
shuffled AG News rows (with gold labels, the peer's workload)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from noulengine.bench.variants import Prepared
from noulengine.records.schema import Request

DATA = Path(os.environ.get("NOULENGINE_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")


@dataclass
class Workload:
    """One timed workload. ``golds``: per request, field -> gold label (accuracy is reported when
    given); ``peer``: whether the peer variant runs on it."""

    name: str
    requests: list[Request]
    note: str = ""
    items: list[Prepared] = field(default_factory=list)
    golds: list[dict[str, str]] | None = None
    peer: bool = False


def _records(name: str, n: int | None = None):
    from noulengine.records import load_records

    path = DATA / name
    if not path.exists():
        raise SystemExit(f"bench: data file {path} not found (set NOULENGINE_DATA to the shared data folder)")
    recs = load_records(path).records
    return recs if n is None else recs[:n]


QUESTION_COUNTS = (1, 16, 32)  # questions on one long state: the cost of each extra question


def long_state_requests(max_chars: int, counts: tuple[int, ...] = QUESTION_COUNTS) -> dict[int, Request]:
    """A long WildJailbreak state asked ``n`` questions for each ``n`` in ``counts``.

    The questions are the state's own, then Typed-Decisions questions (renamed to stay unique);
    the ``n``-question request holds the first ``n`` of them, so requests differ only in how many
    branches they add to the shared prefix.

    Returns:
        ``{n: Request}`` with ids ``long{n}``.
    """
    jail = _records("wildjailbreak/test.local_ids.jsonl")
    best = max((r for r in jail if len(json.dumps(r.request.state)) <= max_chars),
               key=lambda r: len(json.dumps(r.request.state)))
    questions = list(best.request.questions)
    want = max(counts)
    for rec in _records("typed_decisions/test.jsonl", -(-want // 5) + 1):
        for q in rec.request.questions:
            if len(questions) < want:
                questions.append(dataclasses.replace(q, field=f"{q.field}_{len(questions)}"))
    if len(questions) < want:
        raise ValueError(f"only {len(questions)} questions available for the long-state workload, {want} wanted")
    return {n: Request(state=best.request.state, questions=tuple(questions[:n]), id=f"long{n}") for n in counts}


AGNEWS_SEED = 0  # issue #15's peer measurement: random.Random(0) shuffle of the test file, first N rows


def agnews_rows(n: int):
    """The first ``n`` AG News test records after a ``random.Random(AGNEWS_SEED)`` shuffle."""
    import random

    recs = list(_records("agnews/test.jsonl"))
    random.Random(AGNEWS_SEED).shuffle(recs)
    return recs[:n]


def build_workloads(quick: bool) -> tuple[list[Workload], dict[int, Request]]:
    typed_n, agnews_n, long_chars = (2, 24, 1000) if quick else (6, 200, 3000)
    longs = long_state_requests(long_chars)
    agnews = agnews_rows(agnews_n)
    return [
        Workload("typed_decisions", [r.request for r in _records("typed_decisions/test.jsonl", typed_n)],
                 f"first {typed_n} Typed-Decisions test states, 5 questions each"),
        Workload("long_state_16q", [longs[16]],
                 f"longest WildJailbreak eval state <= {long_chars} JSON chars, 16 questions"),
        Workload("long_state_32q", [longs[32]],
                 "the same state, 32 questions (16 more branches on the same prefix)"),
        Workload("agnews_1q", [r.request for r in agnews],
                 f"{agnews_n} AG News test records (random.Random({AGNEWS_SEED}) shuffle), 1 question each",
                 golds=[{f: t.label for f, t in r.targets.items()} for r in agnews], peer=True),
    ], longs

