"""ToolACE "which tool" decisions (310 rows): the shared canonical copy, verbatim.

Byte-identical to the published accuracy-v1 file, including its duplicate ids (e.g.
``a570fc8eef4c9147f44d5fd2`` twice): rows are keyed by 0-based row index, not id.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("toolace/test.jsonl",)
OUTPUT = "test.jsonl"


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy ``toolace/test.jsonl`` byte for byte to ``<out_dir>/test.jsonl``."""
    return copy_verbatim(Path(source_dir) / SOURCE_FILES[0], Path(out_dir) / OUTPUT)
