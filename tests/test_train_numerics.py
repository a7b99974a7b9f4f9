"""CPU numerics for training (noulengine/train/numerics.py): ``--numerics portable`` runs ATen's
generic kernels and MKL's COMPATIBLE path, training.json and each resumed part record what ran,
and a resume with the other mode is refused (a run half native, half portable reproduces
neither)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from noulengine.train import numerics
from tests.test_train_resume import toy  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[1]


def clean_env(**extra) -> dict:
    """This environment without the portable settings (a CI job may export them), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in numerics.PORTABLE_ENV}
    return {**env, "PYTHONPATH": str(REPO), "NOULENGINE_THREADS": "1", **extra}


def test_apply_refuses_a_process_whose_kernels_may_already_be_chosen(monkeypatch):
    for k in numerics.PORTABLE_ENV:
        monkeypatch.delenv(k, raising=False)
    assert "torch" in sys.modules  # this test process: kernels may already be dispatched
    with pytest.raises(RuntimeError, match="torch is already imported"):
        numerics.apply("portable")
    assert all(k not in os.environ for k in numerics.PORTABLE_ENV)  # nothing half-set
    numerics.apply("native")  # native sets nothing, so it is always safe
    with pytest.raises(ValueError, match=r"numerics must be one of \['native', 'portable'\], got 'fast'"):
        numerics.apply("fast")
    # already in the environment (set before Python started): accepted as it is
    for k, v in numerics.PORTABLE_ENV.items():
        monkeypatch.setenv(k, v)
    numerics.apply("portable")


REPORT = ("import json, sys; from noulengine.train import numerics; numerics.apply(sys.argv[1]); import torch; "
          "torch.ones(8, 8) @ torch.ones(8, 8); r = numerics.report(); print(json.dumps(r)); numerics.check(sys.argv[1])")


def test_portable_runs_the_generic_kernels_and_native_does_not():
    got = subprocess.run([sys.executable, "-c", REPORT, "portable"], capture_output=True, text=True,
                         env=clean_env(), cwd=REPO, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    r = json.loads(got.stdout)
    assert r["mode"] == "portable" and r["cpu_capability"] == "DEFAULT" and r["onednn_max_cpu_isa"] == "SSE41"
    if torch.backends.mkl.is_available():  # read back from MKL itself, not from the variable
        assert r["mkl_cbwr"] == "COMPATIBLE"
    assert r["threads"] >= 1 and r["cpu"]
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector kernels: native and portable are the same here")
    got = subprocess.run([sys.executable, "-c", REPORT, "native"], capture_output=True, text=True,
                         env=clean_env(), cwd=REPO, timeout=120)
    r = json.loads(got.stdout.splitlines()[0])
    assert r["mode"] == "native" and r["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert got.returncode == 0
    # asking for portable where native runs is refused with what runs
    got = subprocess.run([sys.executable, "-c", REPORT + "; numerics.check('portable')", "native"],
                         capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=120)
    assert got.returncode != 0 and "numerics portable asked for, but ATen runs" in got.stderr


@pytest.mark.slow
def test_train_cli_records_portable_numerics_and_resume_keeps_them(tmp_path, toy):  # noqa: F811
    args = ["--data", toy["data"], "--output", None, "--model", toy["model"], "--selection", toy["selection"],
            "--lora-r", "4", "--lr", "1e-2", "--epochs", "1", "--batch-tokens", "512", "--max-batch-size", "4",
            "--seed", "3", "--flip-rate-rows", "0", "--progress", "false"]

    def cli(out: Path, *extra, threads="1"):
        argv = [a if a is not None else str(out) for a in args]
        return subprocess.run([sys.executable, "-m", "noulengine.train", *argv, *extra], capture_output=True,
                              text=True, env=clean_env(NOULENGINE_THREADS=threads), cwd=REPO, timeout=300)

    parts = tmp_path / "parts"
    first = cli(parts, "--numerics", "portable", "--stop-after", "2")
    assert first.returncode == 75, first.stderr[-2000:]
    assert json.loads((parts / "checkpoint" / "checkpoint.json").read_text())["numerics"] == {"mode": "portable", "threads": 1}
    refused = cli(parts, "--numerics", "native", "--resume", str(parts))
    assert refused.returncode == 2
    assert "--numerics: the checkpoint ran portable CPU kernels, this command native" in refused.stderr
    refused = cli(parts, "--numerics", "portable", "--resume", str(parts), threads="2")
    assert refused.returncode == 2
    assert "threads: the checkpoint ran portable kernels on 1 threads, this command on 2" in refused.stderr
    second = cli(parts, "--numerics", "portable", "--resume", str(parts))
    assert second.returncode == 0, second.stderr[-2000:]
    t = json.loads((parts / "training.json").read_text())
    assert t["numerics"]["mode"] == "portable" and t["cpu_capability"] == "DEFAULT"
    # the fused AdamW: the for-loop step's sqrt comes from MKL VML, whose last bits depend on the CPU
    assert t["optimizer"] == {"name": "AdamW", "fused": True}
    assert [g["numerics"]["mode"] for g in t["segments"]] == ["portable", "portable"]
    # in one go: the same bytes as the two parts
    whole = cli(tmp_path / "whole", "--numerics", "portable")
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert (tmp_path / "whole" / "adapter_model.safetensors").read_bytes() == \
        (parts / "adapter_model.safetensors").read_bytes()
    # on two threads the last bits differ: the thread count is part of what reproduces a run
    two = cli(tmp_path / "two", "--numerics", "portable", threads="2")
    assert two.returncode == 0, two.stderr[-2000:]
    assert json.loads((tmp_path / "two" / "training.json").read_text())["numerics"]["threads"] == 2
    native = cli(tmp_path / "native", "--numerics", "native")
    assert native.returncode == 0, native.stderr[-2000:]
    t = json.loads((tmp_path / "native" / "training.json").read_text())
    assert t["numerics"]["mode"] == "native" and t["optimizer"] == {"name": "AdamW", "fused": False}
    assert (tmp_path / "two" / "adapter_model.safetensors").read_bytes() != \
        (parts / "adapter_model.safetensors").read_bytes()


@pytest.mark.slow
def test_numerics_check_fingerprints_the_kernels(tiny_llama_dir):
    """experiments/numerics_check.py, the cross-CPU fingerprint: it says which kernels ran, and the
    native and portable kernels give other bits (so equal hashes on two CPUs mean something)."""
    def fingerprint(mode):
        got = subprocess.run([sys.executable, str(REPO / "experiments" / "numerics_check.py"), mode, "--model",
                              str(tiny_llama_dir), "--lora-layers", "2"], capture_output=True, text=True,
                             env=clean_env(OMP_NUM_THREADS="1"), cwd=REPO, timeout=300)
        assert got.returncode == 0, got.stderr[-2000:]
        return json.loads(got.stdout.splitlines()[-1])

    portable = fingerprint("portable")
    assert portable["numerics"]["mode"] == "portable"
    assert set(portable["hashes"]) == {"logits", "loss", "grads0", "grads1", "lora"}
    assert fingerprint("portable")["hashes"] == portable["hashes"]
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector kernels: native and portable are the same here")
    native = fingerprint("native")
    assert native["numerics"]["mode"] == "native" and native["hashes"]["lora"] != portable["hashes"]["lora"]


def test_numerics_pin_is_for_cpu_updates_only(tmp_path):
    """A CPU part pins its kernels and threads; a GPU part is not refused by a CPU part's pin (the
    chain of issue #45 pauses on the CPU and continues on a lent GPU)."""
    from noulengine.train import checkpoint as ckpt
    from noulengine.train.trainer import _numerics_pin

    kernels = {"mode": "portable", "threads": 2, "cpu_capability": "DEFAULT"}
    assert _numerics_pin(kernels, torch.device("cpu")) == {"mode": "portable", "threads": 2}
    assert _numerics_pin(kernels, torch.device("cuda", 0)) is None
    meta = {"step": 1, "total": 4, "epoch": 0, "batch": 1, "settings": {"lr": 0.1},
            "data_sha256": {"train": "ab", "selection": None}, "numerics": {"mode": "portable", "threads": 2}}
    folder = ckpt.save_checkpoint(tmp_path, meta, {"trainable": {}})
    same = {"settings": {"lr": 0.1}, "data_sha256": {"train": "ab", "selection": None}}
    assert ckpt.load_checkpoint(folder, **same, numerics=None)[0]["step"] == 1  # a GPU part
    with pytest.raises(ValueError, match="the checkpoint ran portable CPU kernels, this command native"):
        ckpt.load_checkpoint(folder, **same, numerics={"mode": "native", "threads": 2})
    meta["numerics"] = None  # a chain that ran on GPUs only: a CPU part after it is not refused
    folder = ckpt.save_checkpoint(tmp_path, meta, {"trainable": {}})
    assert ckpt.load_checkpoint(folder, **same, numerics={"mode": "native", "threads": 2})[0]["step"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_portable_checkpoint_resumes_on_a_gpu(tmp_path, toy):  # noqa: F811
    """The chain's real case (scripts/gpu_recipe.sh): paused with portable kernels on the CPU,
    continued on CUDA without --numerics; training.json records both parts."""
    base = [sys.executable, "-m", "noulengine.train", "--data", toy["data"], "--output", str(tmp_path / "m"),
            "--model", toy["model"], "--selection", toy["selection"], "--lora-r", "4", "--lr", "1e-2",
            "--epochs", "1", "--batch-tokens", "512", "--max-batch-size", "4", "--seed", "3",
            "--flip-rate-rows", "0", "--progress", "false"]
    first = subprocess.run(base + ["--numerics", "portable", "--device", "cpu", "--stop-after", "2"],
                           capture_output=True, text=True, env=clean_env(NOULENGINE_THREADS="2"), cwd=REPO, timeout=300)
    assert first.returncode == 75, first.stderr[-2000:]
    second = subprocess.run(base + ["--device", "cuda", "--resume", str(tmp_path / "m"), "--stop-after", "4"],
                            capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    assert second.returncode == 75, second.stderr[-2000:]
    # the GPU part passes the CPU parts' pin on: back on the CPU, only the same kernels continue
    meta = json.loads((tmp_path / "m" / "checkpoint" / "checkpoint.json").read_text())
    assert meta["numerics"] == {"mode": "portable", "threads": 2}
    refused = subprocess.run(base + ["--numerics", "native", "--device", "cpu", "--resume", str(tmp_path / "m")],
                             capture_output=True, text=True, env=clean_env(NOULENGINE_THREADS="2"), cwd=REPO, timeout=300)
    assert refused.returncode == 2 and "the checkpoint ran portable CPU kernels" in refused.stderr
    third = subprocess.run(base + ["--numerics", "portable", "--device", "cpu", "--resume", str(tmp_path / "m")],
                           capture_output=True, text=True, env=clean_env(NOULENGINE_THREADS="2"), cwd=REPO, timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]
    t = json.loads((tmp_path / "m" / "training.json").read_text())
    assert [g["device"].split(":")[0] for g in t["segments"]] == ["cpu", "cuda", "cpu"]
    assert t["optimizer"] == {"name": "AdamW", "fused": True}


def test_resumed_optimizer_keeps_this_commands_fused_flag():
    """A checkpoint's optimizer groups carry their own ``fused`` flag; a resumed part runs its own
    (portable: fused on the CPU), whatever the part before it ran."""
    from noulengine.train.trainer import load_optimizer_state

    w = torch.nn.Parameter(torch.ones(3))
    plain = torch.optim.AdamW([w], lr=0.1)
    w.grad = torch.full((3,), 0.5)
    plain.step()
    saved = plain.state_dict()
    assert saved["param_groups"][0]["fused"] is None
    fused = torch.optim.AdamW([w], lr=0.1, fused=True)
    load_optimizer_state(fused, saved, fused=True)
    assert fused.param_groups[0]["fused"] is True
    assert torch.equal(fused.state[w]["exp_avg"], plain.state[w]["exp_avg"])
    fused.step()  # the fused CPU kernel runs on the loaded state
    back = torch.optim.AdamW([w], lr=0.1)
    load_optimizer_state(back, fused.state_dict(), fused=None)
    assert back.param_groups[0]["fused"] is None
