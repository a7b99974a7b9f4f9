"""procedural-v1: held-out seeds of the procedural curriculum as a pinned suite (no source data).

The records are ``noulengine.curricula.procedural.generate(N_GENERATED, seed=SEED)``: the thirteen task
kinds at levels 0-4, cycled evenly, with the answers the generator's rules compute from each state
(choice, score and noul questions; posterior questions carry the exact probability beside its
argmax label). The default training recipe (``scripts/train_default.py``) draws its procedural rows
from other seeds of the same generator (``TRAINING_STREAMS``). Three rules, applied in order:

1. *Held out from training*: a record is left out when its state and the state of any record of
   the training streams are the same text, normalised as the evaluation-overlap guard normalises
   (``noulengine.train.contamination``: canonical JSON, whitespace collapsed, lower-cased): the
   whole states are equal, or one whole state equals a string of 32+ characters inside the other
   (a routing message asked bare in one record and as ``{"message": ...}`` in the other). Small
   worlds collide by chance: a bag of 3 red and 4 blue tokens, or a fraud check with the same
   probability and costs, has few variants. The guard indexes this suite by whole state only
   (manifest ``overlap_leaf_strings: false``): its other strings are the curriculum's own template
   sentences. After this rule the guard refuses no training row of those streams.
2. *Each state once*: a record whose state is the same text as an earlier kept record's (the same
   relation) is left out.
3. *No coin-flip labels*: a posterior of exactly 1/2 (a bag with as many red as blue tokens) keeps
   its probabilities and loses its hard label, which would be arbitrary.

Records keep the generator's ids (``proc-<SEED>-<index>``), ``category`` (``procedural:<task>``)
and the metadata ``task`` and ``level``; the manifest's ``"slices": ["level"]`` makes the report
slice by level (the category slice is the per-task one).

The prepared file is pinned: a change to ``noulengine/curricula/procedural.py`` (or to the recipe's
streams) that changes these records makes preparation fail against the pin. That is a new suite
version, not a refresh of this one.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import write_jsonl

SOURCE_FILES: tuple[str, ...] = ()  # procedural: nothing is read
OUTPUT = "procedural.jsonl"
SEED = 900001  # held out: the recipe uses 20261201 (training) and 20261202 (selection)
N_GENERATED = 2200  # 13 tasks x 5 levels cycled; about 1,980 records are kept
# (seed, records) of every stream the default recipe trains or selects on: scripts/train_default.py
# SEED with PROCEDURAL_ROWS training rows, SEED + 1 with SELECTION["procedural"] selection rows.
TRAINING_STREAMS: tuple[tuple[int, int], ...] = ((20261201, 2200), (20261202, 130))


class StateTexts:
    """Normalised state texts seen so far: each state's whole text, and every text of it the guard
    checks (the whole text and its strings of 32+ characters)."""

    def __init__(self):
        self.whole: set[str] = set()
        self.all: set[str] = set()

    def add(self, state) -> None:
        from noulengine.train.contamination import state_key, state_keys

        self.whole.add(state_key(state))
        self.all |= state_keys(state)

    def holds(self, state) -> bool:
        """True when ``state`` is the same text as a state added (whole, or one inside the other)."""
        from noulengine.train.contamination import state_key, state_keys

        return state_key(state) in self.all or not self.whole.isdisjoint(state_keys(state))


def training_states() -> StateTexts:
    """The states of every record of :data:`TRAINING_STREAMS`."""
    from noulengine.curricula import procedural

    held = StateTexts()
    for seed, n in TRAINING_STREAMS:
        for rec in procedural.generate(n, seed=seed):
            held.add(rec["state"])
    return held


def build() -> tuple[list[dict], dict]:
    """The suite's records and what the three rules did (``{"generated": n,
    "excluded_training_state": n, "excluded_by_task": {...}, "repeated_state": n,
    "coin_flip_labels_dropped": n}``)."""
    from noulengine.curricula import procedural

    held_back, seen = training_states(), StateTexts()
    out: list[dict] = []
    stats = {"generated": 0, "excluded_training_state": 0, "excluded_by_task": {}, "repeated_state": 0,
             "coin_flip_labels_dropped": 0}
    for rec in procedural.generate(N_GENERATED, seed=SEED):
        stats["generated"] += 1
        if held_back.holds(rec["state"]):
            stats["excluded_training_state"] += 1
            stats["excluded_by_task"][rec["task"]] = stats["excluded_by_task"].get(rec["task"], 0) + 1
            continue
        if seen.holds(rec["state"]):
            stats["repeated_state"] += 1
            continue
        seen.add(rec["state"])
        for target in rec["targets"].values():
            probs = target.get("probabilities")
            if probs is not None and max(probs.values()) == 0.5:
                del target["label"]
                stats["coin_flip_labels_dropped"] += 1
        out.append(rec)
    return out, stats


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Write ``out_dir/procedural.jsonl`` (``source_dir`` is not read)."""
    records, _ = build()
    return write_jsonl(Path(out_dir) / OUTPUT, records)
