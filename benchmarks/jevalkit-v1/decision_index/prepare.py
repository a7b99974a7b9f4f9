"""Decision Index: a local build of the public suite, copied byte for byte (format
``decision-index``, ``"local_copy": true``); canonical records are built at load time by
:mod:`noulengine.eval.suites.families.decision_index`.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("decision-index/suite.jsonl",)
OUTPUT = ("suite.jsonl",)


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy the suite unchanged to ``<out_dir>/suite.jsonl``."""
    return copy_verbatim(Path(source_dir) / SOURCE_FILES[0], Path(out_dir) / OUTPUT[0])
