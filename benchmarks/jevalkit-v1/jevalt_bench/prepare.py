"""JevAlt-Bench: local copies of the English, Turkish and German ``test.jsonl``, copied byte for
byte (format ``jevalt-bench``, ``"local_copy": true``); canonical records are built at load time
by :mod:`noulengine.eval.suites.families.jevalt`. Split membership is the file.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

LANGS = ("en", "tr", "de")
SOURCE_FILES = tuple(f"jevalt-bench/{lang}/test.jsonl" for lang in LANGS)
OUTPUT = tuple(f"{lang}/test.jsonl" for lang in LANGS)


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy the three files unchanged to ``<out_dir>/<lang>/test.jsonl``; returns the first."""
    for src, dst in zip(SOURCE_FILES, OUTPUT):
        copy_verbatim(Path(source_dir) / src, Path(out_dir) / dst)
    return Path(out_dir) / OUTPUT[0]
