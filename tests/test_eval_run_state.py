"""A run folder's settings and invocations (issue #25, items 13, 18 and 14): run_key.json holds the
settings the engine resolved (as run.json and report.md state them), old folders still resume, an
interrupted invocation keeps its timing, and the terminal gets a summary, not the whole report."""

from __future__ import annotations

import json

import pytest

from noulengine import Engine
from tests.conftest import SHARED_DATA

pytestmark = pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.csv").is_file(), reason="shared data not present")

ARGV = ["--tasks", "agnews,jevbench_easy", "--limit", "4", "--no-progress", "--no-plots"]


def _calibration(tmp_path, readout="symbols"):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": "noulengine-calibration", "version": 1, "model": None, "readout": readout,
                                "debias": "none", "group_by": "global", "groups": {"global": {"temperature": 2.0}}}))
    return path


@pytest.fixture()
def resolved_engine(tiny_llama, tiny_tokenizer, tmp_path, monkeypatch):
    """``engine_from_args`` as ``Engine.from_pretrained`` behaves on a trained model: ``--readout auto``
    and no ``--calibration`` resolve to the model's readout and its shipped calibration."""
    from noulengine import cli

    cal = _calibration(tmp_path)
    seen = []

    def fake(args, **_):
        seen.append((args.readout, args.calibration))
        readout = "symbols" if args.readout == "auto" else args.readout
        calibration = str(cal) if args.calibration is None and readout == "symbols" else args.calibration
        if calibration == "none":
            calibration = None
        return Engine.from_model(tiny_llama, tiny_tokenizer, readout=readout, calibration=calibration)

    monkeypatch.setattr(cli, "engine_from_args", fake)
    return cal, seen


def test_run_key_holds_the_resolved_settings_that_run_json_and_the_report_state(resolved_engine, tmp_path, capsys):
    from noulengine.eval.__main__ import main

    cal, _ = resolved_engine
    out = tmp_path / "run"
    assert main(ARGV + ["--output", str(out)]) == 0  # --readout auto, no --calibration
    key = json.loads((out / "run_key.json").read_text())
    engine = json.loads((out / "run.json").read_text())["engine"]
    assert key["readout"] == engine["readout"] == "symbols"
    assert key["calibration"] == engine["calibration"] == str(cal)
    assert key["calibration_sha256"] and key["debias"] == engine["debias"] and key["dtype"] == engine["dtype"]
    report = (out / "report.md").read_text()
    assert "readout `symbols`" in report and f"calibration `{cal}`" in report
    # the same flags resume; the same settings asked for explicitly resume too (they are the same run)
    assert main(ARGV + ["--output", str(out)]) == 0
    assert main(ARGV + ["--output", str(out), "--readout", "symbols"]) == 0
    capsys.readouterr()
    # what the engine would use differently is refused, named as resolved
    assert main(ARGV + ["--output", str(out), "--calibration", "none"]) == 2
    err = capsys.readouterr().err
    assert "calibration: the folder's run has" in err and str(cal) in err and "this one None" in err
    assert main(ARGV + ["--output", str(out), "--readout", "label-sequence"]) == 2
    assert "readout: the folder's run has 'symbols', this one 'label-sequence'" in capsys.readouterr().err


def test_the_same_calibration_at_another_path_is_the_same_run(resolved_engine, tmp_path, tiny_llama, tiny_tokenizer,
                                                              monkeypatch):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    cal, _ = resolved_engine
    out = tmp_path / "run"
    assert main(ARGV + ["--output", str(out)]) == 0
    moved = tmp_path / "elsewhere.json"
    moved.write_bytes(cal.read_bytes())  # another checkout of the same model
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(
        tiny_llama, tiny_tokenizer, readout="symbols", calibration=str(moved)))
    assert main(ARGV + ["--output", str(out)]) == 0


def test_a_folder_keyed_before_settings_were_resolved_still_resumes(resolved_engine, tmp_path, capsys):
    """run_key.json files written by older code hold the flags as given (readout auto, calibration
    null): the same flags resume them (an eval started then must finish), other flags are refused."""
    from noulengine.eval.__main__ import main

    out = tmp_path / "old"
    assert main(ARGV + ["--output", str(out)]) == 0
    key = json.loads((out / "run_key.json").read_text())
    legacy = {k: key[k] for k in ("suite", "model_sha256", "debias", "dtype", "limit", "sample", "seed")}
    legacy.update(readout="auto", calibration=None)
    (out / "run_key.json").write_text(json.dumps(legacy))
    pred = out / "predictions.jsonl"
    pred.write_text("".join(pred.read_text().splitlines(keepends=True)[:-3]))  # interrupted
    capsys.readouterr()
    assert main(ARGV + ["--output", str(out), "--readout", "label-sequence"]) == 2
    assert "readout: the folder's run has 'auto', this one 'label-sequence'" in capsys.readouterr().err
    assert main(ARGV + ["--output", str(out)]) == 0
    assert len(pred.read_text().splitlines()) == 8
    assert json.loads((out / "run_key.json").read_text()) == key  # rewritten resolved


class Killed(BaseException):
    """A kill: nothing in the command catches it (as with SIGKILL, no cleanup code runs)."""


def _dying_engine(engine, *, after_calls: int, exc=Killed):
    calls = {"n": 0}
    real = engine.decide_batch

    def decide_batch(requests, **kw):
        calls["n"] += 1
        if calls["n"] > after_calls:
            raise exc()
        return real(requests, **kw)

    engine.decide_batch = decide_batch
    return engine


def test_an_interrupted_invocation_keeps_its_timing_and_the_totals_count_every_row(tiny_llama, tiny_tokenizer,
                                                                                   tmp_path, monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    out = tmp_path / "run"
    argv = ARGV + ["--output", str(out), "--chunk", "2"]
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: _dying_engine(
        Engine.from_model(tiny_llama, tiny_tokenizer), after_calls=3))
    with pytest.raises(Killed):
        main(argv)
    run = json.loads((out / "run.json").read_text())  # written as batches landed
    assert run["status"] == "running" and len(run["invocations"]) == 1
    assert run["invocations"][0]["throughput"]["requests"] == 6 == run["totals"]["requests"]
    assert run["invocations"][0]["throughput"]["inference_seconds"] > 0
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 6

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: _dying_engine(
        Engine.from_model(tiny_llama, tiny_tokenizer), after_calls=0, exc=KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C: recorded as interrupted at once
        main(argv)
    run = json.loads((out / "run.json").read_text())
    assert [i["status"] for i in run["invocations"]] == ["interrupted", "interrupted"]
    assert run["status"] == "interrupted"

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    capsys.readouterr()
    assert main(argv) == 0
    run = json.loads((out / "run.json").read_text())
    assert [i["throughput"]["requests"] for i in run["invocations"]] == [6, 0, 2]
    assert [i["status"] for i in run["invocations"]] == ["interrupted", "interrupted", "finished"]
    assert run["totals"]["requests"] == 8 and run["totals"]["invocations"] == 3 and run["status"] == "finished"
    report = (out / "report.md").read_text()
    assert "interrupted after 6 requests run in" in report and "all 3 invocations: 8 requests" in report
    assert "all 3 invocations: 8 requests" in capsys.readouterr().out


def test_a_worker_whose_run_json_says_running_is_not_merged(tiny_llama, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    out = tmp_path / "big"
    for r in (0, 1):
        assert main(ARGV + ["--output", str(out), "--worker", str(r), "--workers", "2"]) == 0
    run_json = out / "worker-1" / "run.json"
    run = json.loads(run_json.read_text())
    run_json.write_text(json.dumps({**run, "status": "running"}))
    capsys.readouterr()
    assert main(["--merge", "--workers", "2", "--output", str(out), "--no-plots"]) == 2
    assert "worker 1 has not finished: its last invocation is running" in capsys.readouterr().err
    run_json.write_text(json.dumps(run))
    assert main(["--merge", "--workers", "2", "--output", str(out), "--no-plots"]) == 0
    capsys.readouterr()
    assert main(ARGV + ["--output", str(out)]) == 2  # a merged folder is not a plain run's: the reason is named
    assert "merged_workers: the folder's run has 2, this one None" in capsys.readouterr().err


def test_eval_prints_a_summary_and_the_path_not_the_report(tiny_llama, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    from noulengine import cli

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    out = tmp_path / "run"
    assert cli.main(["eval"] + ARGV + ["--output", str(out)]) == 0  # as `noulengine eval`
    printed = capsys.readouterr().out
    assert "## Glossary" not in printed and "| suite |" not in printed
    lines = printed.splitlines()
    assert lines[0].split()[:4] == ["suite", "status", "rows", "coverage"]
    assert any(line.split()[:3] == ["agnews", "ready", "4"] for line in lines)
    assert f"wrote {out}/ (report.md" in printed and len(lines) < 10
    assert json.loads((out / "run.json").read_text())["command"].startswith("noulengine eval --tasks")


def test_eval_help_names_the_command_as_typed(capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    assert capsys.readouterr().out.startswith("usage: noulengine eval ")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m noulengine.eval ")
