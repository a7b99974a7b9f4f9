"""Suite manifests: the file (``manifest.json``), read and written.

Hand-written fields (name, suite_version, protocol_version, format, licence, origin, notes,
published_sha256, metrics, ...) are kept; the computed fields (hashes, counts) are derived and
written back by :mod:`noulengine.eval.suites.refresh`, which needs a :class:`Suite`; this module
needs none, so :mod:`~noulengine.eval.suites.suite` imports it and not the other way round.
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST = "manifest.json"


def read_manifest(path: str | Path) -> dict:
    """Read one manifest JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_manifest(path: str | Path, manifest: dict) -> None:
    """Write a manifest as indented JSON (stable key order as given, trailing newline)."""
    Path(path).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
