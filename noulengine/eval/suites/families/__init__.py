"""JevalKit's benchmark families: each upstream format, projected onto canonical records at load.

A family's files stay as published (``prepare.py`` copies them byte for byte); this package turns
each upstream row into a :class:`~noulengine.records.schema.Record` when the suite loads. Only the
row's evidence (``state``; images where the family has them) and its questions enter the
:class:`~noulengine.records.schema.Request`; gold labels, distributions, notes, sources, licences,
tags and the family's scoring rules stay in ``Record.targets`` and ``Record.metadata`` (the rules
as ``metadata["protocol"]``, read by :class:`~noulengine.metrics.Scorer`, see
:mod:`noulengine.metrics.reference`).

Formats (a suite manifest's ``"format"``) and their modules:

* ``zh-decision-bench``: :mod:`.zh_decision_bench` (v0.2, the shared data; pinned)
* ``decisionbench``: :mod:`.decisionbench` (a local copy of the ``eval`` split)
* ``jevalt-bench``: :mod:`.jevalt` (local copies of the en/tr/de ``test.jsonl``)
* ``procedural-typed-decisions``: :mod:`.procedural_typed` (config ``all``, test split)
* ``decision-index``: :mod:`.decision_index` (a local build of the public suite)
* ``visual-decision-bench``: :mod:`.visual` (images through the vision path; video unsupported)

Each module has ``parse_item(item, *, file, context) -> Record`` for one upstream row, raising
:class:`~noulengine.records.errors.RecordError` naming the id, field and rule.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noulengine.records.errors import RecordError
from noulengine.records.loader import iter_jsonl, parse_json_line
from noulengine.records.schema import Record

if TYPE_CHECKING:
    from noulengine.eval.suites.suite import Suite

FAMILY_FORMATS = {
    "zh-decision-bench": "noulengine.eval.suites.families.zh_decision_bench",
    "decisionbench": "noulengine.eval.suites.families.decisionbench",
    "jevalt-bench": "noulengine.eval.suites.families.jevalt",
    "procedural-typed-decisions": "noulengine.eval.suites.families.procedural_typed",
    "decision-index": "noulengine.eval.suites.families.decision_index",
    "visual-decision-bench": "noulengine.eval.suites.families.visual",
}

MODEL_QUESTION_KEYS = ("type", "instructions", "criteria")  # all of a question that the model sees


def family_module(fmt: str):
    """The adapter module of a family format."""
    if fmt not in FAMILY_FORMATS:
        raise ValueError(f"unknown family format {fmt!r}; expected one of {list(FAMILY_FORMATS)}")
    return importlib.import_module(FAMILY_FORMATS[fmt])


def load_family(suite: "Suite", *, source=None) -> list[tuple[int, Record]]:
    """Every row of the suite's prepared files, in ``OUTPUT`` order, as ``(row_index, Record)``
    (row indices run on across files); every bad row is reported, none dropped.

    Raises:
        RecordError: listing up to 20 bad rows (file, line, id, field, rule).
    """
    module = family_module(suite.format)
    context = {"suite": suite.name, "manifest": suite.manifest, "prepared_dir": suite.prepared_dir}
    if getattr(module, "NEEDS_SOURCE_DIR", False):  # media files are read from the source folder
        context["source_dir"] = suite.source_dir(source)
    rows: list[tuple[int, Record]] = []
    errors: list[RecordError] = []
    index = 0
    for rel in suite.output_files:
        path = suite.prepared_dir / rel
        for line, text in iter_jsonl(path):
            try:
                rows.append((index, module.parse_item(parse_json_line(text, file=path, line=line), file=rel,
                                                      context=context)))
            except RecordError as exc:
                errors.append(exc if exc.file is not None else exc.located(path, line))
            index += 1
    if errors:
        shown = "\n".join(str(e) for e in errors[:20])
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise RecordError(f"{len(errors)} bad {suite.format} row(s):\n{shown}{more}")
    return rows


# ---------------------------------------------------------------------------------------------
# Helpers shared by the adapters.


def fail(rid, fld, rule) -> RecordError:
    return RecordError(rule, record_id=rid, field=fld)


def require_keys(item: dict, required, allowed, rid) -> None:
    """Refuse a row that lacks a required key or has one the format does not define (a renamed
    or added field must be noticed, not silently dropped)."""
    missing = [k for k in required if k not in item]
    if missing:
        raise fail(rid, missing[0], f"missing key {missing[0]!r}; rows need {list(required)}")
    unknown = [k for k in item if k not in allowed]
    if unknown:
        raise fail(rid, unknown[0], f"unknown key {unknown[0]!r}; this format's keys are {list(allowed)}")


def model_question(raw: Any, rid, fld: str) -> dict:
    """The part of an upstream question the model may see: ``type``, ``instructions``, ``criteria``."""
    if not isinstance(raw, dict):
        raise fail(rid, f"questions.{fld}", f"expected an object, got {type(raw).__name__}")
    return {k: raw[k] for k in MODEL_QUESTION_KEYS if k in raw}


def record_dict(rid, state, questions: dict, targets: dict, metadata: dict, *, images=None, category=None) -> dict:
    """A canonical record object; ``metadata`` keys must not collide with the canonical ones."""
    clash = [k for k in metadata if k in ("id", "state", "questions", "images", "targets", "validation_role",
                                          "category")]
    if clash:
        raise ValueError(f"metadata key(s) {clash} collide with canonical record keys")
    out = {"id": rid, "state": state, "questions": questions, "targets": targets, **metadata}
    if images:
        out["images"] = images
    if category is not None:
        out["category"] = category
    return out


def gold_label(qtype: str, criteria: Any, value: Any, rid, where: str) -> Any:
    """The canonical label for a family's gold value: a score level given as its index or as its level
    string becomes ``"0".."n-1"``; anything else is returned for the record parser to check.

    Args:
        where: the gold value's field path in the upstream row (named in errors).

    Raises:
        RecordError: a boolean given as a score level.
    """
    if qtype == "score":
        if isinstance(value, bool):
            raise fail(rid, where, f"a score gold answer must be a level, got {value!r}")
        if isinstance(value, int):
            return str(value)
        if isinstance(criteria, list) and value in criteria and not str(value).isdigit():
            return str(criteria.index(value))
    return value


def data_path(context: dict) -> Path:
    return Path(context["source_dir"])
