"""Known-distribution calibration pilot v1 (96 choice questions) -> canonical ``test.jsonl``.

Contract (``shared/data/known_distribution_pilot/SOURCE.md``): only ``state`` and ``questions``
from ``inputs.jsonl`` reach the model, unchanged (same option order, no truncation). The exact
reference distribution from ``references.jsonl`` is attached ONLY as ``targets.decision.probabilities``
(plus the exact fractions), with NO hard label: the reference argmax is not a gold label. Each
reference row's ``input_sha256`` is checked against its inputs line.

The data carries no licence: it is prepared from shared data and never committed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from noulengine.eval.suites.hashing import write_jsonl

SOURCE_FILES = ("known_distribution_pilot/inputs.jsonl", "known_distribution_pilot/references.jsonl")
OUTPUT = "test.jsonl"
METADATA_KEYS = ("group", "variant", "family", "difficulty", "input_sha256")


def _lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [line for line in text.split("\n") if line]


def build_records(source_dir: Path) -> list[dict]:
    """Join inputs and references by id (same order) into canonical records."""
    base = Path(source_dir) / "known_distribution_pilot"
    inputs = _lines(base / "inputs.jsonl")
    refs = [json.loads(line) for line in _lines(base / "references.jsonl")]
    if len(inputs) != len(refs):
        raise ValueError(f"pilot: {len(inputs)} inputs but {len(refs)} references")
    records = []
    for n, (line, ref) in enumerate(zip(inputs, refs)):
        inp = json.loads(line)
        if inp["id"] != ref["id"]:
            raise ValueError(f"pilot row {n}: input id {inp['id']!r} != reference id {ref['id']!r}")
        if hashlib.sha256(line.encode("utf-8")).hexdigest() != ref["input_sha256"]:
            raise ValueError(f"pilot row {n}: inputs line does not match its reference input_sha256")
        fld = ref["field"]
        options = list(inp["questions"][fld]["criteria"])
        if list(ref["gold_probs"]) != options:
            raise ValueError(f"pilot row {n}: reference options differ from the question's options")
        rec = {"id": inp["id"], "state": inp["state"], "questions": inp["questions"],
               "targets": {fld: {"label": None, "probabilities": ref["gold_probs"],
                                 "fractions": ref["gold_fractions"], "label_origin": "exact_reference"}},
               "images": [], "category": ref["category"]}
        rec.update({k: ref[k] for k in METADATA_KEYS})
        records.append(rec)
    return records


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Write ``<out_dir>/test.jsonl`` (96 records, references as targets only); returns its path."""
    return write_jsonl(Path(out_dir) / OUTPUT, build_records(Path(source_dir)))
