"""Regression tests from a hostile-input review: odd JSON values get rule-naming errors, never
silent coercion, and one bad request never loses the others' answers."""

from __future__ import annotations

import pytest

from noulengine import Engine
from noulengine.records import RecordError, parse_record
from noulengine.records.loader import parse_json_line
from noulengine.records.schema import parse_question, request_from_json

CHOICE = {"q": {"type": "choice", "instructions": "Pick.", "criteria": {"a": None, "b": None}}}


def _score(criteria):
    return {"type": "score", "instructions": "How much?", "criteria": criteria}


@pytest.mark.parametrize("criteria", [{"0": "x", "+1": "y"}, {"0": "x", " 1": "y"}, {"0": "x", "01": "y"},
                                      {0: "x", 1.5: "y"}, {False: "x", True: "y"}])
def test_score_keys_are_not_silently_coerced(criteria):
    with pytest.raises(RecordError, match="score criteria keys must be the integers"):
        parse_question("s", _score(criteria))


def test_plain_score_keys_still_work():
    q = parse_question("s", _score({"1": "y", "0": "x"}))
    assert q.labels == ("0", "1") and q.descriptions == ("x", "y")
    assert parse_question("s", _score({0: "x", 1: "y"})).labels == ("0", "1")


def test_non_string_choice_labels_are_a_record_error():
    with pytest.raises(RecordError, match="choice labels must be strings"):
        parse_question("q", {"type": "choice", "instructions": "x", "criteria": {1: None, 2: None}})


@pytest.mark.parametrize("instructions", [{}, []])
def test_empty_instructions_object_is_refused(instructions):
    with pytest.raises(RecordError, match="must not be an empty"):
        parse_question("q", {"type": "noul", "instructions": instructions})


@pytest.mark.parametrize("key,value,field", [("images", 0, "images"), ("images", "", "images"), ("images", {}, "images"),
                                             ("targets", [], "targets"), ("category", 5, "category")])
def test_falsy_wrong_types_are_not_dropped(key, value, field):
    with pytest.raises(RecordError) as err:
        parse_record({"id": "r1", "state": "s", "questions": CHOICE, key: value})
    assert err.value.field == field and err.value.record_id == "r1"


def test_request_checks_questions_for_nan_and_id_type():
    with pytest.raises(RecordError) as err:
        request_from_json({"state": 1, "questions": {"q": {"type": "noul", "instructions": {"x": float("nan")}}}})
    assert err.value.field == "questions.q.instructions.x"
    with pytest.raises(RecordError, match="id must be a string"):
        request_from_json({"id": 5, "state": 1, "questions": CHOICE})


@pytest.mark.parametrize("obj,field", [
    ({"state": "\ud800", "questions": CHOICE}, "state"),
    ({"state": 1, "questions": {"q": {"type": "choice", "instructions": "x", "criteria": {"\udcff": None, "b": None}}}},
     "questions.q.criteria"),
])
def test_lone_surrogates_are_a_record_error(obj, field):
    with pytest.raises(RecordError) as err:
        request_from_json(obj)
    assert err.value.field == field and "surrogate" in err.value.rule


def test_surrogate_record_id_is_not_echoed():
    with pytest.raises(RecordError) as err:
        parse_record(parse_json_line('{"id": "\\ud800", "state": 1, "questions": {}}'))
    assert err.value.record_id is None and err.value.field == "id"


def test_deeply_nested_line_is_a_record_error():
    with pytest.raises(RecordError, match="nested too deeply"):
        parse_json_line("[" * 100_000 + "]" * 100_000, file="f.jsonl", line=3)


def test_unexpected_exception_in_one_request_keeps_the_others(tiny_llama, tiny_tokenizer, monkeypatch):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    good = {"id": "ok", "state": "s", "questions": CHOICE}
    bad = {"id": "bad", "state": "\ud800", "questions": CHOICE}
    out = engine.decide_batch([good, bad, {"id": "i", "state": 1, "questions": {"q": {
        "type": "choice", "instructions": "x", "criteria": {1: None, 2: None}}}}, good])
    assert [d.ok for d in out] == [True, False, False, True]
    assert out[1].error["field"] == "state" and out[2].error["field"] == "questions.q.criteria"
    # anything unforeseen raised while compiling one request is recorded on that request only
    real = engine.compiler.compile

    def flaky(req):
        if req.id == "boom":
            raise TypeError("unforeseen")
        return real(req)

    monkeypatch.setattr(engine.compiler, "compile", flaky)
    out = engine.decide_batch([good, {"id": "boom", "state": 1, "questions": CHOICE}])
    assert out[0].ok and out[1].error["error_type"] == "TypeError" and out[1].id == "boom"


def _cli(monkeypatch, tiny_llama, tiny_tokenizer, argv):
    from noulengine import cli

    loads = []
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: loads.append(1) or Engine.from_model(tiny_llama, tiny_tokenizer))
    return cli.main(["decide", "--no-progress", *argv]), loads


def test_cli_bad_utf8_line_is_one_error_row_not_a_crash(tiny_llama, tiny_tokenizer, monkeypatch, tmp_path):
    import json

    good = json.dumps({"id": "g", "state": "s", "questions": CHOICE}).encode()  # labels a, b
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join([good, b"\xff\xfe not utf-8", good.replace(b'"g"', b'"h"') + b"\r"]))  # no final newline
    out = tmp_path / "out.jsonl"
    rc, _ = _cli(monkeypatch, tiny_llama, tiny_tokenizer, ["--input", str(src), "--output", str(out)])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rc == 1 and [r["line"] for r in rows] == [1, 2, 3]
    assert rows[0]["id"] == "g" and rows[2]["id"] == "h" and not rows[0]["error"] and not rows[2]["error"]
    assert "not UTF-8" in rows[1]["error"]["message"] and rows[1]["error"]["line"] == 2


def test_cli_duplicate_id_is_an_error_row_and_the_first_is_answered(tiny_llama, tiny_tokenizer, monkeypatch, tmp_path):
    import json

    rows_in = [{"id": "a", "state": "s", "questions": CHOICE}, {"id": "b", "state": "t", "questions": CHOICE},
               {"id": "a", "state": "u", "questions": CHOICE}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows_in), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc, _ = _cli(monkeypatch, tiny_llama, tiny_tokenizer, ["--input", str(src), "--output", str(out), "--chunk", "2"])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rc == 1 and [r["line"] for r in rows] == [1, 2, 3]
    assert not rows[0]["error"] and not rows[1]["error"] and rows[0]["id"] == "a"
    err = rows[2]["error"]
    assert err["record_id"] == "a" and err["field"] == "id" and "duplicate id (first on line 1)" in err["message"]
    assert rows[2]["id"] == "a" and err["file"] == str(src) and err["line"] == 3


def test_cli_refuses_to_overwrite_its_input(tiny_llama, tiny_tokenizer, monkeypatch, capsys, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}}\n')
    rc, loads = _cli(monkeypatch, tiny_llama, tiny_tokenizer, ["--input", str(src), "--output", str(src)])
    assert rc == 2 and not loads and "would be overwritten" in capsys.readouterr().err
    assert src.read_text().startswith('{"id": "a"')


def test_load_records_keeps_going_after_a_bad_utf8_line(tmp_path):
    import json

    from noulengine.records import load_records

    good = json.dumps({"id": "r1", "state": "s", "questions": CHOICE}).encode()
    src = tmp_path / "r.jsonl"
    src.write_bytes(good + b"\n\xff\n" + good.replace(b'"r1"', b'"r2"') + b"\n")
    res = load_records(src)
    assert [r.id for r in res.records] == ["r1", "r2"] and [e.line for e in res.errors] == [2]


@pytest.mark.parametrize("argv,words", [
    (["--state", "{bad", "--questions", '{"q": {"type": "noul", "instructions": "x"}}'], "--state is not valid JSON"),
    (["--questions", '{"q": {"type": "noul", "instructions": "x"}, "q": {"type": "noul", "instructions": "y"}}'],
     "duplicate key 'q'"),
    (["--questions", '{"q": {"type": "noul", "instructions": NaN}}'], "NaN is not valid JSON"),
    (["--input", "/nonexistent/in.jsonl"], "cannot read --input"),
    (["--input", "x.jsonl", "--chunk", "0"], "--chunk must be at least 1"),
    (["--state", "nofile.json", "--questions", '{"q": {"type": "noul", "instructions": "x"}}'],
     "there is no file named 'nofile.json'"),
    (["--state", '"s"', "--questions", '{"q": {"type": "noul", "instructions": "x"}}', "--output", "/nonexistent/o.jsonl"],
     "folder /nonexistent does not exist"),
])
def test_cli_bad_arguments_exit_2_before_loading_a_model(tiny_llama, tiny_tokenizer, monkeypatch, capsys, argv, words):
    rc, loads = _cli(monkeypatch, tiny_llama, tiny_tokenizer, argv)
    assert rc == 2 and not loads and words in capsys.readouterr().err


def test_missing_model_is_exit_2_with_one_line(capsys, tmp_path):
    import argparse

    from noulengine.cli import add_engine_args, engine_from_args

    ap = argparse.ArgumentParser()
    add_engine_args(ap)
    with pytest.raises(SystemExit) as ex:
        engine_from_args(ap.parse_args(["--model", str(tmp_path / "no-such-model")]))
    assert ex.value.code == 2 and "error: --model:" in capsys.readouterr().err


def test_python_dash_m_noulengine_is_the_console_script():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "noulengine", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "decide" in proc.stdout and "serve" in proc.stdout


@pytest.mark.parametrize("command", ["decide", "eval", "calibrate", "serve"])
@pytest.mark.parametrize("flag,value,words", [
    ("--debias", "permutte", "invalid choice: 'permutte' (choose from 'none', 'permute', 'contextual')"),
    ("--readout", "symbolz", "invalid choice: 'symbolz' (choose from 'auto', 'symbols'"),
    ("--dtype", "float33", "invalid choice: 'float33' (choose from 'auto', 'float32'"),
    ("--device", "gpu", "invalid device 'gpu' (choose from cpu, cuda, cuda:N, mps)"),
    ("--use-chat-template", "maybe", "invalid value 'maybe' (choose from true, false, auto)"),
])
def test_engine_flags_are_validated_before_anything_loads(command, flag, value, words, monkeypatch, capsys):
    from noulengine import cli

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: pytest.fail("the model must not load"))
    with pytest.raises(SystemExit) as info:
        cli.main([command, flag, value])
    assert info.value.code == 2 and words in capsys.readouterr().err


def test_engine_flag_help_has_no_docstring_markup_and_shows_defaults():
    import argparse

    from noulengine.cli import add_engine_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    text = " ".join(p.format_help().split())
    assert "``" not in text and "None" not in text
    assert "(default 8192)" in text and "(default auto)" in text and "(default none)" in text


def test_cli_bom_file_loads_its_first_record_and_says_so_once(tiny_llama, tiny_tokenizer, monkeypatch, tmp_path,
                                                               caplog):
    """Issue #25 item 2: a UTF-8 BOM starts the file; the first record is answered, not an error row."""
    import json

    src = tmp_path / "in.jsonl"
    rows_in = [{"id": "a", "state": "s", "questions": CHOICE}, {"id": "b", "state": "t", "questions": CHOICE}]
    src.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows_in).encode())
    out = tmp_path / "out.jsonl"
    with caplog.at_level("WARNING", logger="noulengine.records"):
        rc, _ = _cli(monkeypatch, tiny_llama, tiny_tokenizer, ["--input", str(src), "--output", str(out)])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rc == 0 and [(r["line"], r["id"], r["error"]) for r in rows] == [(1, "a", None), (2, "b", None)]
    notes = [r.getMessage() for r in caplog.records if "byte-order mark" in r.getMessage()]
    assert len(notes) == 1 and str(src) in notes[0]


def test_cli_nan_line_is_an_error_row_naming_its_id_and_field(tiny_llama, tiny_tokenizer, monkeypatch, tmp_path):
    """Issue #25 item 1: the id and field of a NaN line are named; the line is still refused."""
    import json

    src = tmp_path / "in.jsonl"
    good = json.dumps({"id": "r1", "state": "s", "questions": CHOICE})
    bad = '{"id": "r4", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}, ' \
          '"targets": {"q": {"probabilities": {"no": NaN, "yes": 0.5}}}}'
    src.write_text(good + "\n" + bad + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc, _ = _cli(monkeypatch, tiny_llama, tiny_tokenizer, ["--input", str(src), "--output", str(out)])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rc == 1 and not rows[0]["error"] and rows[1]["id"] == "r4"
    err = rows[1]["error"]
    assert err["record_id"] == "r4" and err["field"] == "targets.q.probabilities.no" and err["line"] == 2
    assert "NaN is not valid JSON" in err["rule"] and "record 'r4'" in err["message"]
