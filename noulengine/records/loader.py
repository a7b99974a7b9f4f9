"""JSONL loading of canonical records: every bad line is reported, none silently dropped."""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from noulengine.records.errors import RecordError
from noulengine.records.schema import Record, parse_record

log = logging.getLogger("noulengine.records")
BOM = "\ufeff"


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


class _Pairs(list):
    """A JSON object as its ``(key, value)`` pairs, repeated keys kept (to locate a problem)."""


def _first_problem(node, path: str) -> str | None:
    """The dotted path of the first NaN/Infinity or repeated key under ``node`` (document order)."""
    if isinstance(node, float) and not math.isfinite(node):
        return path
    if isinstance(node, _Pairs):
        seen = set()
        for key, value in node:
            here = f"{path}.{key}" if path else str(key)
            if key in seen:
                return here
            seen.add(key)
            found = _first_problem(value, here)
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = _first_problem(value, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _locate(text: str) -> tuple[object, str | None]:
    """``(record id, field)`` of a line the strict parser refused, read by a lenient parse (NaN,
    Infinity and repeated keys allowed); ``(None, None)`` parts where the line does not tell."""
    try:
        obj = json.loads(text, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return None, None
    rid = None
    if isinstance(obj, _Pairs):
        ids = [v for k, v in obj if k == "id"]
        if ids and isinstance(ids[0], (str, int)) and not isinstance(ids[0], bool):
            rid = ids[0]
    return rid, (_first_problem(obj, "") or None)


def parse_json_line(text: str, *, file=None, line=None):
    """Parse one JSONL line strictly (no NaN/Infinity, no repeated key, no BOM, no blank line).

    A line refused only for a NaN/Infinity or a repeated key still names its record ``id`` and
    the offending field (read by a lenient parse), and is still refused.

    Raises:
        RecordError: naming the file and line (and the record id and field where readable).
    """
    if text.startswith(BOM):  # iter_jsonl_lines strips the one at the start of a file
        raise RecordError("byte-order mark (U+FEFF) at the start of a line; only a file's first line may start "
                          "with one", file=file, line=line)
    if not text.strip():
        raise RecordError("blank line; JSONL needs one JSON object per line", file=file, line=line)
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
    except ValueError as exc:
        rid, fld = _locate(text)
        raise RecordError(f"invalid JSON: {exc}", record_id=rid, field=fld, file=file, line=line) from None
    except RecursionError:
        raise RecordError("invalid JSON: nested too deeply", file=file, line=line) from None


def iter_jsonl_lines(path: str | Path) -> Iterator[tuple[int, str | RecordError]]:
    """Yield ``(line_number, text)`` for each line of a file (1-based; trailing newline ok); a
    line that is not UTF-8 yields ``(line_number, RecordError)`` instead, so the lines after it
    are still read.

    A UTF-8 byte-order mark at the start of the file is not an error: it is dropped (and logged
    once, on the ``noulengine.records`` logger) so the first record loads. A U+FEFF starting a
    later line is left in place for :func:`parse_json_line` to refuse.
    """
    path = Path(path)
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield n, RecordError(f"not UTF-8: {exc}", file=path, line=n)
                continue
            if n == 1 and text.startswith(BOM):
                text = text[1:]
                log.warning("%s: ignored the UTF-8 byte-order mark (BOM) at the start of the file", path)
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
