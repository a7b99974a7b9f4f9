"""Every environment variable noulengine reads, declared in one place."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``NOULENGINE_CACHE``: where converted models are kept (default ``~/.cache/noulengine``)."""
    return Path(os.environ.get("NOULENGINE_CACHE") or Path.home() / ".cache" / "noulengine")


def data_dir() -> Path | None:
    """``NOULENGINE_DATA``: the raw data folder (default ``../shared/data`` beside the checkout)."""
    value = os.environ.get("NOULENGINE_DATA")
    return Path(value) if value else None


def media_root() -> Path | None:
    """``MEDIA_ROOT``: the folder relative image paths in records are read from (default: the
    records file's folder; the Python API: the working directory)."""
    value = os.environ.get("MEDIA_ROOT")
    return Path(value) if value else None


def default_device() -> str | None:
    """``NOULENGINE_DEVICE``: force a device ("cpu", "cuda", "cuda:1"); None picks CUDA then CPU."""
    return os.environ.get("NOULENGINE_DEVICE") or None


def num_threads() -> int | None:
    """``NOULENGINE_THREADS``: torch intra-op threads on CPU; None when unset or ``auto`` (then the
    commands run one thread per usable physical core, shared among ``--workers``:
    :mod:`noulengine.threads`).

    Raises:
        ValueError: neither a positive integer nor ``auto``.
    """
    value = (os.environ.get("NOULENGINE_THREADS") or "").strip()
    if not value or value.lower() == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"NOULENGINE_THREADS must be a positive integer or 'auto', got {value!r}")
    return n
