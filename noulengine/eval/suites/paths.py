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
    """The data folders tried, in order. An explicit setting is the only one tried: ``source``
    (``--source``) if given, else ``$NOULENGINE_DATA`` if set; only with neither is
    ``<repo>/../shared/data`` (the layout of a clone beside the shared folder) tried."""
    if source is not None:
        return [Path(source)]
    env = os.environ.get(DATA_ENV)
    if env:
        return [Path(env)]
    return [repo_root().parent / "shared" / "data"]


def resolve_data_dir(source: str | Path | None = None) -> Path | None:
    """The raw data root, or None when the folder to use does not exist.

    An explicit setting, ``source`` (the ``--source`` option) or else ``$NOULENGINE_DATA``, is
    never silently replaced: a missing one gives None (see :func:`explicit_data_error`), never
    ``<repo>/../shared/data``.
    """
    (p,) = data_candidates(source)
    return p if p.is_dir() else None


def explicit_data_error(source: str | Path | None = None) -> str | None:
    """The one-line error for an explicit data folder that does not exist (``--source DIR`` or
    ``NOULENGINE_DATA=DIR``), naming the setting and the folder; None when there is none or it exists."""
    if source is not None:
        p, what = Path(source), f"--source {source}"
    elif os.environ.get(DATA_ENV):
        p, what = Path(os.environ[DATA_ENV]), f"{DATA_ENV}={os.environ[DATA_ENV]}"
    else:
        return None
    if p.is_dir():
        return None
    kind = "is not a folder" if p.exists() else "does not exist"
    return (f"{what}: the folder {p.resolve()} {kind}; an explicit data folder is never replaced by another "
            f"(unset it to use {repo_root().parent / 'shared' / 'data'})")


def refuse_missing_data_folder(source: str | Path | None = None) -> bool:
    """Print :func:`explicit_data_error`'s line to stderr when there is one; True when the command
    must stop (exit 2). The one check ``eval``, ``score`` and ``compare`` make before anything else."""
    import sys

    explicit = explicit_data_error(source)
    if explicit:
        print(f"error: {explicit}", file=sys.stderr)
    return explicit is not None
