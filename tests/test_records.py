"""Canonical record rules: every rule names the record id, the field and what is wrong."""

from __future__ import annotations

import base64
import io
import json

import pytest

from noulengine.records import RecordError, load_records, parse_record
from noulengine.records.images import decode_image

CHOICE = {"type": "choice", "instructions": "Pick.", "criteria": {"a": "first", "b": None}}


def rec(**kw):
    base = {"id": "r1", "state": {"text": "hi"}, "questions": {"q": CHOICE}}
    base.update(kw)
    return base


@pytest.mark.parametrize("bad, field, words", [
    (rec(questions={}), "questions", "must not be empty"),
    (rec(questions={"q": {"type": "pick", "instructions": "x"}}), "questions.q.type", "unknown type"),
    (rec(questions={"q": {"type": "choice", "instructions": "x", "criteria": {"a": "only"}}}), "questions.q.criteria",
     "at least 2"),
    (rec(questions={"q": {"type": "score", "instructions": "x", "criteria": ["one"]}}), "questions.q.criteria",
     "at least 2"),
    (rec(questions={"q": {"type": "score", "instructions": "x", "criteria": {"1": "a", "2": "b"}}}),
     "questions.q.criteria", "exactly 0..1"),
    (rec(questions={"q": {"type": "noul", "instructions": "x", "criteria": {"maybe": "?"}}}),
     "questions.q.criteria.maybe", "true/false"),
    (rec(questions={"q": {"type": "choice", "criteria": {"a": 1, "b": 2}}}), "questions.q.instructions", "required"),
    (rec(targets={"q": {"label": "c"}}), "targets.q.label", "not a candidate"),
    (rec(targets={"zz": {"label": "a"}}), "targets.zz", "unknown question"),
    (rec(targets={"q": {"label": "a", "probabilities": {"a": 0.5, "b": 0.2}}}), "targets.q.probabilities", "sum to 1"),
    (rec(validation_role="test"), "validation_role", "expected one of"),
    (rec(questions={"q": {**CHOICE, "answer": "b"}}, targets={"q": {"label": "a"}}), "questions.q.answer",
     "contradicts"),
    (rec(state={"x": [1.0, float("nan")]}), "state.x[1]", "non-finite"),
    (rec(questions={"q": {"type": "noul", "instructions": "x", "critera": {"true": "t"}}}), "questions.q.critera",
     "unknown question key 'critera'"),
])
def test_rule_errors_name_record_field_and_rule(bad, field, words):
    with pytest.raises(RecordError) as info:
        parse_record(bad)
    err = info.value
    assert err.record_id == "r1"
    assert err.field == field
    assert words in err.rule
    assert "r1" in str(err) and field in str(err)


def test_duplicate_choice_labels_in_json_are_refused(tmp_path):
    # JSON objects cannot hold duplicate keys once parsed; the raw text can. Python keeps the last,
    # so the loader must see the text: a duplicate label is caught as "fewer options than written".
    text = '{"id": "d", "state": "s", "questions": {"q": {"type": "choice", "instructions": "x", "criteria": {"a": "1", "a": "2"}}}}'
    path = tmp_path / "dup.jsonl"
    path.write_text(text + "\n")
    result = load_records(path)
    assert len(result.errors) == 1 and "duplicate" in str(result.errors[0])


def test_score_and_noul_candidates_and_legacy_answer():
    r = parse_record(rec(questions={
        "s": {"type": "score", "instructions": "x", "criteria": {"1": "b", "0": "a", "2": "c"}},
        "n": {"type": "noul", "instructions": "x", "criteria": {"true": "yes desc", "false": "no desc"}, "answer": True},
    }, targets={"s": {"label": 2}}))
    s, n = r.request.questions
    assert s.labels == ("0", "1", "2") and s.descriptions == ("a", "b", "c")
    assert n.labels == ("no", "yes") and n.descriptions == ("no desc", "yes desc")
    assert r.targets["s"].label == "2" and r.targets["n"].label == "yes"


def test_loader_reports_every_bad_line_and_keeps_good_ones(tmp_path):
    good = json.dumps(rec())
    lines = [good, "", "\ufeff" + json.dumps(rec(id="r2")), '{"id": "r3", "state": NaN, "questions": {}}',
             json.dumps(rec(id="r4", questions={})), json.dumps(rec(id="r5")), json.dumps(rec())]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = load_records(path)
    assert [r.id for r in result.records] == ["r1", "r5"]
    assert [e.line for e in result.errors] == [2, 3, 4, 5, 7]
    messages = " | ".join(str(e) for e in result.errors)
    for words in ("blank line", "byte-order mark", "NaN is not valid JSON", "must not be empty", "duplicate id"):
        assert words in messages
    assert all(str(path) in str(e) for e in result.errors)


def test_a_line_refused_for_nan_or_a_repeated_key_names_its_id_and_field(tmp_path):
    """Issue #25 item 1: the id is readable from the text, so the error names it (and the field)."""
    lines = ['{"id": "r4", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}, '
             '"targets": {"q": {"probabilities": {"no": NaN, "yes": 0.5}}}}',
             '{"id": "r5", "state": [1, Infinity], "questions": {}}',
             '{"id": "r6", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x", "instructions": "y"}}}',
             '{"id": "r7", "state": NaN',  # not JSON even leniently: no id to name
             json.dumps(rec(id="r8"))]
    path = tmp_path / "nan.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = load_records(path)
    assert [r.id for r in result.records] == ["r8"]  # still refused
    got = [(e.line, e.record_id, e.field) for e in result.errors]
    assert got == [(1, "r4", "targets.q.probabilities.no"), (2, "r5", "state[1]"),
                   (3, "r6", "questions.q.instructions"), (4, None, None)]
    assert "record 'r4', field 'targets.q.probabilities.no': invalid JSON: NaN is not valid JSON" in str(result.errors[0])


def test_a_bom_at_the_start_of_the_file_is_dropped_once(tmp_path, caplog):
    """Issue #25 item 2: a UTF-8 BOM is not an error; the first record loads, and it is said once."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(rec()) + "\n" + json.dumps(rec(id="r2")) + "\n").encode())
    with caplog.at_level("WARNING", logger="noulengine.records"):
        result = load_records(path)
    assert [r.id for r in result.records] == ["r1", "r2"] and not result.errors
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "byte-order mark" in notes[0] and str(path) in notes[0]


def _png(w=4, h=3, frames=1):
    from PIL import Image

    buf = io.BytesIO()
    if frames == 1:
        Image.new("RGB", (w, h), "red").save(buf, format="PNG")
    else:
        ims = [Image.new("RGB", (w, h), c) for c in ("red", "blue")]
        ims[0].save(buf, format="GIF", save_all=True, append_images=ims[1:])
    return buf.getvalue()


def test_images_strict_base64_and_pillow_checks():
    data = base64.b64encode(_png()).decode()
    assert decode_image({"type": "image/png", "data": data}).data == _png()
    assert decode_image(f"data:image/png;base64,{data}").mime_type == "image/png"
    for bad, words in [({"type": "image/png", "data": data[:8] + "=" + data[9:]}, "base64"),
                       ({"type": "image/png", "data": data[:10] + "\n" + data[10:]}, "base64"),
                       ({"type": "image/png", "data": base64.b64encode(b"not an image").decode()}, "decodable"),
                       ({"type": "image/jpeg", "data": data}, "declared image/jpeg"),
                       ("/etc/passwd", "paths and remote URLs"),
                       ("https://example.com/a.png", "paths and remote URLs"),
                       ({"type": "image/gif", "data": base64.b64encode(_png(frames=2)).decode()}, "animated")]:
        with pytest.raises(RecordError) as info:
            decode_image(bad, record_id="x", field="images[0]")
        assert words in str(info.value)


def test_records_have_no_question_count_rule():
    """The 16-question cap belongs to the HTTP routes (serve --max-questions), not to records."""
    parsed = parse_record(rec(questions={f"q{i}": CHOICE for i in range(100)}))
    assert len(parsed.request.questions) == 100
    with pytest.raises(RecordError, match="must not be empty"):
        parse_record(rec(questions={}))
