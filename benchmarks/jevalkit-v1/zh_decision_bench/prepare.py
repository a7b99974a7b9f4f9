"""zh-decision-bench v0.2: the two public validation files, copied byte for byte (format
``zh-decision-bench``); canonical records are built at load time by
:mod:`noulengine.eval.suites.families.zh_decision_bench`.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.eval.suites.hashing import copy_verbatim

SOURCE_FILES = ("zh_decision_bench/voice_routing.jsonl", "zh_decision_bench/business_scenarios.jsonl")
OUTPUT = ("voice_routing.jsonl", "business_scenarios.jsonl")


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Copy both files unchanged into ``out_dir``; returns the first."""
    for src, dst in zip(SOURCE_FILES, OUTPUT):
        copy_verbatim(Path(source_dir) / src, Path(out_dir) / dst)
    return Path(out_dir) / OUTPUT[0]
