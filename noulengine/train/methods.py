"""Which parameters train: LoRA (through peft, the default), full fine-tuning, or the top k layers.

* ``lora``: low-rank adapters ``W + (alpha / r) * B @ A`` on the attention and MLP projections
  (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), optionally only in the
  top ``lora_layers`` decoder layers (backpropagation then stops at the lowest adapted layer,
  which on a CPU is most of the cost). Saved as a peft adapter (``adapter_model.safetensors``),
  or merged into the weights with ``merge``.
* ``full``: every parameter.
* ``top-k``: the top ``top_k`` decoder layers and the final norm; everything below is frozen.

Vision-language models: only the language model trains by default. LoRA adapts the projections of
its decoder layers (the vision tower's own ``q_proj`` / ``gate_proj`` ... are left alone) and
``full`` leaves the vision tower and the projector frozen; ``train_vision`` unfreezes them.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from noulengine.models.peft_compat import quiet_peft_checkpointing_warning
from noulengine.vision.adapters import is_vision_language

METHODS = ("lora", "full", "top-k")
DEFAULT_LR = {"lora": 2e-4, "full": 1e-5, "top-k": 1e-4}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def decoder_layers(model) -> torch.nn.ModuleList:
    """The model's decoder layers (``model.model.layers`` for Llama/Qwen2/Gemma-style models)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find the decoder layers (expected .layers)")
    return layers


def vision_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters of a VLM outside its language model and output head: the vision tower and
    the projector (empty for a text model)."""
    if not is_vision_language(model):
        return []
    text = {id(p) for p in model.get_decoder().parameters()}
    text |= {id(p) for p in model.get_output_embeddings().parameters()}
    return [(n, p) for n, p in model.named_parameters() if id(p) not in text]


def _decoder_prefix(model) -> str:
    """The qualified module name of the language model (``model.language_model`` in a VLM)."""
    decoder = model.get_decoder()
    return next(name for name, module in model.named_modules() if module is decoder)


def apply_method(model, *, method: str, lora_r: int = 16, lora_alpha: int = 32, lora_dropout: float = 0.0,
                 lora_layers: int | None = None, lora_targets: tuple[str, ...] = LORA_TARGETS, top_k: int = 6,
                 train_vision: bool = False):
    """Make the chosen parameters trainable; returns the (possibly peft-wrapped) model.

    Args:
        train_vision: a VLM's vision tower and projector train too (``full``: all their
            parameters; ``lora``: adapters on every one of their linear layers; a projector that
            is a bare weight matrix, Gemma 3's, has no linear layer and stays frozen under LoRA);
            default frozen. No effect on text models.

    Raises:
        ValueError: unknown method, or ``lora_layers``/``top_k`` outside 1..num_layers.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    n = len(decoder_layers(model))
    if method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        if not train_vision:
            for _, p in vision_parameters(model):
                p.requires_grad_(False)
        return model
    for p in model.parameters():
        p.requires_grad_(False)
    if method == "top-k":
        if not 1 <= top_k <= n:
            raise ValueError(f"top_k must be in 1..{n} for this model, got {top_k}")
        for layer in decoder_layers(model)[n - top_k:]:
            for p in layer.parameters():
                p.requires_grad_(True)
        norm = getattr(model.get_decoder(), "norm", None)
        if norm is not None:
            for p in norm.parameters():
                p.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    if lora_layers is not None and not 1 <= lora_layers <= n:
        raise ValueError(f"lora_layers must be in 1..{n} for this model, got {lora_layers}")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora_targets if t in present]
    if not targets:
        raise ValueError(f"none of the LoRA target modules {list(lora_targets)} exist in {type(model).__name__}")
    layers = None if lora_layers is None else list(range(n - lora_layers, n))
    if is_vision_language(model):
        # Only the language model's decoder layers by default: a regex over qualified module
        # names (vision towers have projections of the same names, and lora_layers counts
        # decoder layers only). train_vision adds every linear layer of the vision tower and
        # projector, whatever their names (Qwen2-VL's are qkv / proj / fc1 / fc2).
        which = r"\d+" if layers is None else "(?:" + "|".join(str(i) for i in layers) + ")"
        patterns = [rf"{re.escape(_decoder_prefix(model))}\.layers\.{which}\..*\."
                    rf"(?:{'|'.join(map(re.escape, targets))})"]
        if train_vision:
            vision_ids = {id(p) for _, p in vision_parameters(model)}
            patterns += [re.escape(name) for name, module in model.named_modules()
                         if isinstance(module, torch.nn.Linear) and id(module.weight) in vision_ids]
        target_modules = "^(?:" + "|".join(patterns) + ")$"
        layers = None  # encoded in the pattern
    else:
        target_modules = targets
    cfg = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=target_modules,
                     layers_to_transform=layers, bias="none", task_type="CAUSAL_LM")
    with quiet_peft_checkpointing_warning():  # peft reads a property transformers 5 deprecated
        return get_peft_model(model, cfg)


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """The parameters that receive gradients, in a fixed (named) order."""
    return [p for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]) if p.requires_grad]


def trainable_state(model) -> dict[str, torch.Tensor]:
    """A CPU copy of the trainable parameters (to keep the best epoch)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model, state: dict[str, torch.Tensor]) -> None:
    """Copy a :func:`trainable_state` back into the model."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t.to(params[n].device))


def save_trained(model, tokenizer, output: Path, *, method: str, merge: bool = False, processor=None) -> list[str]:
    """Write the trained weights to ``output``; returns the files written.

    LoRA without ``merge``: the peft adapter only (``adapter_config.json``,
    ``adapter_model.safetensors``); the base model is named in ``training.json``. Otherwise the whole
    model (merged LoRA, full or top-k) as safetensors with its tokenizer (a VLM: its processor,
    which holds the tokenizer), loadable as a plain transformers directory.
    """
    output.mkdir(parents=True, exist_ok=True)
    before = set(p.name for p in output.iterdir())
    if method == "lora" and not merge:
        model.save_pretrained(str(output), safe_serialization=True)
    else:
        if method == "lora":
            model = model.merge_and_unload()
        model.save_pretrained(str(output), safe_serialization=True)
        (processor if processor is not None else tokenizer).save_pretrained(str(output))
    card = output / "README.md"  # peft's placeholder model card: training.json documents the model
    if "README.md" not in before and card.is_file():
        card.unlink()
    return sorted(set(p.name for p in output.iterdir()) - before)
