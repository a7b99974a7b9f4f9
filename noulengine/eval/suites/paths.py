"""Where the repository, the benchmark folders and the shared raw data are."""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "NOULENGINE_DATA"
BENCHMARKS_ENV = "NOULENGINE_BENCHMARKS"


def repo_root() -> Path:
    """The checkout holding this package (the folder above ``noulengine/``)."""
    return Path(__file__).resolve().parents[3]


def benchmarks_root() -> Path:
    """The ``benchmarks/`` folder: ``$NOULENGINE_BENCHMARKS`` if set, else ``<repo>/benchmarks``."""
    env = os.environ.get(BENCHMARKS_ENV)
    return Path(env) if env else repo_root() / "benchmarks"


def data_candidates(source: str | Path | None = None) -> list[Path]:
    """The data folders tried, in order: ``source``, ``$NOULENGINE_DATA``, ``<repo>/../shared/data``."""
    out: list[Path] = []
    if source is not None:
        out.append(Path(source))
    env = os.environ.get(DATA_ENV)
    if env:
        out.append(Path(env))
    out.append(repo_root().parent / "shared" / "data")
    return out


def resolve_data_dir(source: str | Path | None = None) -> Path | None:
    """The raw data root, or None when no candidate exists.

    An explicit ``source`` (the ``--source`` option) wins and is never silently replaced: if it is
    given but missing, None is returned. Otherwise ``$NOULENGINE_DATA``, then ``<repo>/../shared/data``
    (the layout of a clone beside the shared folder).
    """
    if source is not None:
        p = Path(source)
        return p if p.is_dir() else None
    for p in data_candidates():
        if p.is_dir():
            return p
    return None
