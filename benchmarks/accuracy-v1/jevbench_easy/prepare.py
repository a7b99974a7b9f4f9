"""Jevbench easy tier: the upstream single-question file, copied verbatim (format `jevbench`).

Records keep the upstream layout on disk (`question`, `expected`, optional `gold_probs`); the
canonical record is built at load time by :mod:`noulengine.eval.suites.jevbench`.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("jevbench/easy.jsonl", "jevbench/LICENSE.txt")
OUTPUT = "easy.jsonl"


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy ``jevbench/easy.jsonl`` byte for byte to ``<out_dir>/easy.jsonl``."""
    return copy_verbatim(Path(source_dir) / SOURCE_FILES[0], Path(out_dir) / OUTPUT)
