"""Procedural Typed Decisions: a local copy of config ``all``, test split, copied byte for byte
(format ``procedural-typed-decisions``, ``"local_copy": true``); canonical records are built at
load time by :mod:`noulengine.eval.suites.families.procedural_typed`.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("procedural-typed-decisions/all/test.jsonl",)
OUTPUT = ("test.jsonl",)


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy the test split unchanged to ``<out_dir>/test.jsonl``."""
    return copy_verbatim(Path(source_dir) / SOURCE_FILES[0], Path(out_dir) / OUTPUT[0])
