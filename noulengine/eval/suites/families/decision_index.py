"""Decision Index (a local build of the public suite) -> canonical records.

Upstream row::

    {"id", "state", "questions": {q: {"type", "instructions", "criteria", "expected": value | null}}, ...}

(the expected answers may instead sit in a row-level ``"expected": {q: value | null}``). Every
other key (track, weight, source, ...) is metadata.

Projection:

* only ``state`` and the questions' ``type``/``instructions``/``criteria`` reach the model;
* ``expected`` is the hard label (choice: a criteria key; score: the level index, a digit
  string, or the level text; noul: a boolean or yes/no/true/false);
* a question whose ``expected`` is ``null`` stays in the request, is listed in the protocol's
  ``unscored`` (the report says ``{"unscored": true}`` for it: ``reference.unscored``) and counts
  in no metric, not even coverage;
* the Decision Index itself (its own aggregation over tracks and weights) is not computed here:
  the generic field accuracy is reported as a diagnostic and named as such (the protocol's
  ``diagnostic_only``), never as the index.
"""

from __future__ import annotations


from noulengine.eval.suites.families import fail, gold_label, record_dict
from noulengine.records.schema import Record, parse_record

FAMILY = "decision-index"
DIAGNOSTIC = ("the accuracy in this suite is the generic field accuracy over the questions that have an expected "
              "answer: a diagnostic, not the Decision Index (whose own aggregation is not implemented here)")
PROTOCOL = {"family": FAMILY, "ece_bins": "equal-width", "n_bins": 15, "nll_floor": 1e-12,
            "diagnostic_only": DIAGNOSTIC}
QUESTION_KEYS = ("type", "instructions", "criteria", "expected")
_RESERVED = {"id", "state", "questions", "expected", "targets", "images", "category", "validation_role"}




def parse_item(item, *, file: str, context: dict | None = None) -> Record:
    """One upstream row -> a :class:`Record`; ``expected: null`` questions are asked, never scored.

    Raises:
        RecordError: naming the id, field and rule.
    """
    if not isinstance(item, dict):
        raise fail(None, None, f"a row must be a JSON object, got {type(item).__name__}")
    rid = item.get("id")
    for key in ("id", "state", "questions"):
        if key not in item:
            raise fail(rid, key, f"missing key {key!r}")
    raw_q = item["questions"]
    if not isinstance(raw_q, dict) or not raw_q:
        raise fail(rid, "questions", "questions must be a non-empty object")
    row_expected = item.get("expected")
    if row_expected is not None and not isinstance(row_expected, dict):
        raise fail(rid, "expected", "a row-level expected must be an object keyed by question")
    questions, targets, unscored = {}, {}, []
    for fld, raw in raw_q.items():
        if not isinstance(raw, dict):
            raise fail(rid, f"questions.{fld}", f"expected an object, got {type(raw).__name__}")
        unknown = [k for k in raw if k not in QUESTION_KEYS]
        if unknown:
            raise fail(rid, f"questions.{fld}.{unknown[0]}", f"unknown question key {unknown[0]!r}")
        questions[fld] = {k: raw[k] for k in ("type", "instructions", "criteria") if k in raw}
        if "expected" in raw and row_expected is not None and fld in row_expected:
            raise fail(rid, f"questions.{fld}.expected", "expected given twice (in the question and the row)")
        value = raw["expected"] if "expected" in raw else (row_expected or {}).get(fld)
        if value is None:
            unscored.append(fld)
        else:
            targets[fld] = {"label": gold_label(raw.get("type"), raw.get("criteria"), value, rid, f"questions.{fld}.expected")}
    extra = [k for k in (row_expected or {}) if k not in questions]
    if extra:
        raise fail(rid, f"expected.{extra[0]}", "an expected answer for a question the row does not ask")
    metadata = {f"upstream_{k}" if k in ("file", "protocol", "unscored") else k: v
                for k, v in item.items() if k not in _RESERVED}
    metadata.update({"file": file, "unscored": unscored,
                     "protocol": {**PROTOCOL, "unscored": unscored}})
    return parse_record(record_dict(str(rid), item["state"], questions, targets, metadata))
