"""AG News test split (7,600 rows) -> accuracy-v1 canonical ``test.jsonl``.

Follows ``shared/data/agnews/SOURCE.md`` exactly, so the output reproduces the published
sha256 ``4ff1cad1...``: id = sha256("agnews_test:<row>")[:24]; state.text = title + " " +
description (CSV-decoded, backslashes kept); one ``choice`` question ``decision``; label from the
class index (1..4, named in classes.txt); compact JSON, LF, trailing newline.
"""

from __future__ import annotations

import csv
from pathlib import Path

from noulengine.eval.suites.hashing import short_id, write_jsonl

SOURCE_FILES = ("agnews/test.csv", "agnews/classes.txt")
OUTPUT = "test.jsonl"

INSTRUCTIONS = "Which news topic does this article belong to?"
CRITERIA = {
    "world": "World news, international politics and current affairs.",
    "sports": "Sports and athletics.",
    "business": "Business, finance, markets and the economy.",
    "sci_tech": "Science, technology, computers and the internet.",
}
# classes.txt line n names class index n; these are the canonical labels for those names.
CLASS_LABELS = {"World": "world", "Sports": "sports", "Business": "business", "Sci/Tech": "sci_tech"}


def question() -> dict:
    """The suite's one question (shared with the validation builder so wording stays identical)."""
    return {"type": "choice", "instructions": INSTRUCTIONS, "criteria": dict(CRITERIA)}


def make_record(rid: str, text: str, label: str) -> dict:
    """One canonical AG News record in the accuracy-v1 key order."""
    return {"id": rid, "state": {"text": text}, "questions": {"decision": question()},
            "targets": {"decision": {"label": label, "label_origin": "native_annotation"}},
            "images": [], "category": "qa_reasoning"}


def read_labels(source_dir: Path) -> dict[str, str]:
    """Map class index strings ("1".."4") to labels, via classes.txt."""
    names = (source_dir / "agnews" / "classes.txt").read_text(encoding="utf-8").split("\n")
    names = [n.strip() for n in names if n.strip()]
    return {str(i): CLASS_LABELS[name] for i, name in enumerate(names, start=1)}


def read_test_rows(source_dir: Path) -> list[tuple[str, str]]:
    """``(text, label)`` for every row of test.csv, in file order."""
    labels = read_labels(source_dir)
    rows = []
    with (source_dir / "agnews" / "test.csv").open(encoding="utf-8", newline="") as fh:
        for n, row in enumerate(csv.reader(fh)):
            if len(row) != 3:
                raise ValueError(f"agnews/test.csv row {n}: expected 3 fields, got {len(row)}")
            cls, title, description = row
            rows.append((title + " " + description, labels[cls]))
    return rows


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Write ``<out_dir>/test.jsonl`` from ``<source_dir>/agnews/test.csv``; returns its path."""
    rows = read_test_rows(Path(source_dir))
    records = (make_record(short_id(f"agnews_test:{i}"), text, label) for i, (text, label) in enumerate(rows))
    return write_jsonl(Path(out_dir) / OUTPUT, records)
