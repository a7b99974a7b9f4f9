"""Training settings: :class:`TrainConfig` (the ``noulengine train`` flags are generated from it).

Kept free of torch at import, so ``noulengine train --help`` answers at once; the trainer is
:mod:`noulengine.train.trainer`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    """Training settings (the CLI flags are generated from these fields).

    Attributes:
        data: training JSONL (canonical records with targets; no validation_role).
        output: output directory (created; must be empty or absent).
        model: base model, anything ``Engine.from_pretrained`` takes (default: the untrained base).
        method: ``lora`` | ``full`` | ``top-k``.
        epochs: passes over the training rows.
        lr: peak learning rate (default per method: lora 2e-4, full 1e-5, top-k 1e-4).
        batch_tokens: padded tokens per optimizer step (rows x width).
        max_batch_size: rows per step at most.
        seed: seeds LoRA init, option permutations and batch order.
        selection: selection JSONL (validation_role: selection) scored after each epoch; chooses the epoch.
        selection_limit: score only the first N selection rows (None: all).
        loss: ``full`` (cross-entropy over the whole vocabulary: candidates plus -log x_mass) | ``candidates`` (over the candidates).
        readout: the readout trained and then used for inference: ``symbols`` | ``label-token`` | ``label-sequence`` | ``auto``.
        layout: the prompt layout trained and then served (``state-first`` | ``schema-first``:
            noulengine.compile.render.LAYOUTS); recorded in training.json.
        permute: permute choice options per row and epoch (option-order augmentation).
        permute_share: share of rows (drawn per row and epoch) whose options are permuted; the
            rest keep criteria order (1.0: every row).
        soft_targets: train on targets[field].probabilities where given.
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha (scale alpha / r).
        lora_dropout: LoRA dropout.
        lora_layers: adapt only the top N decoder layers (None: all).
        top_k: layers unfrozen by method top-k.
        train_vision: a vision-language model's vision tower and projector train too (default frozen: only the language model trains).
        weight_decay: AdamW weight decay.
        warmup_ratio: share of steps with linear warm-up.
        max_grad_norm: gradient clipping norm (0: none).
        max_steps: stop after this many optimizer steps (None: all epochs).
        stop_after: pause after this many updates of the run (counted from the start, resumed ones
            included): save a checkpoint and exit 75 (resumable); the schedule still ends at max_steps
            (None: run to the end).
        checkpoint_every: save a checkpoint into <output>/checkpoint/ every N updates (None: only
            at --stop-after, SIGTERM or SIGINT).
        resume: continue from the checkpoint in this folder (a run's output folder or its
            checkpoint/ folder); every other setting and the data must be the checkpoint's.
        eval_every: score the selection rows every K updates, per kind (the rows' category): a
            learning curve in training.json and <output>/learning_curve.jsonl (None: only per epoch).
        init_adapter: start LoRA from this trained adapter's weights (a noulengine train output
            folder or any peft LoRA adapter of the same base, rank, alpha, targets and layers):
            continued fine-tuning with a fresh optimizer and LR schedule; the saved adapter stands
            alone (base + it), never stacked (None: peft's initialisation).
        merge: save LoRA merged into full weights instead of an adapter.
        device: cuda | cpu | None (CUDA when available).
        name: model name recorded in training.json (default: the output folder's name).
        flip_rate_rows: selection rows used to measure the permutation flip rate of the final model (0: skip).
        progress: show a tqdm bar.
    """

    data: str
    output: str
    model: str | None = "SmolLM2-135M-Instruct"
    method: str = "lora"
    epochs: int = 1
    lr: float | None = None
    batch_tokens: int = 2048
    max_batch_size: int = 16
    seed: int = 0
    selection: str | None = None
    selection_limit: int | None = None
    loss: str = "full"
    readout: str = "symbols"
    layout: str = "state-first"
    permute: bool = True
    permute_share: float = 1.0
    soft_targets: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_layers: int | None = None
    top_k: int = 6
    train_vision: bool = False
    weight_decay: float = 0.0
    warmup_ratio: float = 0.05
    max_grad_norm: float = 1.0
    max_steps: int | None = None
    stop_after: int | None = None
    checkpoint_every: int | None = None
    resume: str | None = None
    eval_every: int | None = None
    init_adapter: str | None = None
    merge: bool = False
    device: str | None = None
    name: str | None = None
    flip_rate_rows: int = 200
    progress: bool = True

    def __post_init__(self):
        from noulengine.train.loss import LOSSES  # here, not at the top: building the CLI needs no torch
        from noulengine.train.methods import DEFAULT_LR, METHODS

        if self.method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, got {self.method!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {list(LOSSES)}, got {self.loss!r}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.layout not in ("state-first", "schema-first"):
            raise ValueError(f"layout must be 'state-first' or 'schema-first', got {self.layout!r}")
        if not 0.0 <= self.permute_share <= 1.0:
            raise ValueError(f"permute_share must be in [0, 1], got {self.permute_share}")
        for name in ("max_steps", "stop_after", "checkpoint_every", "eval_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")
        if self.eval_every is not None and not self.selection:
            raise ValueError("eval_every scores the selection rows: give selection (--selection) too")
        if self.init_adapter is not None and self.method != "lora":
            raise ValueError(f"init_adapter starts a LoRA run from an adapter: method must be 'lora', got {self.method!r}")
        if self.lr is None:
            self.lr = DEFAULT_LR[self.method]
