"""Validation files: refusal rules (roles, duplicates, leakage) and the fixed per-role subset."""

from __future__ import annotations

import json

import pytest

from noulengine.calibrate.__main__ import main as calibrate_main
from noulengine.calibrate.validation import ValidationFileError, limit_per_role, load_validation


def _row(rid, text, label="a", role="calibration", **extra):
    row = {"id": rid, "state": {"text": text},
           "questions": {"decision": {"type": "choice", "instructions": "Which?", "criteria": {"a": None, "b": None}}},
           "targets": {"decision": {"label": label}}, **extra}
    if role is not None:
        row["validation_role"] = role
    return row


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_good_file_splits_by_role(tmp_path):
    p = _write(tmp_path / "v.jsonl", [_row("c1", "one"), _row("s1", "two", role="selection"), _row("c2", "three")])
    v = load_validation([p])
    assert [r.id for _, r in v.calibration] == ["c1", "c2"] and [r.id for _, r in v.selection] == ["s1"]
    assert v.calibration[0][0] == "v"


def test_a_file_starting_with_a_bom_keeps_its_first_row(tmp_path):
    """Issue #25 item 2: calibrate no longer refuses a UTF-8 file that starts with a BOM."""
    p = tmp_path / "v.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + _write(tmp_path / "plain.jsonl", [_row("c1", "one"), _row("c2", "two")]).read_bytes())
    assert [r.id for _, r in load_validation([p]).calibration] == ["c1", "c2"]


@pytest.mark.parametrize("rows,match", [
    ([_row("s1", "x", role="selection")], "no row has validation_role 'calibration'"),
    ([_row("c1", "x"), _row("c1", "y", role="selection")], "duplicate id"),
    ([_row("c1", "x"), _row("n1", "y", role=None)], "no validation_role"),
    ([_row("c1", "same text"), _row("s1", "same text", role="selection")], "exact same state and questions"),
    ([_row("c1", "x", label=None)], "no hard gold label"),
    ([_row("c1", "x", role="training")], "validation_role"),
])
def test_refusals(tmp_path, rows, match):
    with pytest.raises(ValidationFileError, match=match):
        load_validation([_write(tmp_path / "v.jsonl", rows)])


def test_ids_shared_across_files_are_refused(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row("c1", "x")])
    b = _write(tmp_path / "b.jsonl", [_row("c1", "y", role="selection")])
    with pytest.raises(ValidationFileError, match="duplicate id 'c1'"):
        load_validation([a, b])


def test_test_file_overlap_by_id_or_content_is_refused(tmp_path):
    v = _write(tmp_path / "v.jsonl", [_row("c1", "alpha"), _row("s1", "beta", role="selection")])
    by_id = _write(tmp_path / "t1.jsonl", [_row("s1", "gamma", role=None)])
    by_text = _write(tmp_path / "t2.jsonl", [_row("t9", "beta", role=None)])
    clean = _write(tmp_path / "t3.jsonl", [_row("t9", "beta.", role=None)])  # not exact: passes (paraphrase blind)
    with pytest.raises(ValidationFileError, match="test id"):
        load_validation([v], test_paths=[by_id])
    with pytest.raises(ValidationFileError, match="exact state and questions"):
        load_validation([v], test_paths=[by_text])
    assert len(load_validation([v], test_paths=[clean]).calibration) == 1


def test_limit_per_role_is_label_balanced_and_in_file_order(tmp_path):
    rows = [_row(f"c{i}", f"t{i}", label="a" if i < 6 else "b") for i in range(8)]
    v = load_validation([_write(tmp_path / "v.jsonl", rows)])
    picked = [r.id for _, r in limit_per_role(v.calibration, 4)]
    assert picked == ["c0", "c1", "c6", "c7"]
    assert len(limit_per_role(v.calibration, None)) == 8


def test_cli_refuses_before_loading_a_model(tmp_path, capsys):
    p = _write(tmp_path / "v.jsonl", [_row("s1", "x", role="selection")])
    assert calibrate_main(["--validation", str(p), "--output", str(tmp_path / "c.json")]) == 2
    assert "no row has validation_role 'calibration'" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()
