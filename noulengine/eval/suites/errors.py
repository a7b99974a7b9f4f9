"""Typed errors of the benchmark suites: each names the suite or file and what is wrong."""

from __future__ import annotations

from pathlib import Path

from noulengine.records.errors import NoulEngineError


class SuiteError(NoulEngineError):
    """Base class of every suite error."""


class UnknownSuiteError(SuiteError, LookupError):
    """No suite is registered under the requested name (the message suggests close names)."""

    def __init__(self, name: str, suggestions: list[str], known: list[str]):
        self.name = name
        self.suggestions = list(suggestions)
        self.known = list(known)
        hint = f"; did you mean {' or '.join(repr(s) for s in self.suggestions)}?" if self.suggestions else ""
        super().__init__(f"unknown suite {name!r}{hint} (known suites: {', '.join(self.known)})")

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return self.args[0]


class SuiteUnavailableError(SuiteError):
    """A suite cannot be prepared or loaded (its source data is absent, or it is not prepared yet)."""

    def __init__(self, suite: str, reason: str):
        self.suite = suite
        self.reason = reason
        super().__init__(f"suite {suite!r} is unavailable: {reason}")


class HashMismatchError(SuiteError):
    """A file's sha256 differs from the one pinned in a manifest.

    Attributes:
        path: the file that was hashed.
        expected: the pinned sha256.
        actual: the sha256 of the file as found.
    """

    kind = "file"

    def __init__(self, path: str | Path, expected: str, actual: str, *, hint: str = ""):
        self.path = Path(path)
        self.expected = expected
        self.actual = actual
        extra = f" {hint}" if hint else ""
        super().__init__(f"{self.kind} {self.path} has changed: manifest pins sha256 {expected}, "
                         f"file has sha256 {actual}.{extra}")


class PreparedFileChangedError(HashMismatchError):
    """A prepared benchmark file no longer matches its manifest; it is refused before inference."""

    kind = "prepared file"


class SourceFileChangedError(HashMismatchError):
    """A raw source file differs from the one the manifest was built from."""

    kind = "source file"
