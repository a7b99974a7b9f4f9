"""Training checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a folder ``<output>/checkpoint/`` with

* ``checkpoint.json``: the update it was taken after, the data position (epoch, batch index in
  that epoch's shuffled plan), the settings that shape the run and the sha256 of the training and
  selection files (a resume with other settings or other data is refused);
* ``state.pt``: the trainable parameters, the AdamW and LR-scheduler state, the RNG states (python
  ``random``, torch CPU, CUDA where present) and the run's logs so far (loss curve, epochs, the best
  epoch's weights, the learning curve). Loaded with ``torch.load(weights_only=True)``: no pickle
  code runs.

The batch order needs no saved RNG: every epoch's plan is a function of the seed and the epoch
(:func:`noulengine.train.trainer._epoch_batches`), so the position alone finds the next batch.

Saving is atomic: the new checkpoint is written to a temporary folder, the old one is renamed to
``checkpoint.old``, the new one renamed into place, then the old one removed. A kill at any point
leaves either ``checkpoint/`` or ``checkpoint.old/`` whole, and :func:`find_checkpoint` takes
whichever is complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import torch

FORMAT = "noulengine-checkpoint"
VERSION = 1
DIRNAME = "checkpoint"
# Settings that change what is logged or where, never the trained weights: a resume may change them.
FREE_SETTINGS = ("output", "progress", "device", "resume", "stop_after", "checkpoint_every", "eval_every", "name",
                 "data", "selection", "init_adapter")  # data, selection and the initial adapter are
# compared by content (sha256), not by path
EXIT_RESUMABLE = 75  # EX_TEMPFAIL: `noulengine train` stopped early with a checkpoint; rerun with --resume


def pinned_settings(config) -> dict:
    """The :class:`~noulengine.train.config.TrainConfig` fields a resume must repeat exactly."""
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in FREE_SETTINGS}


def rng_state() -> dict:
    """Python ``random``, torch CPU and (where present) CUDA generator states, as tensors and lists."""
    version, internal, gauss = random.getstate()
    out = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output: Path, meta: dict, state: dict) -> Path:
    """Write ``meta`` (JSON) and ``state`` (tensors, lists, numbers) as ``output/checkpoint/``, atomically.

    Returns:
        The checkpoint folder.
    """
    final, old = output / DIRNAME, output / f"{DIRNAME}.old"
    tmp = output / f".{DIRNAME}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "state.pt")
    # checkpoint.json last: a folder holding it is complete
    with (tmp / "checkpoint.json").open("w", encoding="utf-8") as fh:
        fh.write(json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def find_checkpoint(folder: str | Path) -> Path:
    """The complete checkpoint in ``folder``: the folder itself, its ``checkpoint/`` or, when a kill
    came between the two renames of a save, its ``checkpoint.old/``.

    Raises:
        FileNotFoundError: none there.
    """
    folder = Path(folder)
    for cand in (folder, folder / DIRNAME, folder / f"{DIRNAME}.old"):
        if (cand / "checkpoint.json").is_file() and (cand / "state.pt").is_file():
            return cand
    raise FileNotFoundError(f"--resume {folder}: no checkpoint there (expected {folder / DIRNAME}/checkpoint.json "
                            "and state.pt; a finished run removes its checkpoint)")


def load_checkpoint(folder: Path, *, settings: dict, data_sha256: dict,
                    numerics: dict | None = None) -> tuple[dict, dict]:
    """Read a checkpoint and check that it belongs to this command.

    Args:
        folder: what :func:`find_checkpoint` returned.
        settings: this command's :func:`pinned_settings`.
        data_sha256: ``{"train": sha256, "selection": sha256 or None, "init_adapter": sha256 or None}``
            of this command's files (the initial adapter's ``adapter_model.safetensors``).
        numerics: this process's CPU numerics, ``{"mode", "threads"}`` of
            :func:`noulengine.train.numerics.report`, checked against the checkpoint's where it
            records them: the mode always (a run half native, half portable reproduces neither),
            the thread count when portable (its results depend on it; measured in
            tests/test_train_numerics.py). None: not checked (this part runs on a GPU, where the
            CPU kernels decide nothing; its checkpoints carry the CPU parts' pin on, or None when
            no part ran on the CPU).

    Returns:
        ``(meta, state)``.

    Raises:
        ValueError: another format, other settings (each differing one named, with both values) or
            other data.
    """
    meta = json.loads((folder / "checkpoint.json").read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"--resume {folder}: expected a {FORMAT} v{VERSION} checkpoint, got "
                         f"{meta.get('format')!r} v{meta.get('version')!r}")
    problems = []
    for key in sorted(set(settings) | set(meta["settings"])):
        if settings.get(key) != meta["settings"].get(key):
            problems.append(f"--{key.replace('_', '-')}: the checkpoint has {meta['settings'].get(key)!r}, this "
                            f"command {settings.get(key)!r}")
    for key, flag in (("train", "--data"), ("selection", "--selection"), ("init_adapter", "--init-adapter")):
        mine, theirs = data_sha256.get(key), meta["data_sha256"].get(key)
        if mine == theirs:
            continue
        if mine is None or theirs is None:  # a flag given on one side only
            problems.append(f"{flag}: the checkpoint was trained {'with' if theirs else 'without'} it"
                            + (f" (sha256 {theirs})" if theirs else "") + f", this command {'has none' if theirs else 'gives one'}")
        else:
            problems.append(f"{flag}: the file's sha256 is {mine}, the checkpoint was trained on {theirs}")
    theirs = meta.get("numerics")
    if numerics is not None and theirs is not None:
        if theirs["mode"] != numerics["mode"]:
            problems.append(f"--numerics: the checkpoint ran {theirs['mode']} CPU kernels, this command "
                            f"{numerics['mode']}")
        elif theirs["mode"] == "portable" and theirs["threads"] != numerics["threads"]:
            problems.append(f"threads: the checkpoint ran portable kernels on {theirs['threads']} threads, this "
                            f"command on {numerics['threads']} (set NOULENGINE_THREADS={theirs['threads']})")
    if problems:
        raise ValueError(f"--resume {folder}: the checkpoint was made by another training run; repeat its "
                         "settings and data:\n  " + "\n  ".join(problems))
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    return meta, state
