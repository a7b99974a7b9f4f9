"""``noulengine train``: fine-tune a causal LM on canonical records so it answers through a readout.

Loop (one optimizer update per batch):

1. check every training (and selection) row up front (:mod:`noulengine.train.data`), against the
   pinned evaluation suites too (:mod:`noulengine.train.contamination`);
2. per epoch: permute each row's choice options with a per-row, per-epoch seed, compile with the
   engine's compiler, plan length-grouped batches under ``batch_tokens`` padded tokens, shuffle
   the batch order;
3. per batch: the engine's packed forward pass with autograd, the loss at every question's answer
   position (:mod:`noulengine.train.loss`), AdamW, linear warm-up then linear decay, gradient
   clipping;
4. after each epoch: selection metrics through the real engine; the best epoch by selection NLL
   is kept;
5. save the adapter (or weights) and ``training.json``.

Resumable (:mod:`noulengine.train.checkpoint`): a checkpoint is saved every ``checkpoint_every``
updates, at ``stop_after`` and at SIGTERM/SIGINT (the update under way finishes first); ``resume``
continues from one, and a run stopped and resumed ends with the same weights and logs as one run.
With ``eval_every`` the selection rows are scored per kind every K updates (a learning curve).
``init_adapter`` starts LoRA from a trained adapter's weights (continued fine-tuning on new data,
with a fresh optimizer and schedule; :func:`~noulengine.train.methods.init_lora_from_adapter`).

Data parallel: launched with ``torchrun --nproc_per_node N -m noulengine.train ...`` (CPU, gloo)
or ``accelerate launch --multi_gpu --num_processes N -m noulengine.train ...`` (GPUs), the
``accelerate.Accelerator`` picks up the process group; each process takes
every ``world``-th batch and gradients are averaged across processes before each update (the
same update as one process on the union of the batches).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from noulengine.compile.render import prompt_version
from noulengine.models.tokenizer_probe import probe_record
from noulengine.train import checkpoint as ckpt
from noulengine.train import numerics
from noulengine.train.config import TrainConfig  # noqa: F401 - re-exported (noulengine.train.TrainConfig)
from noulengine.train.data import TrainingDataError, load_training_rows
from noulengine.train.loss import batch_losses, compile_example
from noulengine.train.methods import (ADAPTER_WEIGHTS, TRAINING_FORMAT, apply_method, check_init_adapter_files,
                                      init_lora_from_adapter, load_trainable_state, save_trained, trainable_parameters,
                                      trainable_state)
from noulengine.writes import saving, write_text_atomic

FORMAT = TRAINING_FORMAT  # training.json's "format"; methods checks it on --init-adapter
VERSION = 1


@dataclass
class TrainResult:
    """What :func:`train` wrote: the output directory, the ``training.json`` content and the
    trained model as it is in memory (peft-wrapped for LoRA; the best epoch's weights)."""

    output: Path
    training: dict = field(default_factory=dict)
    model: object = None
    stopped: str | None = None  # why the run paused before its end ("stop_after", "SIGTERM", "SIGINT")
    checkpoint: Path | None = None  # where it saved its checkpoint then (resume with config.resume)
    step: int = 0  # updates done
    total: int = 0  # updates the run makes in all


def _lr_lambda(total: int, warmup: int):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _file_info(path: Path, rows) -> dict:
    from noulengine.models.loading import sha256_file

    return {"path": str(path), "sha256": sha256_file(path), "rows": len(rows),
            "questions": sum(r.num_questions for r in rows)}


def train(config: TrainConfig, *, evaluation_index=None, accelerator=None) -> TrainResult:
    """Train a decision model; see the module docstring for the loop.

    Args:
        config: :class:`TrainConfig`.
        evaluation_index: an :class:`~noulengine.train.contamination.EvaluationIndex`; None builds
            it from every registered benchmark suite (the CLI always does).
        accelerator: an ``accelerate.Accelerator`` (None: one is made; single process unless
            launched with ``accelerate launch``).

    Returns:
        :class:`TrainResult`.

    Raises:
        TrainingDataError: any training or selection row breaks a rule (all are listed).
        FileExistsError: ``output`` exists and is not empty (unless it holds the resumed checkpoint).
        FileNotFoundError: ``resume`` holds no checkpoint.
        ValueError: the resumed checkpoint was made with other settings or data (each one named).
        noulengine.models.loading.ModelNotFoundError: ``model`` names nothing loadable.

    A run that pauses (``stop_after``; SIGTERM or SIGINT, which only raise a flag while it runs,
    in the main thread; a second one stops at once) finishes the update under way, saves a
    checkpoint and returns a result with ``stopped`` set and nothing else written (the CLI exits
    with :data:`noulengine.train.checkpoint.EXIT_RESUMABLE`); the previous handlers are restored on
    return.
    """
    signalled: list[str] = []
    previous = {}

    def on_signal(num, frame):
        if signalled:  # a second signal: stop at once, without a checkpoint
            raise KeyboardInterrupt if num == signal.SIGINT else SystemExit(128 + num)
        signalled.append(signal.Signals(num).name)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        return _train(config, evaluation_index=evaluation_index, accelerator=accelerator, signalled=signalled)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _train(config: TrainConfig, *, evaluation_index=None, accelerator=None, signalled=()) -> TrainResult:
    """:func:`train` without the signal handlers (``signalled`` collects the signals caught)."""
    from accelerate import Accelerator

    from noulengine.engine.engine import Engine
    from noulengine.engine.model_runner import pick_device
    from noulengine.eval.report import git_revision, library_versions
    from noulengine.models.loading import load_model
    from noulengine.records.errors import RecordError
    from noulengine.train.contamination import build_evaluation_index
    from noulengine.train.selection import decide_rows, selection_by_kind, selection_metrics

    t_start = time.perf_counter()
    revision = git_revision()  # read at the start: commits made during a long run must not be credited
    # read once: the kernels and thread count are fixed before torch runs anything (train/__main__.py),
    # and the report opens /proc/cpuinfo and torch's shared library
    kernels = numerics.report()
    output = Path(config.output)
    resume_from = ckpt.find_checkpoint(config.resume) if config.resume else None
    continuing = resume_from is not None and resume_from.parent.resolve() == output.resolve()
    if output.exists() and any(output.iterdir()) and not continuing:
        if (output / ckpt.DIRNAME).is_dir() and config.resume is None:
            raise FileExistsError(f"--output {output} holds the checkpoint of a paused run: add --resume {output} "
                                  "to continue it, or choose a new folder")
        raise FileExistsError(f"--output {output} exists and is not empty; choose a new folder")
    if accelerator is None:
        dev = pick_device(config.device)
        accelerator = Accelerator(cpu=dev.type == "cpu")
    device = accelerator.device
    rank, world, main = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process

    index = evaluation_index if evaluation_index is not None else build_evaluation_index()
    rows = load_training_rows(config.data, index=index, soft_targets=config.soft_targets)
    if not rows:
        raise TrainingDataError([RecordError("the training file holds no rows", file=config.data)])
    sel_rows = []
    if config.selection:
        sel_rows = load_training_rows(config.selection, index=index, role="selection")
        if config.selection_limit is not None:
            sel_rows = sel_rows[:config.selection_limit]

    data_sha256 = {"train": _sha256(config.data), "selection": _sha256(config.selection) if config.selection else None}
    if config.init_adapter is not None:  # checked before the model loads; compared by content on --resume
        data_sha256["init_adapter"] = _sha256(check_init_adapter_files(config.init_adapter) / ADAPTER_WEIGHTS)
    resumed = None
    # what a CPU part after this one must repeat: this part's kernels on the CPU; on a GPU, the pin of the
    # CPU parts before it (a GPU part decides no CPU bits, so it neither sets nor drops the chain's pin)
    numerics_pin = _numerics_pin(kernels, device)
    if resume_from is not None:  # checked before the model loads: a wrong command fails at once
        resumed = ckpt.load_checkpoint(resume_from, settings=ckpt.pinned_settings(config), data_sha256=data_sha256,
                                       numerics=numerics_pin)
        if numerics_pin is None:
            numerics_pin = resumed[0].get("numerics")

    _seed_everything(config.seed)
    loaded = load_model(config.model, dtype=torch.float32, device=device)
    base_identity = loaded.identity.to_dict()
    model = apply_method(loaded.model, method=config.method, lora_r=config.lora_r, lora_alpha=config.lora_alpha,
                         lora_dropout=config.lora_dropout, lora_layers=config.lora_layers, top_k=config.top_k,
                         train_vision=config.train_vision)
    init = None
    if config.init_adapter is not None:  # before the optimizer sees the parameters
        init = init_lora_from_adapter(model, config.init_adapter, base_sha256=base_identity.get("sha256"),
                                      layout=config.layout, readout=config.readout,
                                      prompt_version=prompt_version(config.layout))
    tokenizer = loaded.tokenizer
    params = trainable_parameters(model)
    n_trainable = sum(p.numel() for p in params)
    # The serving engine's own compiler (and pad id) compiles the training rows; its runner, in
    # train mode, runs the training forward pass; the same engine scores the selection rows.
    # No cross-request prefix caching: the weights change after every step, cached keys would not.
    engine = Engine.from_model(model, tokenizer, processor=loaded.processor, readout=config.readout,
                               batch_tokens=config.batch_tokens, device=str(device), prefix_cache_mb=0,
                               layout=config.layout)
    runner, compiler, pad_id = engine.runner, engine.compiler, engine.pad_id
    model.train()
    autocast = torch.bfloat16 if device.type == "cuda" else None

    # Overlength and readout rules are checked for every row by compiling epoch 0 before the first step.
    epoch0 = _epoch_batches(compiler, rows, config, 0, data_path=config.data)
    steps_per_epoch = max(1, len(epoch0[0]) // world)
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        if config.max_steps > total:  # never a silently shorter run than the one asked for
            need = -(-config.max_steps // steps_per_epoch)
            raise ValueError(f"--max-steps {config.max_steps} is more than the {total} updates of --epochs "
                             f"{config.epochs} ({steps_per_epoch} per epoch on this data): give --epochs {need}")
        total = config.max_steps
    # Portable numerics take torch's fused AdamW: its step computes sqrt with the CPU's correctly
    # rounded instruction, where the for-loop step's exp_avg_sq.sqrt() goes to MKL VML, whose last
    # bits differ between CPU models even with MKL_CBWR=COMPATIBLE (train/numerics.py).
    fused_adamw = kernels["mode"] == "portable"
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=fused_adamw or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(total, int(config.warmup_ratio * total)))

    curve, epochs_log, learning = [], [], []
    best = None
    step = 0
    seen_examples = 0
    start_epoch = start_batch = 0
    ep_acc = [0.0, 0.0, 0.0]  # the epoch so far: loss x questions, questions, correct
    train_s_before = 0.0  # training seconds of the runs this one resumes
    # Where each part of a stopped-and-resumed run ran (device, autocast dtype, updates, seconds): a run
    # paused on a GPU and finished on a CPU is recorded as such in training.json, never as one device.
    segments: list[dict] = []
    if resumed is not None:
        meta, state = resumed
        load_trainable_state(model, state["trainable"])
        load_optimizer_state(optimizer, state["optimizer"], fused=fused_adamw or None)
        scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        p = state["progress"]
        curve, epochs_log, learning = p["curve"], p["epochs"], p["learning_curve"]
        step, seen_examples, ep_acc, train_s_before = p["step"], p["seen_examples"], p["epoch_sums"], p["train_s"]
        # a checkpoint written before segments were recorded: its updates' device is unknown
        segments = p.get("segments") or [{"from_step": 0, "to_step": step, "device": None, "autocast": None,
                                          "train_s": round(train_s_before, 1), "git_revision": None}]
        start_epoch, start_batch = meta["epoch"], meta["batch"]
        if p["best"] is not None:
            best = (p["best"]["nll"], p["best"]["epoch"], p["best"]["trainable"])
        if main:
            print(json.dumps({"resumed": {"from": str(resume_from), "step": step, "of": total,
                                          "epoch": start_epoch + 1, "batch": start_batch}}), flush=True)
    bar = None
    if config.progress and main:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc="train", unit="step", dynamic_ncols=True)

    step_at_start = step

    def run_segments() -> list[dict]:
        """The earlier runs' segments plus this one's so far (from_step inclusive, to_step exclusive)."""
        return segments + [{"from_step": step_at_start, "to_step": step, "device": str(device),
                            "cpu_capability": _cpu_capability(), "numerics": kernels,
                            "autocast": None if autocast is None else str(autocast).replace("torch.", ""),
                            "train_s": round(time.perf_counter() - t_train, 1), "git_revision": revision}]

    def save(epoch: int, batch: int) -> Path | None:
        """Checkpoint after the current update; ``batch`` is the next one's index in this process's share."""
        if not main:
            return None
        meta = {"step": step, "total": total, "epoch": epoch, "batch": batch, "settings": ckpt.pinned_settings(config),
                "data_sha256": data_sha256, "numerics": numerics_pin}
        progress = {"curve": curve, "epochs": epochs_log, "learning_curve": learning, "step": step,
                    "seen_examples": seen_examples, "epoch_sums": ep_acc,
                    "train_s": train_s_before + time.perf_counter() - t_train, "segments": run_segments(),
                    "best": None if best is None else {"nll": best[0], "epoch": best[1], "trainable": best[2]}}
        state = {"trainable": trainable_state(model), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "rng": ckpt.rng_state(), "progress": progress}
        with saving(output / ckpt.DIRNAME, "the previous checkpoint, if any, is kept"):
            return ckpt.save_checkpoint(output, meta, state)

    scored: dict = {}  # the selection rows' decisions at one update: {"step", "decisions"}

    def selection_decisions() -> list:
        """The selection rows' decisions with the weights of this update, computed once per update: the
        last update's learning-curve point and its epoch's selection score read the same forward pass."""
        if scored.get("step") != step:
            model.eval()
            scored.update(step=step, decisions=decide_rows(engine, sel_rows))
            model.train()
        return scored["decisions"]

    def learning_point() -> None:
        """Selection metrics per kind now; the RNG states are put back so scoring never changes training."""
        if not (main and sel_rows and config.eval_every):
            return
        rng = ckpt.rng_state()
        point = {"step": step, **selection_by_kind(engine, sel_rows, decisions=selection_decisions())}
        ckpt.set_rng_state(rng)
        learning.append(point)
        output.mkdir(parents=True, exist_ok=True)
        # rewritten whole: after a resume it holds exactly the checkpoint's points and the new ones
        write_text_atomic(output / "learning_curve.jsonl", "".join(json.dumps(x) + "\n" for x in learning))
        print(json.dumps({"learning_curve": {"step": step, "accuracy": point["all"].get("accuracy"),
                                             "by_kind": {k: m.get("accuracy") for k, m in point["kinds"].items()}}}),
              flush=True)

    stopped = checkpoint_dir = None
    t_train = time.perf_counter()
    if resumed is None and config.eval_every:
        learning_point()  # the untrained model: the curve's first point
    seen_before = seen_examples
    for epoch in range(start_epoch, config.epochs):
        # a checkpoint is always taken before its epoch's end is logged: a resumed epoch ends here
        if step >= total and not (resumed is not None and epoch == start_epoch):
            break
        batches, examples = epoch0 if epoch == 0 else _epoch_batches(compiler, rows, config, epoch)
        # Every process plans the same batches (same seeds); each takes an equal share.
        mine = batches[rank::world][:max(1, len(batches) // world)]
        first = start_batch if epoch == start_epoch else 0
        if epoch != start_epoch or resumed is None:
            ep_acc = [0.0, 0.0, 0.0]
        model.train()
        for b, indices in enumerate(mine[first:], start=first):
            if step >= total:
                break
            out = batch_losses(runner, examples, indices, loss=config.loss, pad_id=pad_id, autocast_dtype=autocast)
            loss = out.mean_loss()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if world > 1:
                for p in params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    p.grad = accelerator.reduce(p.grad, reduction="mean")
            grad_norm = None
            if config.max_grad_norm:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
            optimizer.step()
            scheduler.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"step {step}: the loss is {value}; lower --lr (now {config.lr})")
            step += 1
            seen_examples += len(indices)
            ep_acc[0] += value * out.num_questions
            ep_acc[1] += out.num_questions
            ep_acc[2] += out.correct
            curve.append({"step": step, "epoch": epoch + 1, "loss": round(value, 6),
                          "lr": scheduler.get_last_lr()[0], "grad_norm": grad_norm, "examples": len(indices),
                          "questions": out.num_questions, "correct": out.correct})
            if bar is not None:
                rate = (seen_examples - seen_before) * world / (time.perf_counter() - t_train)
                bar.set_postfix(loss=f"{value:.4f}", ex_s=f"{rate:.2f}", epoch=epoch + 1)
                bar.update(1)
            if config.eval_every and step % config.eval_every == 0:
                learning_point()
            pause = signalled[0] if signalled else "stop_after" if step == config.stop_after and step < total else None
            if world > 1:  # a signal may reach one process only: every process pauses at the same update
                votes = accelerator.reduce(torch.tensor([float(pause is not None)], device=device), reduction="sum")
                pause = pause or ("signal to another process" if float(votes) > 0 else None)
            if pause or (config.checkpoint_every and step % config.checkpoint_every == 0 and step < total):
                checkpoint_dir = save(epoch, b + 1) or checkpoint_dir
            if pause:
                stopped = pause
                break
        if stopped:
            break  # the epoch is not over: its end is logged by the run that resumes it
        entry = {"epoch": epoch + 1, "steps": step, "train_loss": ep_acc[0] / max(ep_acc[1], 1),
                 "train_accuracy": ep_acc[2] / max(ep_acc[1], 1), "train_questions": int(ep_acc[1])}
        if sel_rows and main:
            entry["selection"] = selection_metrics(engine, sel_rows, decisions=selection_decisions())
            if best is None or entry["selection"]["nll"] < best[0]:
                best = (entry["selection"]["nll"], epoch + 1, trainable_state(model))
        epochs_log.append(entry)
        if main:
            print(json.dumps({"epoch_done": entry}), flush=True)
    if bar is not None:
        bar.close()
    if not stopped and config.eval_every and (not learning or learning[-1]["step"] != step):
        learning_point()  # the curve always ends at the last update, whatever K divides
    if stopped:
        if main:
            print(json.dumps({"paused": {"reason": stopped, "step": step, "of": total,
                                         "checkpoint": str(checkpoint_dir)}}), flush=True)
        if world > 1:
            accelerator.wait_for_everyone()
        return TrainResult(output, model=model, stopped=stopped, checkpoint=checkpoint_dir, step=step, total=total)
    train_s = train_s_before + time.perf_counter() - t_train
    chosen = epochs_log[-1]["epoch"] if epochs_log else 0
    if best is not None and best[1] != chosen:
        load_trainable_state(model, best[2])
        chosen = best[1]

    result = TrainResult(output, model=model, step=step, total=total)
    if not main:
        accelerator.wait_for_everyone()
        return result
    final = {}
    if sel_rows and config.flip_rate_rows:
        engine = Engine.from_model(model, tokenizer, processor=loaded.processor, readout=config.readout,
                                   debias="permute", device=str(device), prefix_cache_mb=0, layout=config.layout)
        final["permutation"] = selection_metrics(engine, sel_rows[:config.flip_rate_rows], debias="permute")
    with saving(output, "no training.json was written, so the folder holds no finished model"):
        files = save_trained(model, tokenizer, output, method=config.method, merge=config.merge,
                             processor=loaded.processor)
    training = {
        "format": FORMAT, "version": VERSION, "name": config.name or output.name,
        "base_model": {**base_identity, "spec": _base_spec(config.model, base_identity["sha256"])},
        "method": config.method + ("-merged" if config.method == "lora" and config.merge else ""),
        "readout": config.readout, "loss": config.loss,
        # what the model was trained to read: checked when it is loaded (models/tokenizer_probe.py)
        "tokenizer_probe": probe_record(tokenizer), "prompt_version": prompt_version(config.layout),
        "layout": config.layout,
        "hyperparameters": {k: v for k, v in dataclasses.asdict(config).items()
                            if k not in ("data", "output", "model", "selection", "progress", "device", "name")
                            and k not in ckpt.FREE_SETTINGS},  # how it was run (stops, checkpoints), not what
        # continued fine-tuning: the adapter it started from (its weights' sha256), else None
        "init_adapter": init,
        "trainable_parameters": n_trainable,
        "data": {"train": _file_info(Path(config.data), rows),
                 "selection": _file_info(Path(config.selection), sel_rows) if config.selection else None},
        "evaluation_overlap_check": index.summary(),
        "git_revision": revision, "seed": config.seed, "versions": _versions(library_versions),
        "device": str(device), "cpu_capability": _cpu_capability(), "numerics": kernels,
        "optimizer": {"name": "AdamW", "fused": fused_adamw},
        "processes": world, "steps": step,
        "wall_s": round(time.perf_counter() - t_start, 1), "train_s": round(train_s, 1),
        "examples_per_s": round(seen_examples * world / train_s, 3) if train_s else None,
        "epochs": epochs_log, "chosen_epoch": chosen,
        "chosen_by": "selection NLL" if best is not None else "last epoch (no selection rows)",
        "final": final, "files": files, "loss_curve": curve, "learning_curve": learning,
        "resumed": resume_from is not None, "segments": run_segments(),
    }
    # written last and whole (a rename): a folder without it holds no finished model
    write_text_atomic(output / "training.json", json.dumps(training, indent=1, ensure_ascii=False) + "\n")
    result.training = training
    # finished: the checkpoint could only repeat what is saved now
    for name in (ckpt.DIRNAME, f"{ckpt.DIRNAME}.old"):
        shutil.rmtree(output / name, ignore_errors=True)
    if world > 1:
        accelerator.wait_for_everyone()
    return result


def _sha256(path) -> str:
    from noulengine.models.loading import sha256_file

    return sha256_file(Path(path))


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict, *, fused: bool | None) -> None:
    """Load a checkpoint's optimizer state, keeping this command's ``fused`` flag.

    ``Optimizer.load_state_dict`` replaces each param group with the saved one, flags included, so a
    CPU part resumed after a GPU part would otherwise run the GPU's step instead of the portable fused
    one (train/numerics.py). The flag is set on the saved groups before the load, whose cast puts
    each state's ``step`` on the device the flag wants (fused: the parameter's).

    Args:
        optimizer: the freshly built optimizer of this command.
        saved: ``optimizer.state_dict()`` from the checkpoint (its groups are updated in place).
        fused: this command's flag (True or None).
    """
    for group in saved["param_groups"]:
        group["fused"] = fused
    optimizer.load_state_dict(saved)


def _numerics_pin(kernels: dict, device: torch.device) -> dict | None:
    """What a resume must repeat of this process's CPU numerics (``kernels``:
    :func:`noulengine.train.numerics.report`'s dict): ``{"mode", "threads"}``, or None when the
    updates run on an accelerator.

    The CPU kernels and thread count decide a float32 CPU run's bits, so a CPU run resumes only with
    the same ones. Updates on a GPU use neither (the model runs CUDA kernels under bf16 autocast), so
    a GPU part is not refused by a CPU part's pin, and its checkpoint passes the CPU parts' pin on:
    a chain paused on this project's CPU continues on a lent GPU (scripts/gpu_recipe.sh) and back on
    the CPU with the same kernels, and training.json's ``segments`` say where each part ran."""
    if device.type != "cpu":
        return None
    return {"mode": kernels["mode"], "threads": kernels["threads"]}


def _cpu_capability() -> str:
    """The vector instruction set ATen's CPU kernels dispatch to ("AVX512", "AVX2", "DEFAULT"; see
    ``torch.backends.cpu.get_cpu_capability``). float32 results on a CPU depend on it: the v2 recipe's
    first loss is 6.349981 on an AVX-512 host and 6.349974 there with ``ATEN_CPU_CAPABILITY=avx2``
    (docs/training.md), so a byte-for-byte reproduction of a CPU-trained adapter needs the same
    capability as the run that made it."""
    return torch.backends.cpu.get_cpu_capability()


def _versions(library_versions) -> dict:
    out = library_versions()
    try:
        from importlib import metadata

        out["peft"] = metadata.version("peft")
        out["accelerate"] = metadata.version("accelerate")
    except Exception:  # noqa: BLE001 - versions are informational
        pass
    return out


def _base_spec(model, sha256: str) -> str | None:
    """What loads the base again: None for the default decision model, an embedded base's name when
    the base is one (matched by sha256, so an adapter trained on that GGUF's path loads on any
    machine that installs the package), else an absolute path."""
    from noulengine.models.embedded import embedded_base_by_sha256

    if model is None:
        return None
    base = embedded_base_by_sha256(sha256)
    return base.name if base is not None else str(Path(model).expanduser().resolve())


def _epoch_batches(compiler, rows, config: TrainConfig, epoch: int, *, data_path=None):
    """Compiled examples (options permuted with a per-row, per-epoch seed) and the epoch's
    shuffled, length-grouped batches of example indices.

    Raises:
        TrainingDataError: listing every row that does not compile (overlength, readout rules),
            each with ``data_path`` and its line.
    """
    from noulengine.engine.batching import plan_batches
    from noulengine.records.errors import RecordError

    examples, errors = [], []
    for r in rows:
        rng = random.Random(f"{config.seed}:{epoch}:{r.id}") if config.permute else None
        if rng is not None and rng.random() >= config.permute_share:
            rng = None  # this row keeps criteria order this epoch
        try:
            examples.append(compile_example(compiler, r, rng))
        except RecordError as exc:
            errors.append(exc.located(data_path, r.line) if exc.file is None else exc)
        except Exception as exc:  # noqa: BLE001 - OverlengthError, TokenizerError: named per row
            errors.append(RecordError(str(exc), record_id=r.id, field=getattr(exc, "field", None),
                                      file=data_path, line=r.line))
    if errors:
        raise TrainingDataError(errors)
    batches = plan_batches([e.compiled.input_tokens for e in examples], batch_tokens=config.batch_tokens,
                           max_batch_size=config.max_batch_size)
    random.Random(f"{config.seed}:{epoch}:order").shuffle(batches)
    return batches, examples

