"""Deterministic subsets of loaded suite rows (``(row_index, record)`` pairs)."""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")


def sample_rows(rows: Sequence[tuple[int, T]], n: int | None, seed: int) -> list[tuple[int, T]]:
    """A seeded sample of ``n`` rows, returned sorted by row index.

    The rows are first put in row-index order, so the result depends only on the set of rows,
    ``n`` and ``seed``: ``random.Random(seed).sample(sorted_rows, n)`` then sorted. ``n`` None or
    ``n >= len(rows)`` returns every row (sorted).

    Raises:
        ValueError: ``n`` is negative.
    """
    ordered = sorted(rows, key=lambda r: r[0])
    if n is None or n >= len(ordered):
        return ordered
    if n < 0:
        raise ValueError(f"sample size must be >= 0, got {n}")
    return sorted(random.Random(seed).sample(ordered, n), key=lambda r: r[0])


def limit_rows(rows: Sequence[tuple[int, T]], limit: int | None) -> list[tuple[int, T]]:
    """The first ``limit`` rows by row index (all rows when ``limit`` is None).

    Raises:
        ValueError: ``limit`` is negative.
    """
    ordered = sorted(rows, key=lambda r: r[0])
    if limit is None:
        return ordered
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return ordered[:limit]


def select_rows(rows: Sequence[tuple[int, T]], *, sample: int | None = None, seed: int = 0,
                limit: int | None = None) -> list[tuple[int, T]]:
    """Apply ``sample`` (seeded) and then ``limit``; with neither, every row in index order."""
    return limit_rows(sample_rows(rows, sample, seed), limit)
