"""Worker shares of a sharded evaluation: which worker owns a row, and where it writes.

``python -m noulengine.eval ... --worker R --workers N --output DIR`` runs worker ``R``'s share of
every selected suite into ``DIR/worker-R/``; ``--merge --workers N --output DIR`` checks the
worker runs and writes the merged run into ``DIR`` (:mod:`noulengine.eval.merge`).

A row's share is ``int(sha256(suite + "\\n" + id)[:16], 16) % N``: a stable hash of the row id, not
of its position, so adding rows to a suite or changing the sample moves no other row between
workers, and every process (any Python, any machine) computes the same shares. Rows without an id
hash their row index instead (``"#" + index``). Rows that share an id (toolace repeats three) land
on the same worker and are still scored one by one.

This module imports nothing of the runner's: the runner selects a worker's rows with
:func:`shard_rows`, and the merge (which scores with the runner) lives in :mod:`noulengine.eval.merge`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def shard_of(suite: str, record_id: str | None, row: int, workers: int) -> int:
    """The worker (``0 .. workers-1``) that owns a row.

    Args:
        suite: the suite name (part of the key, so suites are balanced independently).
        record_id: the row's record id; None hashes ``"#<row>"`` instead.
        row: the row index in the prepared file.
        workers: the number of workers (>= 1).
    """
    key = f"{suite}\n{record_id}" if record_id is not None else f"{suite}\n#{row}"
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:16], 16) % workers


def check_shard_args(worker: int | None, workers: int | None) -> None:
    """Raises ValueError unless both are None, or ``0 <= worker < workers``."""
    if worker is None and workers is None:
        return
    if worker is None or workers is None:
        raise ValueError("--worker and --workers go together")
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if not 0 <= worker < workers:
        raise ValueError(f"--worker must be in 0..{workers - 1} for --workers {workers}, got {worker}")


def shard_rows(suite: str, rows, worker: int, workers: int) -> list:
    """The ``(row_index, record)`` pairs of ``rows`` that belong to ``worker`` (order kept)."""
    return [(i, rec) for i, rec in rows if shard_of(suite, rec.id, i, workers) == worker]


def worker_dir(output: str | Path, worker: int) -> Path:
    """Where worker ``worker`` writes its run: ``OUTPUT/worker-<worker>``."""
    return Path(output) / f"worker-{worker}"
