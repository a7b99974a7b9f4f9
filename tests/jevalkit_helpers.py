"""Shared set-up of the jevalkit-v1 family tests: fixture files and a private benchmarks copy."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "jevalkit"


def read_rows(path) -> dict[str, dict]:
    """The JSONL rows of a fixture file, keyed by their ``id``."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {row["id"]: row for row in rows}


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """A private copy of the jevalkit-v1 collection (prepared copies of fixtures stay in tmp) and
    an empty data root, so a family reads only what a test puts there."""
    root = tmp_path / "benchmarks"
    shutil.copytree(REPO / "benchmarks" / "jevalkit-v1", root / "jevalkit-v1", ignore=shutil.ignore_patterns("prepared"))
    monkeypatch.setenv("NOULENGINE_BENCHMARKS", str(root))
    monkeypatch.setenv("NOULENGINE_DATA", str(tmp_path / "no-data"))
    return root
