"""What a new user trips on in ``noulengine eval`` (issue #34, items 1, 5, 8, 12 and 16): the
data is looked for before the model loads and a run without any exits 2 naming what goes where;
a partial set runs and says so; two runs of different settings never share the default folder;
the progress bar moves per forward pass with tokens/s; the busy-CPU hint is printed once, at the start
(issue #46 item 6: repeating it at the end repeated a stale load), and kept in run.json and report.md; a killed invocation's wall time runs to its kill or its last heartbeat."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from noulengine import Engine
from tests.conftest import REPO, SHARED_DATA, topic_request

JEV = SHARED_DATA / "jevbench"
needs_jevbench = pytest.mark.skipif(not (JEV / "easy.jsonl").is_file(), reason="shared jevbench data not present")


@pytest.fixture()
def benchmarks(tmp_path, monkeypatch):
    """A copy of accuracy-v1's suite definitions without any prepared file (a fresh clone's)."""
    root = tmp_path / "benchmarks"
    shutil.copytree(REPO / "benchmarks" / "accuracy-v1", root / "accuracy-v1",
                    ignore=shutil.ignore_patterns("prepared", "__pycache__"))
    monkeypatch.setenv("NOULENGINE_BENCHMARKS", str(root))
    return root


@pytest.fixture()
def jev_only(tmp_path):
    """A data folder holding jevbench's files only."""
    data = tmp_path / "data"
    shutil.copytree(JEV, data / "jevbench")
    return data


def _no_model(args, **_):
    raise AssertionError("the model was loaded")


def _tiny(tiny_llama, tiny_tokenizer):
    return lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer)


def test_no_data_exits_2_before_the_model_loads_naming_what_goes_where(benchmarks, tmp_path, monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("NOULENGINE_DATA", str(empty))
    monkeypatch.setattr(cli, "engine_from_args", _no_model)
    assert main(["--suite", "accuracy-v1", "--sample", "20", "--no-plots", "--output", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{empty} (searched)" in err and "shared/data (" not in err  # the explicit folder only (#46 item 4)
    assert "NOULENGINE_DATA" in err and "--source" in err
    for name, expected in [("agnews", "DATA/agnews/test.csv"), ("jevbench_hard", "DATA/jevbench/hard.jsonl"),
                           ("wildjailbreak", "DATA/wildjailbreak/raw/wildjailbreak_adv_benign_eval.jsonl, DATA/wildjailbreak/raw/wildjailbreak_eval.jsonl"),
                           ("toolace", "DATA/toolace/test.jsonl"), ("typed_decisions", "DATA/typed_decisions/test.jsonl")]:
        assert f"{name}: {expected}" in err
    assert "mhjabreel/CharCnn_Keras" in err  # where agnews comes from
    assert not (tmp_path / "r").exists()
    # an explicit --source that does not exist is named too
    assert main(["--tasks", "agnews", "--no-plots", "--source", str(tmp_path / "nowhere")]) == 2
    assert f"--source {tmp_path / 'nowhere'}: the folder" in capsys.readouterr().err


@needs_jevbench
def test_a_partial_data_set_runs_says_so_first_and_exits_by_what_was_asked(benchmarks, jev_only, tmp_path,
                                                                           tiny_llama, tiny_tokenizer, monkeypatch,
                                                                           capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", _tiny(tiny_llama, tiny_tokenizer))
    argv = ["--source", str(jev_only), "--limit", "2", "--no-plots", "--no-progress"]
    # the collection's default list: what there is data for runs, exit 0
    assert main(argv + ["--output", str(tmp_path / "a")]) == 0
    out, err = capsys.readouterr()
    top = err.splitlines()[0]
    assert top.startswith("data: 3 of 7 suites have their data (jevbench_easy, jevbench_original, jevbench_hard)")
    assert "without it: agnews, wildjailbreak, typed_decisions, toolace" in top
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["jevbench_easy"]["status"] == "ready"
    # nothing was prepared for typed_decisions: no note on a prepared file's sha256
    assert metrics["typed_decisions"]["status"] == "unavailable"
    assert not any("sha256" in n for n in metrics["typed_decisions"]["notes"])
    # --tasks named a suite without data: the others run, exit 1
    assert main(argv + ["--tasks", "agnews,jevbench_easy", "--output", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "--tasks named agnews, which had no data" in err
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["jevbench_easy"]["rows"] == 2


def test_an_unprepared_suite_reports_only_its_licence():
    from noulengine.eval.suites import get_suite

    suite = get_suite("typed_decisions")
    assert any("sha256" in n for n in suite.report_notes())
    assert suite.report_notes(prepared=False) == [f"licence: {suite.licence}"]


@needs_jevbench
def test_runs_of_different_settings_get_their_own_default_folder(benchmarks, jev_only, tmp_path, tiny_llama,
                                                                 tiny_tokenizer, monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.chdir(tmp_path)
    argv = ["--source", str(jev_only), "--tasks", "jevbench_easy", "--limit", "2", "--no-plots", "--no-progress"]
    monkeypatch.setattr(cli, "engine_from_args", _tiny(tiny_llama, tiny_tokenizer))
    assert main(argv) == 0
    first = capsys.readouterr().err.split("output: ")[1].split(" ")[0]
    # the README's comparison: the same command on another model (here another readout)
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer,
                                                                                 readout="label-sequence"))
    assert main(argv) == 0  # was: rc 2, "runs/latest holds predictions of a different run"
    second = capsys.readouterr().err.split("output: ")[1].split(" ")[0]
    assert first != second and first.startswith("runs/eval-") and second.startswith("runs/eval-")
    assert (tmp_path / first / "predictions.jsonl").is_file() and (tmp_path / second / "predictions.jsonl").is_file()
    # the same settings again: the same folder, resumed
    monkeypatch.setattr(cli, "engine_from_args", _tiny(tiny_llama, tiny_tokenizer))
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert f"output: {first} " in captured.err and "no new requests" in captured.out
    # an explicit --output is used as given
    assert main(argv + ["--output", "mine"]) == 0
    assert (tmp_path / "mine" / "run.json").is_file()


def test_the_bar_moves_per_forward_pass_with_tokens_per_second(tiny_llama, tiny_tokenizer):
    from tqdm import tqdm

    from noulengine.eval.probe import decide_with_probe
    from noulengine.eval.runner import _BatchMeter
    from noulengine.records import request_from_json

    engine = Engine.from_model(tiny_llama, tiny_tokenizer, batch_tokens=64)  # a pass or two of requests each
    requests = [request_from_json(topic_request(f"story number {i} " * (1 + i))) for i in range(8)]
    bar = tqdm(total=len(requests), file=io.StringIO())
    meter = _BatchMeter(bar, engine)
    seen = []

    def batch(n, total):
        meter.batch(n, total)
        seen.append((bar.n, bar.postfix))

    meter.start(len(requests))
    decide_with_probe(engine, requests, "reverse", progress=batch)  # probe requests count in the passes
    assert len(seen) > 2
    assert seen[-2][0] > 0 and seen[-1][0] < len(requests)  # moving before the chunk lands, never past it
    assert [n for n, _ in seen] == sorted(n for n, _ in seen)
    assert "tok/s" in seen[-1][1]
    meter.landed(len(requests))
    assert bar.n == len(requests)


@needs_jevbench
def test_eval_prints_the_busy_cpu_hint_once_and_keeps_it(benchmarks, jev_only, tmp_path, tiny_llama, tiny_tokenizer,
                                                          monkeypatch, capsys):
    from noulengine import cli, threads
    from noulengine.eval.__main__ import main

    monkeypatch.delenv("NOULENGINE_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(cli, "engine_from_args", _tiny(tiny_llama, tiny_tokenizer))
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["--source", str(jev_only), "--tasks", "jevbench_easy", "--limit", "2", "--no-plots",
                     "--no-progress", "--output", str(tmp_path / "r")]) == 0
    finally:
        torch.set_num_threads(before)  # torch's threads back to what the other tests expect
    err = capsys.readouterr().err
    assert err.count("NOULENGINE_THREADS=1") == 1  # once, read at the start (the run's own threads load it later)
    assert json.loads((tmp_path / "r" / "run.json").read_text())["cpu_busy_at_start"].startswith("note: the CPU is busy")
    report = (tmp_path / "r" / "report.md").read_text()
    assert "The CPU was already busy when this invocation started: the CPU is busy" in report
    assert report.lower().count("licence") == 1  # the Status line only, not again as a note (#46 item 7)


def test_the_heartbeat_keeps_a_killed_invocations_wall_time(tmp_path):
    from noulengine.eval.run_state import InvocationLog

    path = tmp_path / "run.json"
    log = InvocationLog(path, {"suite": "x"}, {"started": "now"})
    log.update([], force=True)
    log.start_heartbeat(0.05)
    time.sleep(0.4)
    run = json.loads(path.read_text())  # what a SIGKILL now would leave
    inv = run["invocations"][0]
    assert inv["status"] == "running" and inv["wall_s"] >= 0.3 and inv["heartbeat"]
    assert run["totals"]["wall_s"] == inv["wall_s"]
    log.stop_heartbeat()
    written = path.read_text()
    time.sleep(0.15)
    assert path.read_text() == written  # stopped: nothing more is written


@needs_jevbench
def test_a_terminated_eval_records_its_wall_time_to_the_signal(benchmarks, jev_only, tmp_path, tiny_llama_dir):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "NOULENGINE_THREADS": "1",
           "NOULENGINE_BENCHMARKS": os.environ["NOULENGINE_BENCHMARKS"]}
    cmd = [sys.executable, "-m", "noulengine.eval", "--model", str(tiny_llama_dir), "--source", str(jev_only),
           "--tasks", "jevbench", "--probe", "reverse", "--chunk", "1", "--no-plots", "--no-progress",
           "--output", str(out)]  # 231 rows one at a time: long enough to be killed mid-run
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pred = out / "predictions.jsonl"
        deadline = time.time() + 240
        while not (pred.is_file() and pred.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "no batch landed"
            time.sleep(0.2)
        landed = json.loads((out / "run.json").read_text())["invocations"][0]["wall_s"]
        time.sleep(1.5)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    run = json.loads((out / "run.json").read_text())
    inv = run["invocations"][0]
    assert run["status"] == inv["status"] == "terminated" and inv["ended"]
    assert inv["wall_s"] >= landed + 1.5  # was: the wall time at the last landed batch
    assert run["totals"]["wall_s"] == inv["wall_s"]
