"""Calibration file: validation, group fallback and refusal of files made for another setup."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from noulengine.calibrate.file import CalibrationFileError, group_key, load_calibration, parse_calibration


def _data(**over):
    d = {"format": "noulengine-calibration", "version": 1, "model": {"name": "m", "path": "/m", "sha256": "abc"},
         "readout": "auto", "debias": "none", "group_by": "type+options",
         "groups": {"global": {"temperature": 2.0}, "choice": {"temperature": 1.5},
                    "choice+4": {"temperature": 1.2}}}
    d.update(over)
    return d


def _engine(sha="abc", readout="auto", debias="none"):
    identity = None if sha is None else SimpleNamespace(to_dict=lambda: {"name": "m", "path": "/m", "sha256": sha})
    return SimpleNamespace(identity=identity, config=SimpleNamespace(readout=readout, debias=debias))


def _write(tmp_path, data):
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(data))
    return p


def test_group_fallback_walks_to_the_nearest_fitted_parent(tmp_path):
    cal = load_calibration(_write(tmp_path, _data()), engine=_engine())
    assert cal.temperature_for("choice", 4) == 1.2
    assert cal.temperature_for("choice", 3) == 1.5   # choice+3 unseen -> choice
    assert cal.temperature_for("score", 5) == 2.0    # score+5 and score unseen -> global
    assert cal.to_dict()["groups"]["choice"]["temperature"] == 1.5


@pytest.mark.parametrize("group_by,expected", [("global", "global"), ("type", "noul"), ("type+options", "noul+2")])
def test_group_keys(group_by, expected):
    assert group_key(group_by, "noul", 2) == expected


def test_global_mode_uses_one_temperature():
    cal = parse_calibration(_data(group_by="global", groups={"global": {"temperature": 3.0}}))
    assert {cal.temperature_for(t, k) for t, k in [("choice", 4), ("score", 5), ("noul", 2)]} == {3.0}


@pytest.mark.parametrize("over,match", [
    ({"format": "other"}, "format"),
    ({"version": 2}, "version"),
    ({"group_by": "topic"}, "group_by"),
    ({"groups": {"choice": {"temperature": 1.0}}}, "global"),
    ({"groups": {"global": {"temperature": -1.0}}}, "finite positive"),
    ({"groups": {"global": {"temperature": None}}}, "finite positive"),
    ({"readout": None}, "readout"),
])
def test_malformed_files_are_refused(tmp_path, over, match):
    with pytest.raises(CalibrationFileError, match=match):
        load_calibration(_write(tmp_path, _data(**over)))


def test_unreadable_or_missing_file(tmp_path):
    with pytest.raises(CalibrationFileError, match="does not exist"):
        load_calibration(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CalibrationFileError, match="JSON"):
        load_calibration(tmp_path / "bad.json")


def test_refuses_another_model(tmp_path):
    with pytest.raises(CalibrationFileError, match="sha256 abc.*re-run noulengine calibrate"):
        load_calibration(_write(tmp_path, _data()), engine=_engine(sha="zzz"))


def test_refuses_a_named_model_file_for_an_unidentified_model(tmp_path):
    with pytest.raises(CalibrationFileError, match="unidentified"):
        load_calibration(_write(tmp_path, _data()), engine=_engine(sha=None))


def test_null_model_is_accepted(tmp_path):
    path = _write(tmp_path, _data(model=None))
    assert load_calibration(path, engine=_engine(sha=None)).model is None
    assert load_calibration(path, engine=_engine(sha="abc")).temperature_for("choice", 4) == 1.2


@pytest.mark.parametrize("key,value", [("readout", "symbols"), ("debias", "contextual")])
def test_refuses_another_readout_or_debias(tmp_path, key, value):
    with pytest.raises(CalibrationFileError, match=f"{key} 'auto'|{key} 'none'"):
        load_calibration(_write(tmp_path, _data()), engine=_engine(**{key: value}))
