"""zh-decision-bench v0.2 (public validation payload) -> canonical records.

Upstream item (one JSON object per line, kept unchanged on disk)::

    {"id", "domain", "source", "state": str, "questions": {qid: {"type", "instructions", "criteria"}},
     "gold": {qid: label | level string | bool}, "difficulty", "notes", "version"}

Projection (the upstream scorer's rules, ``src/run_eval.py`` / ``src/metrics.py``):

* the request is ``state`` and ``questions`` exactly as written (Chinese text untouched); ``id``,
  ``gold``, ``notes``, ``source``, ``domain``, ``difficulty`` and ``version`` never reach it;
* choice: candidates are the criteria keys in order; the gold is one of them;
* score: criteria is an ordered list of level strings and the gold is a level string: it maps to
  its position in the list (``"一般"`` in ``["不紧急", "一般", "紧急"]`` is level 1);
* noul: the gold is a JSON boolean; the source lists the labels ``true, false``, so its argmax
  breaks an exact tie towards ``true``: the field's protocol ``order`` is ``[1, 0]`` (engine
  labels are ``no, yes``);
* protocol: ECE over 15 equal-width bins closed on the right, NLL floor 1e-12, no test-time
  temperature refit (the upstream E2 refit on the evaluation data is not done);
* slices: ``domain`` and ``difficulty`` (record metadata).
"""

from __future__ import annotations

from noulengine.eval.suites.families import fail, model_question, record_dict, require_keys
from noulengine.records.schema import Record, parse_record

FAMILY = "zh-decision-bench"
ITEM_KEYS = ("id", "domain", "source", "state", "questions", "gold", "difficulty", "notes", "version")
PROTOCOL = {"family": FAMILY, "ece_bins": "equal-width", "n_bins": 15, "nll_floor": 1e-12, "test_time_refit": False}
NOUL_SOURCE_ORDER = [1, 0]  # source labels ["true", "false"] = engine indices of "yes", "no"


def gold_label(qtype: str, criteria, gold, rid, fld: str) -> str:
    """The engine label of one upstream gold value (see the module doc for the rules)."""
    path = f"gold.{fld}"
    if qtype == "noul":
        if not isinstance(gold, bool):
            raise fail(rid, path, f"a noul gold must be a JSON boolean, got {gold!r}")
        return "yes" if gold else "no"
    if qtype == "score":
        if not isinstance(criteria, list):
            raise fail(rid, f"questions.{fld}.criteria", "a score question's criteria must be the ordered list "
                                                         "of level strings")
        if not isinstance(gold, str) or gold not in criteria:
            raise fail(rid, path, f"a score gold must be one of the level strings {criteria}, got {gold!r}")
        return str(criteria.index(gold))
    if not isinstance(gold, str) or not isinstance(criteria, dict) or gold not in criteria:
        raise fail(rid, path, f"a choice gold must be one of the criteria keys "
                              f"{list(criteria) if isinstance(criteria, dict) else criteria}, got {gold!r}")
    return gold


def parse_item(item, *, file: str, context: dict | None = None) -> Record:
    """One upstream item -> a :class:`Record` (request: state + questions only).

    Raises:
        RecordError: naming the id, field and rule.
    """
    if not isinstance(item, dict):
        raise fail(None, None, f"an item must be a JSON object, got {type(item).__name__}")
    rid = item.get("id")
    require_keys(item, ITEM_KEYS, ITEM_KEYS, rid)
    raw_q, gold = item["questions"], item["gold"]
    if not isinstance(raw_q, dict) or not raw_q:
        raise fail(rid, "questions", "questions must be a non-empty object")
    if not isinstance(gold, dict):
        raise fail(rid, "gold", "gold must be an object keyed by question id")
    extra = [k for k in gold if k not in raw_q]
    if extra:
        raise fail(rid, f"gold.{extra[0]}", f"gold for a question the item does not ask; questions are {list(raw_q)}")
    questions, targets, fields = {}, {}, {}
    for fld, raw in raw_q.items():
        q = model_question(raw, rid, fld)
        unknown = [k for k in raw if k not in q]
        if unknown:
            raise fail(rid, f"questions.{fld}.{unknown[0]}", f"unknown question key {unknown[0]!r}")
        if fld not in gold:
            raise fail(rid, f"gold.{fld}", "every question needs a gold answer")
        questions[fld] = q
        targets[fld] = {"label": gold_label(q.get("type"), q.get("criteria"), gold[fld], rid, fld)}
        if q.get("type") == "noul":
            fields[fld] = {"order": NOUL_SOURCE_ORDER}
    metadata = {"domain": item["domain"], "difficulty": item["difficulty"], "source": item["source"],
                "notes": item["notes"], "version": item["version"], "file": file,
                "protocol": {**PROTOCOL, "fields": fields}}
    return parse_record(record_dict(rid, item["state"], questions, targets, metadata))
