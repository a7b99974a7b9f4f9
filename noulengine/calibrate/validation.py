"""Validation files for calibration: load, split by ``validation_role``, refuse leaky files.

A validation file is canonical JSONL (see :mod:`noulengine.records.schema`) where every row
carries ``"validation_role": "calibration"`` (fits temperatures) or ``"selection"`` (scored
before and after, never fitted on). Refusal rules (each raises :class:`ValidationFileError`):

* a bad line (unparseable record) or a duplicate ``id`` in a file;
* a row without ``validation_role``;
* no ``calibration`` row at all, or a calibration row without any hard gold label;
* an ``id`` or the exact content (``state`` + questions + images, as the model sees it) shared
  between the two roles, or between the validation rows and any ``--test`` file.

Content is compared exactly (canonical JSON, sha256): a paraphrased or re-formatted duplicate is
NOT caught by these checks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from noulengine.records.errors import NoulEngineError, RecordError
from noulengine.records.loader import load_records
from noulengine.records.schema import Record, canonical_json

ROLES = ("calibration", "selection")


class ValidationFileError(NoulEngineError, ValueError):
    """A validation file breaks a refusal rule (the message names the rule, file and ids)."""


def content_key(record: Record) -> str:
    """sha256 of what the model sees: state, question specs and image bytes (ids excluded)."""
    req = record.request
    h = hashlib.sha256()
    h.update(canonical_json(req.state).encode("utf-8"))
    h.update(canonical_json([[q.field, q.spec()] for q in req.questions]).encode("utf-8"))
    for im in req.images:
        h.update(im.mime_type.encode("utf-8"))
        h.update(hashlib.sha256(im.data).digest())
    return h.hexdigest()


@dataclass
class ValidationSet:
    """The rows of one or more validation files, split by role.

    Attributes:
        calibration, selection: ``(source_name, Record)`` pairs in file order.
        files: the files read.
    """

    calibration: list[tuple[str, Record]] = field(default_factory=list)
    selection: list[tuple[str, Record]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def rows(self, role: str) -> list[tuple[str, Record]]:
        return self.calibration if role == "calibration" else self.selection


def _load(path: Path, *, check_duplicate_ids: bool) -> list[Record]:
    result = load_records(path, check_duplicate_ids=check_duplicate_ids)
    try:
        result.raise_if_errors()
    except RecordError as exc:
        raise ValidationFileError(f"{path}: {exc}") from None
    return result.records


def _shorten(items, n: int = 5) -> str:
    items = list(items)
    more = f" (and {len(items) - n} more)" if len(items) > n else ""
    return ", ".join(repr(x) for x in items[:n]) + more


def load_validation(paths, *, test_paths=()) -> ValidationSet:
    """Load validation files and apply every refusal rule in the module docstring.

    Args:
        paths: one or more validation JSONL files; ids must be unique across all of them.
        test_paths: test files whose ids and content must not appear in any validation row.

    Returns:
        A :class:`ValidationSet`; the source name of a row is its file's stem.

    Raises:
        ValidationFileError: a rule is broken.
    """
    out = ValidationSet()
    seen_ids: dict[str, str] = {}
    for path in [Path(p) for p in paths]:
        if not path.is_file():
            raise ValidationFileError(f"validation file {path} does not exist")
        out.files.append(str(path))
        records = _load(path, check_duplicate_ids=True)
        no_role = [r.id for r in records if r.validation_role is None]
        if no_role:
            raise ValidationFileError(f"{path}: {len(no_role)} row(s) have no validation_role "
                                      f"(expected 'calibration' or 'selection'): {_shorten(no_role)}")
        for rec in records:
            if rec.id in seen_ids:
                raise ValidationFileError(f"{path}: duplicate id {rec.id!r} (also in {seen_ids[rec.id]})")
            seen_ids[rec.id] = str(path)
            out.rows(rec.validation_role).append((path.stem, rec))
    if not out.calibration:
        raise ValidationFileError(f"{_shorten(out.files)}: no row has validation_role 'calibration'; "
                                  "there is nothing to fit temperatures on")
    unlabelled = [r.id for _, r in out.calibration if not any(t.label is not None for t in r.targets.values())]
    if unlabelled:
        raise ValidationFileError(f"{len(unlabelled)} calibration row(s) have no hard gold label "
                                  f"(targets.<field>.label): {_shorten(unlabelled)}")
    cal_ids = {r.id for _, r in out.calibration}
    sel_ids = {r.id for _, r in out.selection}
    cal_keys = {content_key(r): r.id for _, r in out.calibration}
    sel_keys = {content_key(r): r.id for _, r in out.selection}
    shared = sorted(cal_ids & sel_ids)
    if shared:
        raise ValidationFileError(f"id(s) used by both calibration and selection rows: {_shorten(shared)}")
    same = [(cal_keys[k], sel_keys[k]) for k in cal_keys.keys() & sel_keys.keys()]
    if same:
        raise ValidationFileError(f"{len(same)} calibration/selection pair(s) share the exact same state and "
                                  f"questions (calibration id, selection id): {_shorten(sorted(same))}")
    all_keys = {**sel_keys, **cal_keys}
    for tpath in [Path(p) for p in test_paths]:
        if not tpath.is_file():
            raise ValidationFileError(f"test file {tpath} does not exist")
        test = _load(tpath, check_duplicate_ids=False)
        ids = sorted({r.id for r in test} & seen_ids.keys())
        if ids:
            raise ValidationFileError(f"{tpath}: test id(s) also used by validation rows: {_shorten(ids)}")
        leaks = sorted((all_keys[content_key(r)], r.id) for r in test if content_key(r) in all_keys)
        if leaks:
            raise ValidationFileError(f"{tpath}: {len(leaks)} test row(s) have the exact state and questions of a "
                                      f"validation row (validation id, test id): {_shorten(leaks)}")
    return out


def limit_per_role(rows: list[tuple[str, Record]], n: int | None) -> list[tuple[str, Record]]:
    """A fixed, label-balanced subset: at most ``n`` rows per source file.

    Rows are taken in file order, round-robin over the first target's gold label (labels in order
    of first appearance), so the subset is deterministic and as balanced as the file allows.
    ``n=None`` keeps every row.
    """
    if n is None:
        return list(rows)
    if n < 1:
        raise ValueError(f"limit must be at least 1, got {n}")
    out: list[tuple[str, Record]] = []
    by_source: dict[str, dict[str | None, list[tuple[str, Record]]]] = {}
    for src, rec in rows:
        label = next((t.label for t in rec.targets.values() if t.label is not None), None)
        by_source.setdefault(src, {}).setdefault(label, []).append((src, rec))
    for buckets in by_source.values():
        queues = [list(v) for v in buckets.values()]
        taken: list[tuple[str, Record]] = []
        while len(taken) < n and any(queues):
            for q in queues:
                if q and len(taken) < n:
                    taken.append(q.pop(0))
        order = {id(r): i for i, (_, r) in enumerate(rows)}
        out.extend(sorted(taken, key=lambda sr: order[id(sr[1])]))
    return out
