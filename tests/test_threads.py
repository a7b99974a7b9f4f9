"""Torch CPU threads (issue #25, item 7): NOULENGINE_THREADS is applied by the engine and the
commands, the default fits the cores this process may use (shared among --workers), and the
count is recorded in run.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from noulengine import Engine, threads
from tests.conftest import REPO, SHARED_DATA


@pytest.fixture(autouse=True)
def keep_torch_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("NOULENGINE_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


def test_the_engine_applies_noulengine_threads(tiny_llama, tiny_tokenizer, monkeypatch):
    torch.set_num_threads(2)
    monkeypatch.setenv("NOULENGINE_THREADS", "1")
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    assert torch.get_num_threads() == 1 and engine.describe()["threads"] == 1
    monkeypatch.setenv("NOULENGINE_THREADS", "x")
    with pytest.raises(ValueError, match="NOULENGINE_THREADS must be a positive integer or 'auto', got 'x'"):
        Engine.from_model(tiny_llama, tiny_tokenizer)
    monkeypatch.delenv("NOULENGINE_THREADS")  # unset: the Python engine leaves the host program's threads
    torch.set_num_threads(2)
    Engine.from_model(tiny_llama, tiny_tokenizer)
    assert torch.get_num_threads() == 2


def test_the_default_is_the_usable_cores_shared_among_workers(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    assert threads.resolve_threads()["threads"] == 8
    assert threads.resolve_threads(4) == {"threads": 2, "source": "auto", "usable_cores": 8, "workers": 4}
    assert threads.resolve_threads(16)["threads"] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # torch's own variable, set by the user: kept
    assert threads.resolve_threads(4)["threads"] == 3 and threads.resolve_threads()["source"] == "OMP_NUM_THREADS"
    monkeypatch.setenv("NOULENGINE_THREADS", "5")
    assert threads.resolve_threads(4)["threads"] == 5 and threads.resolve_threads()["source"] == "NOULENGINE_THREADS"
    monkeypatch.setenv("NOULENGINE_THREADS", "auto")
    assert threads.resolve_threads()["source"] == "OMP_NUM_THREADS"


def test_usable_cores_follow_a_cgroup_quota(monkeypatch):
    real = threads.usable_cores()
    assert 1 <= real <= (os.cpu_count() or 1)
    monkeypatch.setattr(threads, "_cgroup_cpu_limit", lambda: 1.5)  # a container given 1.5 CPUs
    assert threads.usable_cores() == 1
    monkeypatch.setattr(threads, "_cgroup_cpu_limit", lambda: None)
    assert threads.usable_cores() >= real


def test_a_busy_cpu_gets_a_hint(monkeypatch):
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (3.1, 2.0, 1.0))
    info = {"threads": 2, "source": "auto", "usable_cores": 2, "workers": 1}
    assert "NOULENGINE_THREADS=1" in threads.busy_note(info) and "3.1 on 2 cores" in threads.busy_note(info)
    assert threads.busy_note({**info, "source": "NOULENGINE_THREADS"}) is None  # the user chose
    assert threads.busy_note({**info, "threads": 1}) is None
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert threads.busy_note(info) is None


def test_a_bad_value_ends_a_command_with_exit_2(monkeypatch, capsys):
    from noulengine.cli import main

    monkeypatch.setenv("NOULENGINE_THREADS", "0")
    assert_exit = pytest.raises(SystemExit)
    with assert_exit as exc:
        main(["decide", "--state", '"x"', "--questions", '{"q": {"type": "noul", "instructions": "?"}}'])
    assert exc.value.code == 2 and "NOULENGINE_THREADS must be a positive integer" in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.csv").is_file(), reason="shared data not present")
def test_eval_applies_and_records_the_threads(tiny_llama, tiny_tokenizer, tmp_path, monkeypatch):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    torch.set_num_threads(2)
    argv = ["--tasks", "jevbench_easy", "--limit", "2", "--no-progress", "--no-plots"]
    assert main(argv + ["--output", str(tmp_path / "w"), "--worker", "0", "--workers", "2"]) == 0
    run = json.loads((tmp_path / "w" / "worker-0" / "run.json").read_text())
    assert run["threads"] == {"threads": 1, "source": "auto", "usable_cores": 2, "workers": 2}  # two workers, 2 cores
    assert run["engine"]["threads"] == 1 and run["invocations"][0]["threads"] == 1
    monkeypatch.setenv("NOULENGINE_THREADS", "2")
    assert main(argv + ["--output", str(tmp_path / "one")]) == 0
    run = json.loads((tmp_path / "one" / "run.json").read_text())
    assert run["threads"]["threads"] == 2 and run["threads"]["source"] == "NOULENGINE_THREADS"


def test_the_timing_script_runs_each_setting_in_its_own_process():
    out = subprocess.run([sys.executable, str(REPO / "experiments" / "threads_timing.py"), "--dry-run", "--reps", "3"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["default:", "1:", "2:"]
    assert "NOULENGINE_THREADS=1" in lines[1] and "NOULENGINE_THREADS" not in lines[0]
