"""File hashing and counting helpers shared by suites, manifests and the validation builder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from noulengine.eval.suites.errors import HashMismatchError


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def short_id(key: str) -> str:
    """A stable 24-hex id: the first 24 hex characters of sha256 of ``key``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def count_lines(path: str | Path) -> int:
    """Number of newline-terminated lines in a file."""
    with Path(path).open("rb") as fh:
        return sum(1 for _ in fh)


def file_entry(path: Path, rel: str) -> dict:
    """A manifest entry ``{path, sha256, bytes}`` for one file."""
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def check_hash(path: Path, expected: str, error: type[HashMismatchError] = HashMismatchError, hint: str = "") -> None:
    """Raise ``error`` (naming the file, expected and actual sha256) when the file's hash differs."""
    actual = sha256_file(path)
    if actual != expected:
        raise error(path, expected, actual, hint=hint)


def dumps_compact(obj) -> str:
    """Compact JSON as written in prepared files: ``,``/``:`` separators, non-ASCII kept."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: Path, records) -> Path:
    """Write records as compact JSONL (LF, trailing newline) atomically; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8", newline="\n") as fh:
        for rec in records:
            fh.write(dumps_compact(rec))
            fh.write("\n")
    tmp.replace(path)
    return path


def copy_verbatim(src: Path, dst: Path) -> Path:
    """Copy a file byte for byte (atomically); returns ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_bytes(Path(src).read_bytes())
    tmp.replace(dst)
    return dst
