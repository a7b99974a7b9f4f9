"""DecisionBench: a local copy of the ``eval`` split, copied byte for byte (format
``decisionbench``, ``"local_copy": true``); canonical records are built at load time by
:mod:`noulengine.eval.suites.families.decisionbench`.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("decisionbench/eval.jsonl",)
OUTPUT = ("eval.jsonl",)


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy ``decisionbench/eval.jsonl`` unchanged to ``<out_dir>/eval.jsonl``."""
    return copy_verbatim(Path(source_dir) / SOURCE_FILES[0], Path(out_dir) / OUTPUT[0])
