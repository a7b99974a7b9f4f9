"""Committed candidate adapters (``candidates/``) are hash-pinned: each folder's adapter bytes are
the ones ``candidates/README.md`` names, and the folder loads like any model folder's record."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from noulengine.models.loading import sha256_file

CANDIDATES = Path(__file__).resolve().parents[1] / "candidates"


def _pins() -> dict[str, str]:
    """``{folder name: adapter sha256}`` from candidates/README.md (a ``## `name` `` heading, then
    the first 64-hex-digit sha256 in its section)."""
    text = (CANDIDATES / "README.md").read_text(encoding="utf-8")
    pins = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        name = re.match(r"`([^`]+)`", section).group(1)
        pins[name] = re.search(r"\b[0-9a-f]{64}\b", section).group(0)
    return pins


def test_every_candidate_folder_is_pinned_in_the_readme():
    folders = sorted(p.name for p in CANDIDATES.iterdir() if p.is_dir())
    assert folders and folders == sorted(_pins())


@pytest.mark.parametrize("name", sorted(_pins()))
def test_candidate_adapter_matches_its_pin_and_records_its_run(name):
    folder = CANDIDATES / name
    assert sha256_file(folder / "adapter_model.safetensors") == _pins()[name]
    record = json.loads((folder / "training.json").read_text(encoding="utf-8"))
    # the adapter's record: the data it was trained on and the CPU numerics that make it reproducible
    assert len(record["data"]["train"]["sha256"]) == 64 and record["numerics"]["mode"] == "portable"
    assert json.loads((folder / "calibration.json").read_text(encoding="utf-8"))["groups"]
