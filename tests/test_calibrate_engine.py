"""Calibration through the engine (tiny model): fit on calibration rows, apply the file, and check
that temperatures never change an argmax, on every question type."""

from __future__ import annotations

import json

import pytest
import torch

from noulengine import Engine
from noulengine.calibrate.run import run_calibration
from noulengine.calibrate.validation import load_validation
from tests.conftest import three_question_request

WORDS = ("world sports business risk urgency trace agent tools prompt request text human_review observe "
         "continue stop benign harmful").split()


def _rows(n):
    rows = []
    for i in range(n):
        req = three_question_request(state=f"{WORDS[i % len(WORDS)]} {WORDS[(3 * i + 1) % len(WORDS)]} {i}")
        rows.append({"id": f"r{i}", **req, "validation_role": "calibration" if i % 2 == 0 else "selection",
                     "targets": {"topic": {"label": ["world", "business", "human_review", "observe"][i % 4]},
                                 "risk": {"label": str(i % 3)}, "flag": {"label": "yes" if i % 3 else "no"}}})
    return rows


@pytest.fixture(scope="module")
def calibrated(tiny_llama, tiny_tokenizer, tmp_path_factory):
    from noulengine import Engine

    tmp = tmp_path_factory.mktemp("cal")
    vfile = tmp / "val.jsonl"
    vfile.write_text("".join(json.dumps(r) + "\n" for r in _rows(24)))
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    run = run_calibration(engine, load_validation([vfile]), group_by="type+options", min_rows=5)
    path = tmp / "calibration.json"
    path.write_text(json.dumps(run.data))
    return engine, Engine.from_model(tiny_llama, tiny_tokenizer, calibration=str(path)), run


def test_file_records_identity_groups_and_metrics(calibrated):
    _, _, run = calibrated
    d = run.data
    assert d["model"] is None and d["readout"] == "auto" and d["debias"] == "none"
    assert set(d["groups"]) == {"global", "choice", "choice+4", "score", "score+3", "noul", "noul+2"}
    assert d["rows"]["calibration"] == 12 and d["rows"]["selection"] == 12
    assert d["rows"]["calibration_decisions"] == 36
    for role in ("calibration", "selection"):
        for key in ("nll", "brier", "ece", "accuracy"):
            assert d["metrics"][role]["all"]["before"][key] is not None
            assert d["metrics"][role]["all"]["after"]["accuracy"] == d["metrics"][role]["all"]["before"]["accuracy"]
    assert d["argmax_changed"] == 0 and isinstance(d["selection_nll_worse"], bool)
    for g in d["groups"].values():
        assert g["fit"] is None or {"converged", "hit_bound", "warnings"} <= set(g["fit"])


def test_selection_rows_never_touch_the_fit(calibrated):
    _, _, run = calibrated
    assert {it.record_id for it in run.calibration_items}.isdisjoint({it.record_id for it in run.selection_items})
    assert run.data["groups"]["global"]["n_rows"] == len(run.calibration_items)


def test_calibration_never_changes_an_argmax_on_any_question_type(calibrated):
    plain, cal, run = calibrated
    requests = [three_question_request(state=f"held out {w} {i}") for i, w in enumerate(WORDS[:10])]
    before = plain.decide_batch(requests)
    after = cal.decide_batch(requests)
    seen_t = set()
    for b, a in zip(before, after):
        for fld in ("topic", "risk", "flag"):
            ab, aa = b.answers[fld], a.answers[fld]
            assert aa.label == ab.label
            t = run.calibration.temperature_for(aa.type, len(aa.labels))
            assert aa.temperature == t and ab.temperature == 1.0
            seen_t.add(round(t, 12))
            assert aa.logprobs == pytest.approx(ab.logprobs)
            expected = torch.softmax(torch.tensor(aa.logprobs, dtype=torch.float64) / t, dim=0).tolist()
            assert list(aa.probabilities.values()) == pytest.approx(expected, abs=1e-12)
            if aa.type == "score":  # expected level from the calibrated probabilities
                assert aa.value == pytest.approx(sum(k * p for k, p in enumerate(expected)), abs=1e-12)
            if aa.type == "noul":
                assert aa.value == pytest.approx(expected[1], abs=1e-12)
    assert any(abs(t - 1.0) > 1e-6 for t in seen_t)  # the file really changed something


def test_extreme_temperatures_keep_the_argmax(tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine

    req = three_question_request()
    base = Engine.from_model(tiny_llama, tiny_tokenizer).decide(req)
    for t in (0.05, 20.0):
        path = tmp_path / f"t{t}.json"
        path.write_text(json.dumps({"format": "noulengine-calibration", "version": 1, "model": None,
                                    "readout": "auto", "debias": "none", "group_by": "global",
                                    "groups": {"global": {"temperature": t}}}))
        d = Engine.from_model(tiny_llama, tiny_tokenizer, calibration=str(path)).decide(req)
        for fld, a in d.answers.items():
            assert a.label == base.answers[fld].label and a.temperature == t


def test_engine_refuses_a_file_for_another_readout(tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine
    from noulengine.calibrate.file import CalibrationFileError

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "noulengine-calibration", "version": 1, "model": None,
                                "readout": "symbols", "debias": "none", "group_by": "global",
                                "groups": {"global": {"temperature": 2.0}}}))
    with pytest.raises(CalibrationFileError, match="readout 'symbols'"):
        Engine.from_model(tiny_llama, tiny_tokenizer, calibration=str(path))


def test_reliability_diagrams_are_written(calibrated, tmp_path):
    pytest.importorskip("matplotlib")
    from noulengine.calibrate.report import plot_before_after, summary_text

    _, _, run = calibrated
    paths = plot_before_after(run, tmp_path / "cal_reliability")
    assert [p.name for p in paths] == ["cal_reliability_before.png", "cal_reliability_after.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    assert "temperatures:" in summary_text(run.data)


class _FakeEngine:
    """Answers 'decision' with fixed logits read from the state: {"logits": [...]}."""

    identity = None

    def __init__(self):
        from types import SimpleNamespace

        self.config = SimpleNamespace(readout="auto", debias="none", calibration=None)

    def decide_batch(self, requests, on_error="record"):
        from types import SimpleNamespace

        return [SimpleNamespace(error=None, answers={"decision": SimpleNamespace(logprobs=r.state["logits"])})
                for r in requests]


def test_worse_selection_nll_is_flagged_loudly(tmp_path, monkeypatch, capsys):
    import noulengine.cli
    from noulengine.calibrate.__main__ import main

    rows = []
    for i in range(60):  # calibration: right but underconfident -> T < 1
        rows.append({"id": f"c{i}", "state": {"logits": [1.0, 0.0], "i": i}, "validation_role": "calibration",
                     "questions": {"decision": {"type": "choice", "instructions": "?", "criteria": {"a": None, "b": None}}},
                     "targets": {"decision": {"label": "a"}}})
    for i in range(20):  # selection: wrong -> sharper probabilities hurt
        rows.append({"id": f"s{i}", "state": {"logits": [1.0, 0.0], "j": i}, "validation_role": "selection",
                     "questions": {"decision": {"type": "choice", "instructions": "?", "criteria": {"a": None, "b": None}}},
                     "targets": {"decision": {"label": "b"}}})
    vfile = tmp_path / "v.jsonl"
    vfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = run_calibration(_FakeEngine(), load_validation([vfile]), group_by="global")
    assert run.data["selection_nll_worse"] is True
    assert any("selection NLL got worse" in w for w in run.data["warnings"])
    assert run.data["groups"]["global"]["fit"]["hit_bound"] is True  # all-correct rows push T to the lower bound

    monkeypatch.setattr(noulengine.cli, "engine_from_args", lambda args, **_: _FakeEngine())
    out = tmp_path / "cal.json"
    assert main(["--validation", str(vfile), "--output", str(out), "--no-progress", "--no-plots"]) == 3
    printed = capsys.readouterr()
    said = [ln for ln in (printed.out + printed.err).splitlines() if "nll got worse" in ln.lower()]
    assert said == [said[0]] and said[0].startswith("warning: selection NLL got worse")  # one clear line (#46 item 5)
    assert json.loads(out.read_text())["selection_nll_worse"] is True


def test_a_fallback_group_says_whose_temperature_and_on_which_rows(tmp_path):
    """Issue #46 item 5: a group under min_rows names the group whose temperature it uses, without a
    doubled quote, and says when that group was fitted on the very same rows."""
    from noulengine.calibrate.report import summary_text

    rows = [{"id": f"c{i}", "state": {"logits": [1.0, 0.0], "i": i}, "validation_role": "calibration",
             "questions": {"decision": {"type": "choice", "instructions": "?", "criteria": {"a": None, "b": None}}},
             "targets": {"decision": {"label": "a" if i % 3 else "b"}}} for i in range(30)]
    vfile = tmp_path / "v.jsonl"
    vfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = run_calibration(_FakeEngine(), load_validation([vfile]), group_by="type", min_rows=50)
    text = summary_text(run.data)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("choice"))
    assert "30 rows, under min_rows: group global's temperature, fitted on these same rows" in line
    warning = next(w for w in run.data["warnings"] if "min_rows" in w)
    assert "''" not in warning and "uses the temperature of group 'global'" in warning
    assert "(fitted on these same rows)" in warning


def test_engine_receives_temperatures_not_files(tiny_llama, tiny_tokenizer, tmp_path):
    """Issue #25: the engine takes a temperatures object; a calibration path without one is refused
    (the file is read by from_pretrained/from_model through the model loader)."""
    from noulengine.engine.engine import EngineConfig

    class Fixed:
        def temperature_for(self, qtype, num_candidates):
            return 2.0

    req = {"state": "s", "questions": {"q": {"type": "choice", "instructions": "pick",
                                                "criteria": {"a": "first", "b": "second"}}}}
    plain = Engine(tiny_llama, tiny_tokenizer, EngineConfig()).decide(req).answers["q"]
    hot = Engine(tiny_llama, tiny_tokenizer, EngineConfig(), temperatures=Fixed()).decide(req).answers["q"]
    assert hot.temperature == 2.0 and plain.temperature == 1.0
    assert max(hot.probabilities.values()) <= max(plain.probabilities.values())
    with pytest.raises(ValueError, match="receives temperatures, not files"):
        Engine(tiny_llama, tiny_tokenizer, EngineConfig(calibration=str(tmp_path / "cal.json")))
