"""Resumable training: a run stopped and resumed ends where one run ends (weights, losses, logs),
a resume with other settings or data is refused, checkpoints are saved atomically, and SIGTERM
leaves a loadable checkpoint with the resumable exit status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from noulengine.train import TrainConfig, train
from noulengine.train import checkpoint as ckpt
from noulengine.train.contamination import EvaluationIndex
from tests.test_train import save_tiny, toy_rows, write

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def toy(tmp_path, tiny_tokenizer, tiny_llama):
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    sel_rows = toy_rows(8, 1, role="selection")
    for i, r in enumerate(sel_rows):  # two kinds, so the learning curve has per-kind points
        r["category"] = "even" if i % 2 == 0 else "odd"
    return {"model": str(model_dir), "data": str(write(tmp_path / "train.jsonl", toy_rows(40, 0))),
            "selection": str(write(tmp_path / "sel.jsonl", sel_rows))}


def config(toy, output, **kw) -> TrainConfig:
    # LoRA dropout draws from the torch RNG at every update: a resume that lost the RNG state
    # would train on other dropout masks and end elsewhere.
    base = dict(data=toy["data"], output=str(output), model=toy["model"], selection=toy["selection"], lora_r=4,
                lora_alpha=8, lora_dropout=0.1, lr=1e-2, epochs=2, batch_tokens=512, max_batch_size=4, seed=3,
                eval_every=2, flip_rate_rows=0, progress=False)
    return TrainConfig(**{**base, **kw})


def test_two_halves_equal_one_run(tmp_path, toy):
    index = EvaluationIndex()
    one = train(config(toy, tmp_path / "one"), evaluation_index=index)
    total = one.total
    assert total >= 8 and one.stopped is None
    # mid-epoch 1, between two learning-curve points: everything after it (epoch 1's end, the
    # best-epoch choice, epoch 2) comes from the resumed run
    half = total // 4 | 1
    assert half % 2 == 1 and half < total // 2
    first = train(config(toy, tmp_path / "two", stop_after=half, checkpoint_every=3), evaluation_index=index)
    assert first.stopped == "stop_after" and first.step == half
    assert first.checkpoint == tmp_path / "two" / "checkpoint"
    assert not (tmp_path / "two" / "training.json").exists()
    second = train(config(toy, tmp_path / "two", resume=str(tmp_path / "two")), evaluation_index=index)
    assert second.stopped is None and second.step == total

    a = load_file(tmp_path / "one" / "adapter_model.safetensors")
    b = load_file(tmp_path / "two" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(b[k], a[k]), k  # bitwise, not only close:
    # the same file, so a recipe run in one go reproduces the sha256 of an adapter trained in parts
    assert (tmp_path / "one" / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "two" / "adapter_model.safetensors").read_bytes()
    t1, t2 = one.training, second.training
    assert [x["step"] for x in t2["loss_curve"]] == list(range(1, total + 1))
    for x, y in zip(t1["loss_curve"], t2["loss_curve"]):
        assert y["lr"] == pytest.approx(x["lr"], rel=1e-9), y["step"]
        assert y["loss"] == pytest.approx(x["loss"], abs=2e-6), y["step"]  # logged rounded to 1e-6
    assert [e["epoch"] for e in t2["epochs"]] == [1, 2] and t2["chosen_epoch"] == t1["chosen_epoch"]
    for x, y in zip(t1["epochs"], t2["epochs"]):
        assert y["train_questions"] == x["train_questions"]
        assert y["train_loss"] == pytest.approx(x["train_loss"], abs=1e-6)
        assert y["selection"]["nll"] == pytest.approx(x["selection"]["nll"], abs=1e-6)
    # the learning curve: step 0, then every 2 updates, per kind, the same in both
    steps = [p["step"] for p in t1["learning_curve"]]
    want = list(range(0, total + 1, 2)) + ([total] if total % 2 else [])  # the last update always scored
    assert steps == want and [p["step"] for p in t2["learning_curve"]] == steps
    assert set(t1["learning_curve"][0]["kinds"]) == {"even", "odd"}
    for x, y in zip(t1["learning_curve"], t2["learning_curve"]):
        assert y["all"]["accuracy"] == x["all"]["accuracy"]
        assert y["all"]["nll"] == pytest.approx(x["all"]["nll"], abs=1e-6)
    lines = (tmp_path / "two" / "learning_curve.jsonl").read_text().splitlines()
    assert [json.loads(s)["step"] for s in lines] == steps
    assert t2["resumed"] and not t1["resumed"]
    # where each part ran: one segment for the run in one go, two contiguous ones for the halves
    assert [(g["from_step"], g["to_step"], g["device"]) for g in t1["segments"]] == [(0, total, "cpu")]
    assert [(g["from_step"], g["to_step"], g["device"]) for g in t2["segments"]] == [(0, half, "cpu"), (half, total, "cpu")]
    assert all(g["autocast"] is None and g["train_s"] >= 0 for g in t2["segments"])
    # float32 CPU results depend on the kernels' instruction set: each part says which it ran with
    assert t2["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert all(g["cpu_capability"] == t2["cpu_capability"] for g in t2["segments"])
    # how each was run (stops, resume path, checkpoints) is not a hyperparameter: the records agree
    assert t1["hyperparameters"] == t2["hyperparameters"] and "resume" not in t2["hyperparameters"]
    assert not (tmp_path / "two" / "checkpoint").exists()  # finished: the checkpoint is gone


def test_resume_refuses_other_settings_or_data(tmp_path, toy):
    index = EvaluationIndex()
    out = tmp_path / "run"
    assert train(config(toy, out, stop_after=2), evaluation_index=index).stopped == "stop_after"
    with pytest.raises(ValueError, match=r"--lr: the checkpoint has 0\.01, this command 0\.02"):
        train(config(toy, out, resume=str(out), lr=2e-2), evaluation_index=index)
    with pytest.raises(ValueError, match="--max-steps"):
        train(config(toy, out, resume=str(out), max_steps=5), evaluation_index=index)
    other = write(tmp_path / "other.jsonl", toy_rows(40, 5))
    with pytest.raises(ValueError, match="--data: the file's sha256 is"):
        train(config(toy, out, resume=str(out), data=str(other)), evaluation_index=index)
    with pytest.raises(ValueError, match="eval_every scores the selection rows"):
        config(toy, tmp_path / "x", selection=None)
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1"):
        config(toy, tmp_path / "x", checkpoint_every=0)
    with pytest.raises(FileNotFoundError, match="no checkpoint there"):
        train(config(toy, tmp_path / "fresh", resume=str(tmp_path / "nothing")), evaluation_index=index)
    with pytest.raises(FileExistsError, match="holds the checkpoint of a paused run: add --resume"):
        train(config(toy, out), evaluation_index=index)
    # settings that do not change the weights may change
    done = train(config(toy, out, resume=str(out), eval_every=None, checkpoint_every=1), evaluation_index=index)
    assert done.stopped is None and (out / "training.json").is_file()


def test_checkpoint_save_is_atomic(tmp_path):
    meta = {"step": 1, "settings": {}, "data_sha256": {"train": "x", "selection": None}}
    ckpt.save_checkpoint(tmp_path, meta, {"w": torch.ones(2)})
    ckpt.save_checkpoint(tmp_path, {**meta, "step": 2}, {"w": torch.full((2,), 2.0)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no temporary or old folder left
    # a kill while the next one was being written: a partial temporary folder is ignored
    (tmp_path / ".checkpoint.tmp-999").mkdir()
    (tmp_path / ".checkpoint.tmp-999" / "state.pt").write_bytes(b"partial")
    assert ckpt.find_checkpoint(tmp_path) == tmp_path / "checkpoint"
    # a kill between the two renames: the previous checkpoint is found under checkpoint.old
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")
    found = ckpt.find_checkpoint(tmp_path)
    assert found == tmp_path / "checkpoint.old"
    m, state = ckpt.load_checkpoint(found, settings={}, data_sha256={"train": "x", "selection": None})
    assert m["step"] == 2 and float(state["w"][0]) == 2.0


@pytest.mark.slow
def test_sigterm_leaves_a_loadable_checkpoint_and_exits_resumable(tmp_path, toy):
    out = tmp_path / "out"
    args = ["--data", toy["data"], "--output", str(out), "--model", toy["model"], "--lora-r", "4", "--lr", "1e-2",
            "--epochs", "200", "--batch-tokens", "512", "--max-batch-size", "4", "--progress", "false"]
    env = {**os.environ, "NOULENGINE_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "noulengine.train", *args, "--checkpoint-every", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + 240
    while not (out / "checkpoint" / "checkpoint.json").is_file():  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.EXIT_RESUMABLE, err[-3000:]
    assert "paused (SIGTERM)" in err and f"resumable: run the same command with --resume {out}" in err
    meta, state = ckpt.load_checkpoint(ckpt.find_checkpoint(out), settings=meta_settings(out),
                                       data_sha256=json.loads((out / "checkpoint" / "checkpoint.json")
                                                              .read_text())["data_sha256"])
    assert 2 <= meta["step"] < meta["total"] and len(state["progress"]["curve"]) == meta["step"]
    assert not (out / "training.json").exists()
    # the same command with --resume and an earlier end (a weight-shaping setting, so it is
    # refused) names the setting; the same command resumes
    rc = subprocess.run([sys.executable, "-m", "noulengine.train", *args, "--resume", str(out), "--epochs", "1"],
                        capture_output=True, text=True, env=env, cwd=REPO)
    assert rc.returncode == 2 and "--epochs: the checkpoint has 200, this command 1" in rc.stderr


def meta_settings(out: Path) -> dict:
    return json.loads((out / "checkpoint" / "checkpoint.json").read_text())["settings"]


def test_recipe_prints_and_writes_the_learning_curve(tmp_path, toy, capsys):
    sys.path.insert(0, str(REPO / "scripts"))
    import train_default

    out = tmp_path / "model"
    result = train(config(toy, out, epochs=1, max_steps=6, eval_every=3), evaluation_index=EvaluationIndex())
    points = train_default.learning_curve(out, tmp_path)
    assert [p["step"] for p in points] == [0, 3, 6] and points == result.training["learning_curve"]
    assert json.loads((tmp_path / "learning_curve.json").read_text()) == points
    rows = [line.split(",") for line in (tmp_path / "learning_curve.csv").read_text().splitlines()]
    assert rows[0] == ["step", "kind", "decisions", "accuracy", "nll"]
    assert {(r[0], r[1]) for r in rows[1:]} == {(s, k) for s in ("0", "3", "6") for k in ("all", "even", "odd")}
    for r in rows[1:]:  # the per-kind numbers are the trainer's selection metrics of that kind's rows
        m = next(p for p in points if p["step"] == int(r[0]))
        m = m["all"] if r[1] == "all" else m["kinds"][r[1]]
        assert int(r[2]) == m["decisions"] and float(r[3]) == pytest.approx(m["accuracy"], abs=1e-4)
    # 8 selection rows x 2 questions, half of them in each kind
    assert points[0]["all"]["decisions"] == 16 and points[0]["kinds"]["even"]["decisions"] == 8
    text = capsys.readouterr().out
    assert "selection accuracy per kind" in text and "even" in text and "odd" in text
    assert train_default.learning_curve(tmp_path / "none", tmp_path) == []


def test_learning_curve_ends_at_the_last_update(tmp_path, toy):
    """A run whose length K does not divide still gets its last update scored (the point a
    recipe compares with the previous default), once; a divisible one is not scored twice."""
    index = EvaluationIndex()
    odd = train(config(toy, tmp_path / "odd", epochs=1, max_steps=7, eval_every=3), evaluation_index=index)
    assert [p["step"] for p in odd.training["learning_curve"]] == [0, 3, 6, 7]
    even = train(config(toy, tmp_path / "even", epochs=1, max_steps=6, eval_every=3), evaluation_index=index)
    assert [p["step"] for p in even.training["learning_curve"]] == [0, 3, 6]
    # scoring never changes training: the same run without a curve writes the same adapter file, so a
    # recipe rerun with other --eval-every points reproduces the sha256
    plain = train(config(toy, tmp_path / "plain", epochs=1, max_steps=6, eval_every=None), evaluation_index=index)
    assert plain.training["learning_curve"] == []
    assert (tmp_path / "plain" / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "even" / "adapter_model.safetensors").read_bytes()


@pytest.mark.slow
def test_data_parallel_run_pauses_and_resumes_like_one_run(tmp_path, toy):
    """Two CPU processes (torchrun, gloo): both pause at the same update and rank 0 saves; the resumed
    run ends with the uninterrupted data-parallel run's adapter."""
    import shutil

    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if launcher is None:
        pytest.skip("torchrun not installed next to this python")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

    def launch(out, *extra):
        cmd = [launcher, "--nproc_per_node", "2", "--master_port", "29523", "-m", "noulengine.train", "--data",
               toy["data"], "--output", str(out), "--model", toy["model"], "--lora-r", "4", "--lora-dropout", "0.1",
               "--lr", "1e-2", "--epochs", "2", "--batch-tokens", "512", "--max-batch-size", "4",
               "--flip-rate-rows", "0", "--progress", "false", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)

    one = launch(tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    paused = launch(tmp_path / "two", "--stop-after", "3")
    # torchrun reports a worker's non-zero status as its own failure (1), naming the worker's 75
    assert paused.returncode != 0 and "exitcode  : 75" in paused.stderr, paused.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "checkpoint" / "checkpoint.json").read_text())["step"] == 3
    resumed = launch(tmp_path / "two", "--resume", str(tmp_path / "two"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(tmp_path / "one" / "adapter_model.safetensors")
    b = load_file(tmp_path / "two" / "adapter_model.safetensors")
    for k in a:
        assert torch.equal(b[k], a[k]), k  # bitwise: the recipe reproduces a resumed run's sha256
    t1, t2 = (json.loads((tmp_path / d / "training.json").read_text()) for d in ("one", "two"))
    assert t1["processes"] == t2["processes"] == 2 and t1["steps"] == t2["steps"] > 3
    assert [x["loss"] for x in t1["loss_curve"]] == pytest.approx([x["loss"] for x in t2["loss_curve"]], abs=2e-6)


def test_max_steps_beyond_the_epochs_is_refused(tmp_path, toy):
    """A run asked for more updates than its epochs hold is refused up front, naming the epochs it
    needs, instead of ending early on a schedule laid out for the longer run."""
    with pytest.raises(ValueError, match=r"--max-steps 10000 is more than the \d+ updates of --epochs 1 .*give --epochs \d+"):
        train(config(toy, tmp_path / "long", epochs=1, max_steps=10_000), evaluation_index=EvaluationIndex())


def test_the_last_update_is_scored_by_one_forward_pass(tmp_path, toy, monkeypatch):
    """The run's last learning-curve point and its epoch's selection score read the same weights: one
    pass over the selection rows serves both (a 722-row selection costs minutes on a CPU)."""
    from noulengine.train import selection

    calls = []
    real = selection.decide_rows

    def counting(engine, rows):
        calls.append(len(rows))
        return real(engine, rows)

    monkeypatch.setattr(selection, "decide_rows", counting)
    run = train(config(toy, tmp_path / "odd", epochs=1, max_steps=7, eval_every=3), evaluation_index=EvaluationIndex())
    points = run.training["learning_curve"]
    assert [p["step"] for p in points] == [0, 3, 6, 7]
    assert len(calls) == len(points)  # not one more for the epoch's end
    last, epoch = points[-1]["all"], run.training["epochs"][-1]["selection"]
    assert epoch["decisions"] == last["decisions"]
    assert epoch["accuracy"] == pytest.approx(last["accuracy"], abs=1e-12)
    assert epoch["nll"] == pytest.approx(last["nll"], abs=1e-9)
