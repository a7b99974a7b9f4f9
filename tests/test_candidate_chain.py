"""``scripts/candidate_chain.py`` (issue #45's chain as one resumable job) and SIGTERM passing
through ``scripts/train_default.py``: which steps a given state runs, and pausing, without training."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts")]

import candidate_chain  # noqa: E402
import train_default  # noqa: E402

# a child that says it is ready, then pauses on SIGTERM with the trainer's resumable status
PAUSING_CHILD = ("import signal, sys, time, pathlib; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); "
                 "pathlib.Path(sys.argv[1]).write_text('ready'); time.sleep(60); sys.exit(0)")


def _sigterm_self_when(ready: Path) -> threading.Thread:
    def go():
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_sigterm_to_the_recipe_reaches_its_child(tmp_path):
    """Killing scripts/train_default.py pauses `noulengine train` (its child) instead of orphaning it."""
    ready, before = tmp_path / "ready", signal.getsignal(signal.SIGTERM)
    _sigterm_self_when(ready)
    t0 = time.monotonic()
    rc = train_default.run([sys.executable, "-c", PAUSING_CHILD, str(ready)], ok=(0, 75))
    assert rc == 75 and time.monotonic() - t0 < 30
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back


def _plan(tmp_path, monkeypatch, capsys) -> list[str]:
    monkeypatch.setattr(candidate_chain, "REPO", tmp_path)
    assert candidate_chain.main(["--plan"]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("+ ")]


def test_plan_skips_what_is_done_and_resumes_what_is_paused(tmp_path, monkeypatch, capsys):
    # a fresh clone: the committed checkpoint is copied in, the data rebuilt, the run resumed
    (tmp_path / "training-checkpoints" / "v4x5n").mkdir(parents=True)
    (tmp_path / "training-checkpoints" / "v4x5n" / "state.pt").write_bytes(b"x")
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert plan[0].startswith("+ cp -r training-checkpoints/v4x5n runs/train-v4x5n/model/checkpoint")
    assert "--steps data --mix v4" in plan[1]
    assert "--steps train --mix v4" in plan[2] and plan[2].endswith("--resume")  # the copied checkpoint
    # v4 finished, v6 paused with a checkpoint and its data built
    v4, v6 = tmp_path / "runs" / "train-v4x5n", tmp_path / "runs" / "train-v6"
    (v4 / "model").mkdir(parents=True)
    (v4 / "model" / "training.json").write_text("{}")
    (v6 / "model" / "checkpoint").mkdir(parents=True)
    (v6 / "data").mkdir()
    (v6 / "data" / "train.jsonl").write_text("")  # a data step killed before its data.json: rebuilt
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert "--steps data --mix v6" in plan[0] and sum("--steps data" in line for line in plan) == 1
    (v6 / "data" / "data.json").write_text("{}")
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert "--mix v6" in plan[0] and "--steps train" in plan[0] and plan[0].endswith("--resume")
    assert sum("--steps data" in line for line in _plan(tmp_path, monkeypatch, capsys)) == 0
    assert "--name noul-smollm2-135m-v3" in plan[0] and "--init-adapter runs/train-v4x5n/model" in plan[0]
    assert not any("--mix v4" in line for line in plan)
    # everything trained and calibrated: only the evaluations, compare and the clause checks
    (v6 / "model" / "checkpoint").rmdir()
    (v6 / "model" / "training.json").write_text('{"name": "noul-smollm2-135m-v6"}')  # another run's model
    with pytest.raises(SystemExit, match="holds a finished run named 'noul-smollm2-135m-v6'"):
        _plan(tmp_path, monkeypatch, capsys)
    (v6 / "model" / "training.json").write_text('{"name": "noul-smollm2-135m-v3"}')
    (v6 / "model" / "calibration.json").write_text("{}")
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert not any("train_default.py" in line for line in plan)
    evals = [line for line in plan if "noulengine.eval" in line and "--merge" not in line]
    merges = [line for line in plan if "--merge" in line]
    assert len(evals) == 2 * len(candidate_chain.EVALS) * candidate_chain.EVAL_WORKERS
    assert all(line.endswith("&") for line in evals) and len(merges) == 2 * len(candidate_chain.EVALS)
    assert sum("--model noul-smollm2-135m-v2" in line for line in evals) == len(evals) // 2
    compare = next(line for line in plan if "noulengine compare" in line)
    assert "v2=runs/chain45/v2-acc-probe," in compare and "v3=runs/chain45/v3-acc-probe," in compare


def _commit(tmp_path, name: str, *files: str) -> None:
    folder = tmp_path / "training-checkpoints" / name
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        (folder / f).write_text('{"name": "noul-smollm2-135m-v3"}' if f == "training.json" else "{}")


def test_a_fresh_clone_resumes_v6_from_committed_states_and_never_retrains_v4(tmp_path, monkeypatch, capsys):
    # session end inside v6: v4's finished adapter (v6's --init-adapter) and v6's checkpoint committed
    _commit(tmp_path, "v4x5n", "training.json", "adapter_model.safetensors")
    _commit(tmp_path, "v6", "state.pt", "checkpoint.json")
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert plan[0] == "+ cp -r training-checkpoints/v4x5n runs/train-v4x5n/model"
    assert plan[1] == "+ cp -r training-checkpoints/v6 runs/train-v6/model/checkpoint"
    assert "--steps data --mix v6" in plan[2]
    assert "--steps train --mix v6" in plan[3] and plan[3].endswith("--resume")
    assert not any("--mix v4" in line for line in plan)
    # a v6 checkpoint alone (v4's adapter not committed) still never retrains v4: the trainer's
    # --resume refuses the missing --init-adapter by name instead
    (tmp_path / "training-checkpoints" / "v4x5n" / "training.json").unlink()
    assert not any("--mix v4" in line for line in _plan(tmp_path, monkeypatch, capsys))


def test_a_fresh_clone_with_the_finished_candidate_goes_straight_to_the_evaluations(tmp_path, monkeypatch, capsys):
    _commit(tmp_path, "v6", "training.json", "adapter_model.safetensors", "calibration.json")
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert plan[0] == "+ cp -r training-checkpoints/v6 runs/train-v6/model"
    assert "--steps data --mix v6" in plan[1]  # the selection rows the yes AUC clause reads
    assert not any("--steps train" in line or "--steps calibrate" in line for line in plan)
    # the cheap clauses and a first verdict before the hours of suites; the verdict again at the end
    assert "selection_by_kind.py" in plan[2] and "readme_tickets.py" in plan[3]
    assert "adoption_verdict.py" in plan[4] and "noulengine.eval" in plan[5]
    assert "adoption_verdict.py" in plan[-1] and "compare_models_speed.py" in plan[-2]
    # a clause file already written is not made again
    (tmp_path / "runs" / "chain45").mkdir(parents=True)
    (tmp_path / "runs" / "chain45" / "selection.json").write_text("{}")
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert not any("selection_by_kind.py" in line for line in plan) and "readme_tickets.py" in plan[2]
    # on this machine the model folder is newer than any commit: nothing is copied over it
    (tmp_path / "runs" / "train-v6" / "model").mkdir(parents=True)
    (tmp_path / "runs" / "train-v6" / "model" / "checkpoint").mkdir()
    plan = _plan(tmp_path, monkeypatch, capsys)
    assert not any(line.startswith("+ cp") for line in plan) and plan[1].endswith("--resume")


def test_a_sigterm_pauses_the_chain_and_starts_no_later_step(tmp_path, monkeypatch):
    chain = candidate_chain.Chain()
    ready = tmp_path / "ready"
    previous = signal.signal(signal.SIGTERM, chain.on_sigterm)
    try:
        _sigterm_self_when(ready)
        with pytest.raises(candidate_chain.Paused):
            chain.run([sys.executable, "-c", PAUSING_CHILD, str(ready)], ok=(0,))
        with pytest.raises(candidate_chain.Paused):  # refused before it starts
            chain.run([sys.executable, "-c", "raise SystemExit(3)"])
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_side_by_side_commands_all_finish_and_a_failure_is_raised(tmp_path):
    chain = candidate_chain.Chain()
    assert chain.run_together([[sys.executable, "-c", "pass"]] * 2) == [0, 0]
    with pytest.raises(candidate_chain.subprocess.CalledProcessError):
        chain.run_together([[sys.executable, "-c", "pass"], [sys.executable, "-c", "raise SystemExit(4)"]])


def test_a_sigterm_reaches_every_side_by_side_command(tmp_path):
    chain = candidate_chain.Chain()
    ready = tmp_path / "ready"
    previous = signal.signal(signal.SIGTERM, chain.on_sigterm)
    try:
        _sigterm_self_when(ready)
        t0 = time.monotonic()
        with pytest.raises(candidate_chain.Paused):
            chain.run_together([[sys.executable, "-c", PAUSING_CHILD, str(ready)],
                                [sys.executable, "-c", PAUSING_CHILD, str(tmp_path / "other")]])
        assert time.monotonic() - t0 < 30  # both children stopped, not left to sleep out
    finally:
        signal.signal(signal.SIGTERM, previous)
