"""The suite registry: discovers suite folders under ``benchmarks/`` and resolves names.

A suite is any folder ``benchmarks/<collection>/<dir>/`` holding ``prepare.py`` and
``manifest.json``; adding one needs nothing else. A collection's own ``manifest.json``
(e.g. ``benchmarks/accuracy-v1/manifest.json``) lists its default task list and groups
(``"jevbench"`` -> its three tiers).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from noulengine.eval.suites.errors import SuiteError, UnknownSuiteError
from noulengine.eval.suites.manifest import MANIFEST, read_manifest
from noulengine.eval.suites.paths import benchmarks_root
from noulengine.eval.suites.suite import Suite

DEFAULT_COLLECTION = "accuracy-v1"

_extra: dict[str, Suite] = {}


def _discover() -> dict[str, Suite]:
    found: dict[str, Suite] = {}
    root = benchmarks_root()
    if root.is_dir():
        for manifest in sorted(root.glob(f"*/*/{MANIFEST}")):
            if (manifest.parent / "prepare.py").is_file():
                suite = Suite(manifest.parent)
                if suite.name in found:
                    raise SuiteError(f"two suites are named {suite.name!r}: {found[suite.name].directory} "
                                     f"and {suite.directory}")
                found[suite.name] = suite
    found.update(_extra)
    return found


def register_suite(directory: str | Path) -> Suite:
    """Register a suite folder outside ``benchmarks/`` (it needs ``prepare.py`` + ``manifest.json``)."""
    suite = Suite(directory)
    _extra[suite.name] = suite
    return suite


def list_suites(collection: str | None = None) -> list[str]:
    """Names of every registered suite (optionally only those of one collection), sorted."""
    return sorted(n for n, s in _discover().items() if collection is None or s.version == collection)


def collection_manifest(collection: str = DEFAULT_COLLECTION) -> dict:
    """The top-level manifest of a collection (``benchmarks/<collection>/manifest.json``)."""
    path = benchmarks_root() / collection / MANIFEST
    if not path.is_file():
        raise SuiteError(f"no collection manifest at {path}")
    return read_manifest(path)


def default_tasks(collection: str = DEFAULT_COLLECTION) -> list[str]:
    """The collection's default task list (accuracy-v1: agnews, wildjailbreak, typed_decisions,
    toolace and the three jevbench tiers)."""
    return list(collection_manifest(collection)["suites"])


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    root = benchmarks_root()
    for path in sorted(root.glob(f"*/{MANIFEST}")) if root.is_dir() else []:
        groups.update(read_manifest(path).get("groups", {}))
    return groups


def _collections() -> dict[str, list[str]]:
    """Collection name -> its default task list, for every ``benchmarks/<collection>/manifest.json``
    that lists ``"suites"``."""
    out: dict[str, list[str]] = {}
    root = benchmarks_root()
    for path in sorted(root.glob(f"*/{MANIFEST}")) if root.is_dir() else []:
        suites = read_manifest(path).get("suites")
        if isinstance(suites, list):
            out[path.parent.name] = list(suites)
    return out


def _unknown(name: str, known: list[str]) -> UnknownSuiteError:
    others = [k for k in known if k != name]  # never "did you mean" the name itself
    return UnknownSuiteError(name, difflib.get_close_matches(name, others, n=3, cutoff=0.5), others)


def get_suite(name: str) -> Suite:
    """The suite registered as ``name``.

    Raises:
        UnknownSuiteError: no such suite; the message suggests close names ("did you mean ...").
        SuiteError: ``name`` is a group or a collection of suites (the message lists them; see
            :func:`resolve_suites`).
    """
    suites = _discover()
    if name in suites:
        return suites[name]
    groups, collections = _groups(), _collections()
    for kind, table in (("group", groups), ("collection", collections)):
        if name in table:
            raise SuiteError(f"{name!r} is a {kind} of suites ({', '.join(table[name])}), not one suite")
    raise _unknown(name, sorted(suites) + sorted(groups))


def resolve_suites(name: str) -> tuple[str, list[str]]:
    """What a name given as ``--suite`` stands for, as ``eval`` runs it.

    Returns:
        ``(kind, suite names)``: ``("suite", [name])`` for a suite, ``("group", members)`` for a
        group (``jevbench``), ``("collection", default tasks)`` for a collection (``accuracy-v1``).

    Raises:
        UnknownSuiteError: none of these; the message suggests close names.
    """
    suites, groups, collections = _discover(), _groups(), _collections()
    if name in suites:
        return "suite", [name]
    if name in groups:
        return "group", expand_tasks([name])
    if name in collections:
        return "collection", expand_tasks(collections[name])
    raise _unknown(name, sorted(suites) + sorted(groups) + sorted(collections))


def expand_tasks(names: list[str] | None = None, collection: str = DEFAULT_COLLECTION) -> list[str]:
    """Suite names for a task list: ``None`` -> what ``collection`` stands for (a collection's
    default list, a group's members, or one suite: ``--suite zh-decision-bench``); group names
    (``"jevbench"``) and collection names (``"jevalkit-v1"``) expand to their members; unknown names
    fail with a did-you-mean."""
    if names is None:
        return resolve_suites(collection)[1]
    suites, groups, collections = _discover(), _groups(), _collections()
    out: list[str] = []
    for name in names:
        members = groups.get(name) or (collections.get(name) if name not in suites else None) or [name]
        for member in members:
            if member not in suites:
                raise _unknown(member, sorted(suites) + sorted(groups))
            if member not in out:
                out.append(member)
    return out
