"""Typed-Decisions all/test (400 states x 5 questions): the shared canonical copy, verbatim.

``shared/data/typed_decisions/test.jsonl`` is already in the accuracy-v1 layout. Its sha256 differs
from the published one (same characters as displayed; see SOURCE.md), which the manifest records.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("typed_decisions/test.jsonl",)
OUTPUT = "test.jsonl"


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy ``typed_decisions/test.jsonl`` byte for byte to ``<out_dir>/test.jsonl``."""
    return copy_verbatim(Path(source_dir) / SOURCE_FILES[0], Path(out_dir) / OUTPUT)
