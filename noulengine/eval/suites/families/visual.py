"""VisualDecisionBench (a local copy of the test split with its media) -> canonical records.

Upstream row (media paths relative to the release folder ``visual-decision-bench/``)::

    {"id", "state", "media": [{"type": "image" | "video", "path": "images/0001.png"}],
     "questions": {q: {"type", "instructions", "criteria"}}, "gold": {q: label | level | bool},
     ...}                                      # any other key (category, source, ...) is metadata

Projection:

* image rows: the images (read from the local copy, checked like any image: type, size, pixel
  count, still) and the state go through the engine's vision path, one pass with every question
  a branch after them; they need a vision-language model (a text-only model answers them with
  an error row, counted in coverage);
* video rows: this engine reads no video. The row stays in the suite and in coverage: every one
  of its questions is a decision counted as an error ``unsupported_modality`` (the protocol's
  ``unsupported``), whatever the engine answers to the text alone; the video is never read;
* gold: choice = a criteria key, score = the level index (or its text), noul = a boolean or
  yes/no; protocol: 15 equal-width ECE bins, NLL floor 1e-12; slices by ``modality``.
"""

from __future__ import annotations


from noulengine.eval.suites.families import data_path, fail, gold_label, model_question, record_dict
from noulengine.records.schema import Record, parse_record

FAMILY = "visual-decision-bench"
NEEDS_SOURCE_DIR = True
RELEASE_DIR = "visual-decision-bench"
PROTOCOL = {"family": FAMILY, "ece_bins": "equal-width", "n_bins": 15, "nll_floor": 1e-12}
UNSUPPORTED = "video questions are not supported: this engine reads images, not video"
_RESERVED = {"id", "state", "media", "questions", "gold", "targets", "images", "category", "validation_role"}




def parse_item(item, *, file: str, context: dict | None = None) -> Record:
    """One upstream row -> a :class:`Record` (images read from the local copy; video never read).

    Raises:
        RecordError: naming the id, field and rule (a missing or invalid image included).
    """
    if not isinstance(item, dict):
        raise fail(None, None, f"a row must be a JSON object, got {type(item).__name__}")
    rid = item.get("id")
    for key in ("id", "state", "media", "questions", "gold"):
        if key not in item:
            raise fail(rid, key, f"missing key {key!r}")
    media = item["media"]
    if not isinstance(media, list) or not media:
        raise fail(rid, "media", "media must be a non-empty list of {type, path}")
    kinds = set()
    for i, m in enumerate(media):
        if not isinstance(m, dict) or m.get("type") not in ("image", "video") or not isinstance(m.get("path"), str):
            raise fail(rid, f"media[{i}]", "each media entry is {\"type\": \"image\" | \"video\", \"path\": str}")
        kinds.add(m["type"])
    modality = "video" if "video" in kinds else "image"
    raw_q, gold = item["questions"], item["gold"]
    if not isinstance(raw_q, dict) or not raw_q or not isinstance(gold, dict):
        raise fail(rid, "questions", "questions and gold must be objects keyed by question")
    questions, targets, fields = {}, {}, {}
    for fld, raw in raw_q.items():
        questions[fld] = model_question(raw, rid, fld)
        unknown = [k for k in raw if k not in questions[fld]]
        if unknown:
            raise fail(rid, f"questions.{fld}.{unknown[0]}", f"unknown question key {unknown[0]!r}")
        if gold.get(fld) is not None:
            targets[fld] = {"label": gold_label(raw.get("type"), raw.get("criteria"), gold[fld], rid, f"gold.{fld}")}
        if modality == "video":
            fields[fld] = {"unsupported": UNSUPPORTED}
    extra = [k for k in gold if k not in raw_q]
    if extra:
        raise fail(rid, f"gold.{extra[0]}", "gold for a question the row does not ask")
    images = [m["path"] for m in media if m["type"] == "image"] if modality == "image" else []
    metadata = {k: v for k, v in item.items() if k not in _RESERVED}
    metadata = {("upstream_" + k if k in ("modality", "file", "protocol", "media") else k): v
                for k, v in metadata.items()}
    metadata.update({"modality": modality, "media": media, "file": file,
                     "protocol": {**PROTOCOL, "fields": fields}})
    root = data_path(context) / RELEASE_DIR if context and context.get("source_dir") else None
    return parse_record(record_dict(str(rid), item["state"], questions, targets, metadata, images=images),
                        media_root=root)
