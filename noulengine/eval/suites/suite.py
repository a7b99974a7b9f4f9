"""One benchmark suite: a folder with ``prepare.py`` and a committed ``manifest.json``.

Layout::

    benchmarks/<collection>/<suite_dir>/prepare.py     # prepare(source_dir, out_dir) -> Path
    benchmarks/<collection>/<suite_dir>/manifest.json  # pins source + prepared sha256, counts, licence
    benchmarks/<collection>/<suite_dir>/prepared/      # git-ignored output, rebuilt deterministically
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from noulengine.eval.suites.errors import (PreparedFileChangedError, SourceFileChangedError, SuiteError,
                                           SuiteUnavailableError)
from noulengine.eval.suites.hashing import check_hash, sha256_file
from noulengine.eval.suites.manifest import MANIFEST, read_manifest
from noulengine.eval.suites.paths import data_candidates, resolve_data_dir
from noulengine.records.errors import RecordError
from noulengine.records.loader import iter_jsonl, load_records, parse_json_line
from noulengine.records.schema import Record

FORMATS = ("canonical", "jevbench")  # plus the benchmark families' formats (noulengine.eval.suites.families)


@dataclass(frozen=True)
class SuiteStatus:
    """Whether a suite can be used, and why not.

    ``state`` is ``"ready"`` (prepared and verified), ``"preparable"`` (source data present, not
    prepared yet), ``"changed"`` (a prepared or source file differs from the manifest) or
    ``"unavailable"`` (no prepared file and no source data). Report an unavailable suite as such,
    never as a score of zero.
    """

    name: str
    state: str
    reason: str

    @property
    def available(self) -> bool:
        """True when the suite can be loaded (possibly after preparing it)."""
        return self.state in ("ready", "preparable")

    def __bool__(self) -> bool:
        return self.available

    def to_dict(self) -> dict:
        return {"suite": self.name, "available": self.available, "state": self.state, "reason": self.reason}


class Suite:
    """A registered suite.

    Attributes:
        name: registry name (``manifest["name"]``).
        version: the collection version, e.g. ``"accuracy-v1"``.
        directory: the suite folder (holds ``prepare.py`` and ``manifest.json``).
        manifest: the parsed manifest.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory / MANIFEST)
        self.name: str = self.manifest["name"]
        self.version: str = self.manifest["suite_version"]
        from noulengine.eval.suites.families import FAMILY_FORMATS

        if self.format not in FORMATS + tuple(FAMILY_FORMATS):
            raise SuiteError(f"suite {self.name!r}: unknown format {self.format!r}; expected one of "
                             f"{FORMATS + tuple(FAMILY_FORMATS)}")
        self._module: ModuleType | None = None

    def __repr__(self) -> str:
        return f"Suite({self.name!r}, version={self.version!r})"

    # -- description --------------------------------------------------------------------------

    @property
    def format(self) -> str:
        """``"canonical"`` (records on disk), ``"jevbench"`` (upstream items, adapted at load) or a
        benchmark family's upstream format (``"zh-decision-bench"``, ``"decisionbench"``, ...; see
        :mod:`noulengine.eval.suites.families`), adapted at load."""
        return self.manifest.get("format", "canonical")

    @property
    def local_copy(self) -> bool:
        """True for a suite read from a user's local copy of a release this project does not pin
        (manifest ``"local_copy": true``): it is copied from ``--source`` at every load, its
        sha256 is recorded (:meth:`prepared_pins`) but checked against nothing, and without its
        source it is unavailable (an earlier copy is never reused)."""
        return bool(self.manifest.get("local_copy"))

    @property
    def module(self) -> ModuleType:
        """The suite's ``prepare.py``, imported from its file."""
        if self._module is None:
            path = self.directory / "prepare.py"
            spec = importlib.util.spec_from_file_location(f"noulengine_suite_{self.directory.name}", path)
            if spec is None or spec.loader is None:
                raise SuiteError(f"suite {self.name!r}: cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._module = module
        return self._module

    @property
    def source_files(self) -> tuple[str, ...]:
        """Raw files (relative to the data root) the preparation reads."""
        return tuple(self.module.SOURCE_FILES)

    @property
    def output_files(self) -> tuple[str, ...]:
        """Prepared files (relative to :attr:`prepared_dir`)."""
        out = self.module.OUTPUT
        return (out,) if isinstance(out, str) else tuple(out)

    @property
    def prepared_dir(self) -> Path:
        """The git-ignored folder holding the prepared files."""
        return self.directory / "prepared"

    @property
    def prepared_path(self) -> Path:
        """The prepared file evaluation reads."""
        return self.prepared_dir / self.output_files[0]

    @property
    def licence(self) -> str:
        """The licence line from the data's SOURCE.md, to repeat in reports."""
        return self.manifest.get("licence", "unknown")

    @property
    def slices(self) -> tuple[str, ...]:
        """Record metadata keys the report slices this suite by as well (manifest ``"slices"``,
        e.g. ``["level"]``), beside the built-in type, field and category slices."""
        return tuple(self.manifest.get("slices", ()))

    def report_notes(self, *, prepared: bool = True) -> list[str]:
        """Notes every report on this suite must repeat (licence, hash caveats, ...).

        Args:
            prepared: False for a suite reported unavailable: only the licence; the notes on the
                prepared copy (its sha256 against the published one, its ids) are left out, as no
                file was prepared to have them.
        """
        notes = [f"licence: {self.licence}"]
        if not prepared:
            return notes
        if self.manifest.get("differs_from_published"):
            notes.append(f"the prepared file's sha256 {self.manifest.get('sha256')} differs from the published "
                         f"accuracy-v1 sha256 {self.manifest.get('published_sha256')}")
        notes.extend(self.manifest.get("report_notes", []))
        return notes

    def metric_availability(self) -> dict[str, str]:
        """Which metrics this suite supports: ``{"accuracy": ..., "tvd": ...}`` -> "available" or a reason."""
        counts = self.manifest.get("counts", {})
        out = {}
        if counts.get("hard_label_decisions", 0) > 0:
            out["accuracy"] = "available"
        else:
            out["accuracy"] = "unavailable: no hard labels (" + self.manifest.get("no_hard_labels_reason", "none in data") + ")"
        if counts.get("probability_target_decisions", 0) > 0:
            out["tvd"] = "available"
        else:
            out["tvd"] = "unavailable: " + self.manifest.get("no_probabilities_reason", "no gold probabilities in this data")
        return out

    # -- preparation and verification ---------------------------------------------------------

    def source_dir(self, source: str | Path | None = None) -> Path:
        """The raw data root for this suite.

        Raises:
            SuiteUnavailableError: no data root, or a source file is missing.
        """
        data = resolve_data_dir(source)
        if data is None and not self.source_files:
            return self.directory  # a procedural suite reads no data
        if data is None:
            tried = ", ".join(str(p) for p in data_candidates(source))
            raise SuiteUnavailableError(self.name, self._unavailable_reason(
                f"no data folder found (tried {tried}; set NOULENGINE_DATA or pass source=)"))
        missing = [rel for rel in self.source_files if not (data / rel).is_file()]
        if missing:
            raise SuiteUnavailableError(self.name, self._unavailable_reason(
                f"source data absent under {data}: {', '.join(missing)}"))
        return data

    def _pins(self, key: str) -> dict[str, str]:
        return {e["path"]: e["sha256"] for e in self.manifest.get(key, [])}

    def prepared_pins(self) -> dict[str, str]:
        """The manifest's sha256 of each prepared file, by path (what a run records and a merge compares);
        for a :attr:`local_copy` suite, the sha256 of the copy its last load read."""
        if self.local_copy:
            return {rel: sha256_file(self.prepared_dir / rel) for rel in self.output_files
                    if (self.prepared_dir / rel).is_file()}
        return self._pins("prepared_files")

    def _unavailable_reason(self, reason: str) -> str:
        download = self.manifest.get("download")
        return f"{reason}; {download}" if download else reason

    def prepare(self, source: str | Path | None = None, force: bool = False, *, check_pins: bool = True) -> Path:
        """Build the prepared file(s) from raw data and check them against the manifest.

        Args:
            source: the raw data root; default ``$NOULENGINE_DATA``, else ``<repo>/../shared/data``.
            force: rebuild even when a prepared file exists (without it, an existing file is
                only verified, and a changed one refused).
            check_pins: check source and output hashes (off only when refreshing the manifest).

        Returns:
            The prepared file path.

        Raises:
            SuiteUnavailableError: the source data is absent.
            SourceFileChangedError: a raw file differs from the one pinned.
            PreparedFileChangedError: the preparation did not reproduce the pinned file.
        """
        if self.local_copy:
            check_pins = False  # nothing to check against: the copy's sha256 is recorded, not compared
            force = True  # always the source's current bytes, never an earlier copy
        if not force and check_pins and self.prepared_path.is_file():
            return self.verify()  # a changed file is refused; prepare(force=True) rebuilds it
        data = self.source_dir(source)
        if check_pins:
            for rel, expected in self._pins("source_files").items():
                check_hash(data / rel, expected, SourceFileChangedError,
                           hint=f"Suite {self.name!r} was pinned to a different copy of its raw data.")
        self.prepared_dir.mkdir(parents=True, exist_ok=True)
        self.module.prepare(data, self.prepared_dir)
        if check_pins:
            for rel, expected in self.prepared_pins().items():
                check_hash(self.prepared_dir / rel, expected, PreparedFileChangedError,
                           hint=f"Preparing suite {self.name!r} did not reproduce the pinned file.")
        return self.prepared_path

    def verify(self) -> Path:
        """Re-hash the prepared file(s) against the manifest; call before any inference.

        Returns:
            The verified prepared file path.

        Raises:
            SuiteUnavailableError: not prepared yet.
            PreparedFileChangedError: a prepared file changed (names file, expected and actual sha256).
        """
        if self.local_copy:
            missing = [rel for rel in self.output_files if not (self.prepared_dir / rel).is_file()]
            if missing:
                raise SuiteUnavailableError(self.name, f"not prepared: {', '.join(missing)} missing under "
                                                       f"{self.prepared_dir}; run prepare()")
            return self.prepared_path
        pins = self.prepared_pins()
        if not pins:
            raise SuiteError(f"suite {self.name!r}: its manifest pins no prepared file")
        for rel, expected in pins.items():
            path = self.prepared_dir / rel
            if not path.is_file():
                raise SuiteUnavailableError(self.name, f"not prepared: {path} is missing; run prepare()")
            check_hash(path, expected, PreparedFileChangedError,
                       hint=f"Refusing suite {self.name!r}; re-run prepare(force=True) to rebuild it.")
        return self.prepared_path

    def available(self, source: str | Path | None = None) -> SuiteStatus:
        """The suite's status (never raises for missing or changed data)."""
        if self.local_copy:
            try:
                data = self.source_dir(source)
            except SuiteUnavailableError as exc:
                return SuiteStatus(self.name, "unavailable", exc.reason)
            return SuiteStatus(self.name, "preparable", f"local copy found under {data} (not pinned by this project: "
                                                        "its sha256 is recorded in run.json, not checked)")
        if self.prepared_path.is_file():
            try:
                self.verify()
                return SuiteStatus(self.name, "ready", f"prepared file verified: {self.prepared_path}")
            except PreparedFileChangedError as exc:
                return SuiteStatus(self.name, "changed", str(exc))
        try:
            data = self.source_dir(source)
        except SuiteUnavailableError as exc:
            return SuiteStatus(self.name, "unavailable", exc.reason)
        for rel, expected in self._pins("source_files").items():
            actual = sha256_file(data / rel)
            if actual != expected:
                return SuiteStatus(self.name, "changed", str(SourceFileChangedError(data / rel, expected, actual)))
        return SuiteStatus(self.name, "preparable", f"not prepared yet; source data found under {data}")

    # -- loading ------------------------------------------------------------------------------

    def load(self, *, source: str | Path | None = None, auto_prepare: bool = True,
             verify: bool = True) -> list[tuple[int, Record]]:
        """Load the suite as ``(row_index, Record)`` pairs (0-based row of the prepared file).

        The prepared file is verified first (a changed file is refused, never rebuilt silently);
        a missing one is prepared when ``auto_prepare``. Rows are keyed by index, not id: some
        published files repeat ids.

        Raises:
            SuiteUnavailableError, PreparedFileChangedError, RecordError.
        """
        if self.local_copy and auto_prepare:
            self.prepare(source=source)  # a fresh copy of the source every time
        elif auto_prepare and not self.prepared_path.is_file():
            self.prepare(source=source)
        if verify:
            self.verify()
        if self.format == "jevbench":
            return self._load_jevbench()
        if self.format != "canonical":
            from noulengine.eval.suites.families import load_family

            return load_family(self, source=source)
        # a suite's image paths are relative to its own prepared folder, whatever MEDIA_ROOT says
        result = load_records(self.prepared_path, check_duplicate_ids=False, media_root=self.prepared_dir)
        result.raise_if_errors()
        return [(line - 1, rec) for line, rec in zip(result.lines, result.records)]

    def _load_jevbench(self) -> list[tuple[int, Record]]:
        from noulengine.eval.suites.jevbench import parse_jevbench

        tier = self.manifest.get("tier")
        rows, errors = [], []
        for line, text in iter_jsonl(self.prepared_path):
            try:
                rows.append((line - 1, parse_jevbench(parse_json_line(text, file=self.prepared_path, line=line),
                                                      tier=tier)))
            except RecordError as exc:
                errors.append(exc if exc.file is not None else exc.located(self.prepared_path, line))
        if errors:
            raise RecordError(f"{len(errors)} bad jevbench item(s):\n" + "\n".join(str(e) for e in errors[:20]))
        return rows

    def describe(self) -> dict:
        """A JSON-able summary: name, version, licence, counts and metric availability."""
        return {"name": self.name, "version": self.version, "format": self.format, "licence": self.licence,
                "counts": self.manifest.get("counts", {}), "metrics": self.metric_availability(),
                "notes": self.report_notes()}


def dumps_status(statuses) -> str:
    """JSON lines of :class:`SuiteStatus` dicts (for CLIs and reports)."""
    return "\n".join(json.dumps(s.to_dict()) for s in statuses)
