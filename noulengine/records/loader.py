"""JSONL loading of canonical records: every bad line is reported, none silently dropped."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from noulengine.records.errors import RecordError
from noulengine.records.schema import Record, parse_record


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicate_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            # Python's json keeps the last value silently; a duplicate label would vanish.
            raise ValueError(f"duplicate key {key!r} in a JSON object (duplicate labels are not allowed)")
        obj[key] = value
    return obj


def parse_json_line(text: str, *, file=None, line=None):
    """Parse one JSONL line strictly (no NaN/Infinity, no BOM, no blank line).

    Raises:
        RecordError: naming the file and line.
    """
    if text.startswith("\ufeff"):
        raise RecordError("byte-order mark (BOM) found; save the file as UTF-8 without BOM", file=file, line=line)
    if not text.strip():
        raise RecordError("blank line; JSONL needs one JSON object per line", file=file, line=line)
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
    except ValueError as exc:
        raise RecordError(f"invalid JSON: {exc}", file=file, line=line) from None
    except RecursionError:
        raise RecordError("invalid JSON: nested too deeply", file=file, line=line) from None


def iter_jsonl_lines(path: str | Path) -> Iterator[tuple[int, str | RecordError]]:
    """Yield ``(line_number, text)`` for each line of a file (1-based; trailing newline ok); a
    line that is not UTF-8 yields ``(line_number, RecordError)`` instead, so the lines after it
    are still read."""
    path = Path(path)
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield n, RecordError(f"not UTF-8: {exc}", file=path, line=n)
                continue
            yield n, text.rstrip("\n").rstrip("\r")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for each line of a UTF-8 file (1-based; trailing newline ok).

    Raises:
        RecordError: at the first line that is not UTF-8 (see :func:`iter_jsonl_lines`).
    """
    for n, text in iter_jsonl_lines(path):
        if isinstance(text, RecordError):
            raise text
        yield n, text


@dataclass
class LoadResult:
    """Records that parsed, and one :class:`RecordError` per bad line (with file and line)."""

    records: list[Record] = field(default_factory=list)
    errors: list[RecordError] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # source line of each record

    def raise_if_errors(self) -> None:
        if self.errors:
            shown = "\n".join(str(e) for e in self.errors[:20])
            more = f"\n... and {len(self.errors) - 20} more" if len(self.errors) > 20 else ""
            raise RecordError(f"{len(self.errors)} bad record(s):\n{shown}{more}")


def duplicate_id_error(seen: dict, rid, *, file, line) -> RecordError | None:
    """The error for a repeated record id, or None (recording ``rid`` as first seen on ``line``).

    Args:
        seen: id -> the line it was first seen on; updated in place.
    """
    if rid in seen:
        return RecordError(f"duplicate id (first on line {seen[rid]})", record_id=rid, field="id", file=file, line=line)
    seen[rid] = line
    return None


def load_records(path: str | Path, *, parse: Callable | None = None, check_duplicate_ids: bool = True,
                 media_root: str | Path | None = None) -> LoadResult:
    """Load canonical records from a JSONL file, collecting every bad line.

    Args:
        path: the JSONL file (UTF-8, one object per line).
        parse: the per-object parser (default :func:`parse_record` with ``media_root``).
        check_duplicate_ids: report a repeated ``id`` as an error on its later line.
        media_root: the folder relative image paths are read from (default ``MEDIA_ROOT``, else
            the file's own folder).

    Returns:
        :class:`LoadResult`; call ``raise_if_errors()`` to refuse a file with any bad line.
    """
    path = Path(path)
    if parse is None:
        from noulengine import envs

        root = media_root if media_root is not None else (envs.media_root() or path.parent)
        parse = functools.partial(parse_record, media_root=root)
    result = LoadResult()
    seen: dict[str, int] = {}
    for n, text in iter_jsonl_lines(path):
        if isinstance(text, RecordError):
            result.errors.append(text)
            continue
        try:
            rec = parse(parse_json_line(text, file=path, line=n))
        except RecordError as exc:
            result.errors.append(exc if exc.file is not None else exc.located(path, n))
            continue
        rid = getattr(rec, "id", None)
        if check_duplicate_ids and rid is not None:
            dup = duplicate_id_error(seen, rid, file=path, line=n)
            if dup is not None:
                result.errors.append(dup)
                continue
        result.records.append(rec)
        result.lines.append(n)
    return result
