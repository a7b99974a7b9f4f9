"""VisualDecisionBench: a local copy of the test split, its JSONL copied byte for byte (format
``visual-decision-bench``, ``"local_copy": true``); images are read from the local copy's folder at
load time by :mod:`noulengine.eval.suites.families.visual`, videos never.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("visual-decision-bench/test.jsonl",)
OUTPUT = ("test.jsonl",)


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy the test split's rows unchanged to ``<out_dir>/test.jsonl``."""
    return copy_verbatim(Path(source_dir) / SOURCE_FILES[0], Path(out_dir) / OUTPUT[0])
