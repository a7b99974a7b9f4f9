"""Which selected suites have their data, checked before a model is loaded, and what to tell a
user whose data folder is missing: the folders tried and, per suite, the files expected where
and the public data they come from (each suite's ``manifest.json``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from noulengine.eval.suites.paths import DATA_ENV, data_candidates, resolve_data_dir
from noulengine.eval.suites.registry import get_suite
from noulengine.eval.suites.suite import SuiteStatus


@dataclass
class DataCheck:
    """The data status of a run's selected suites.

    Attributes:
        statuses: ``{suite: SuiteStatus}`` in task order (``ready``, ``preparable``, ``changed``
            or ``unavailable``, :meth:`~noulengine.eval.suites.Suite.available`).
        tried: the data folders looked in, in order (``--source``, ``$NOULENGINE_DATA``,
            ``<repo>/../shared/data``).
        data_dir: the folder found (None: none of them exists).
    """

    statuses: dict[str, SuiteStatus]
    tried: list = field(default_factory=list)
    data_dir: object | None = None

    @property
    def missing(self) -> list[str]:
        """The suites without their data (``unavailable``), in task order."""
        return [n for n, s in self.statuses.items() if s.state == "unavailable"]

    @property
    def runnable(self) -> list[str]:
        """The suites that can run (``changed`` ones count: the runner refuses them by name)."""
        return [n for n, s in self.statuses.items() if s.state != "unavailable"]


def check_data(names: list[str], source=None) -> DataCheck:
    """Look for the data of suites ``names`` (registered names) without preparing or loading
    anything (cheap: a prepared file is re-hashed, a source file only looked for)."""
    statuses = {n: get_suite(n).available(source) for n in names}
    return DataCheck(statuses, data_candidates(source), resolve_data_dir(source))


def suite_data_help(name: str) -> str:
    """One line on where suite ``name``'s data goes and comes from: the files the preparation
    reads (relative to the data folder) and the manifest's ``download`` or ``origin`` note."""
    suite = get_suite(name)
    files = ", ".join(suite.source_files) or "(none: generated)"
    where = suite.manifest.get("download") or suite.manifest.get("origin") or "see the suite's manifest.json"
    return f"{name}: DATA/{files.replace(', ', ', DATA/')}; from {where}"


def no_data_message(check: DataCheck) -> str:
    """The error for a run none of whose suites has its data: every folder tried, how to point
    at another (``NOULENGINE_DATA``, ``--source``) and, per suite, what to put where."""
    lines = [f"error: no selected suite has its data ({', '.join(check.missing)}); nothing to evaluate.",
             "  data folders tried: " + ", ".join(f"{p} ({_how(p, check.data_dir)})" for p in check.tried),
             f"  point at your copy with {DATA_ENV}=DIR or --source DIR (DATA below); each suite expects:"]
    lines += [f"    {suite_data_help(n)}" for n in check.missing]
    lines.append("  (docs/evaluation.md#data: the expected layout; every file is checked against the manifest's "
                 "sha256)")
    return "\n".join(lines)


def _how(path, used) -> str:
    if used is not None and path == used:
        return "searched"
    return "missing" if not path.is_dir() else "not searched: an earlier one exists"


def partial_data_note(check: DataCheck) -> str:
    """The line printed at the top of a run some of whose suites lack their data."""
    return (f"data: {len(check.runnable)} of {len(check.statuses)} suites have their data "
            f"({', '.join(check.runnable)}); without it: {', '.join(check.missing)} "
            f"(reported as unavailable; data folders tried: {', '.join(str(p) for p in check.tried)}; "
            f"{DATA_ENV}=DIR or --source DIR points at another)")
