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

import json
import os
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
        _sort_target_modules(output / "adapter_config.json")
    else:
        if method == "lora":
            model = model.merge_and_unload()
        model.save_pretrained(str(output), safe_serialization=True)
        (processor if processor is not None else tokenizer).save_pretrained(str(output))
    card = output / "README.md"  # peft's placeholder model card: training.json documents the model
    if "README.md" not in before and card.is_file():
        card.unlink()
    written = sorted(set(p.name for p in output.iterdir()) - before)
    _same_mode_as_config(output, written)
    return written


def _same_mode_as_config(output: Path, written: list[str]) -> None:
    """Give the ``*.safetensors`` files written the mode of the JSON config written beside them.

    safetensors writes through a private temporary file (mode 0600) renamed into place, while the
    configs are written with ``open`` (0666 less the umask, usually 0644): a folder meant to be
    shared or served by another user had one file only its owner could read."""
    config = next((output / n for n in ("adapter_config.json", "config.json") if n in written), None)
    if config is None:
        return
    mode = config.stat().st_mode & 0o777
    for name in written:
        if name.endswith(".safetensors"):
            os.chmod(output / name, mode)


def _sort_target_modules(config: Path) -> None:
    """Rewrite peft's ``adapter_config.json`` with ``target_modules`` sorted.

    peft keeps a list of target module names as a ``set`` and writes it in the set's iteration
    order, which for strings changes with ``PYTHONHASHSEED`` (random per process): two runs that
    train the same adapter bytes would otherwise write configs that differ in bytes (measured on
    the recipe's reproduction run, session 20). The content is the same set; peft's own format is
    kept (``json.dumps(..., indent=2, sort_keys=True)``)."""
    if not config.is_file():
        return
    data = json.loads(config.read_text(encoding="utf-8"))
    if isinstance(data.get("target_modules"), list):
        data["target_modules"] = sorted(data["target_modules"])
        config.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")


ADAPTER_WEIGHTS = "adapter_model.safetensors"
TRAINING_FORMAT = "noulengine-training"  # training.json's "format" (the trainer writes this one)
# adapter_config.json fields that change what a LoRA tensor means without changing its shape: an
# adapter differing in one of them would load and give another model; each maps to the flag that sets
# it here (None: no flag, this trainer always uses the peft default).
_LORA_FIELDS = (("r", "--lora-r"), ("lora_alpha", "--lora-alpha"), ("target_modules", "--lora-layers / --train-vision"),
                ("layers_to_transform", "--lora-layers"), ("use_rslora", None), ("use_dora", None),
                ("alpha_pattern", None), ("rank_pattern", None), ("bias", None))
_PEFT_DEFAULTS = {"use_rslora": False, "use_dora": False, "alpha_pattern": {}, "rank_pattern": {}, "bias": "none"}


class InitAdapterError(ValueError):
    """``--init-adapter`` names an adapter this run cannot start from (message: the field and rule)."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InitAdapterError(f"--init-adapter {path.parent}: {path.name} is not readable JSON ({e})") from None


def check_init_adapter_files(adapter_dir) -> Path:
    """Fail fast (before a base model loads): ``adapter_dir`` must hold a LoRA adapter's two files.

    Raises:
        InitAdapterError: a missing folder or file; a merged model's folder is named as such.
    """
    folder = Path(adapter_dir)
    if not folder.is_dir():
        raise InitAdapterError(f"--init-adapter {folder}: no such folder")
    for name in ("adapter_config.json", ADAPTER_WEIGHTS):
        if not (folder / name).is_file():
            merged = (folder / "config.json").is_file()
            raise InitAdapterError(f"--init-adapter {folder}: no {name} there (a LoRA adapter folder has "
                                   f"adapter_config.json and {ADAPTER_WEIGHTS})"
                                   + ("; this folder holds full model weights (a --merge true or full/top-k run): "
                                      "continue from the adapter itself, or give the folder as --model" if merged else ""))
    return folder


def _normalised(key: str, value, n_layers: int | None):
    if key == "target_modules" and value is not None and not isinstance(value, str):
        return sorted(value)
    if key == "layers_to_transform" and value is not None and n_layers is not None and sorted(value) == list(range(n_layers)):
        return None  # every layer, as when no layers are named
    if key in _PEFT_DEFAULTS and value is None:
        return _PEFT_DEFAULTS[key]
    return value


def init_lora_from_adapter(model, adapter_dir, *, base_sha256: str | None = None, layout: str | None = None,
                           readout: str | None = None, prompt_version: str | None = None) -> dict:
    """Copy a trained LoRA adapter's weights into a freshly peft-wrapped ``model`` (continued fine-tuning).

    The run's own LoRA settings must be the adapter's (from its ``adapter_config.json``: rank ``r``,
    ``lora_alpha``, target modules, ``layers_to_transform``, and the fields that change what a tensor
    means without changing its shape: ``use_rslora``, ``use_dora``, ``alpha_pattern``,
    ``rank_pattern``, ``bias``), and every LoRA tensor of the run must be in the file with the same
    shape (float32 on the model's device after the copy): the saved result is then a complete adapter
    of the base, not a second adapter stacked on the first. Where the folder holds a noulengine
    ``training.json`` (``format`` ``noulengine-training``), its base (sha256), prompt layout, prompt
    version and readout must be the run's too. A peft adapter without one is accepted with
    ``verified_base: false``: its base cannot be checked.

    Args:
        model: what :func:`apply_method` returned with ``method="lora"``.
        adapter_dir: folder with ``adapter_config.json`` and ``adapter_model.safetensors``.
        base_sha256 / layout / readout / prompt_version: this run's, compared with the adapter's
            ``training.json``.

    Returns:
        ``{"path", "sha256", "tensors", "name", "steps", "verified_base"}`` for ``training.json``.

    Raises:
        InitAdapterError: a missing or unreadable file, other LoRA settings, base, layout, prompt
            version or readout, or tensors missing, extra or of another shape.
    """
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    from noulengine.models.loading import sha256_file

    folder = check_init_adapter_files(adapter_dir)
    cfg_path, weights_path = folder / "adapter_config.json", folder / ADAPTER_WEIGHTS
    saved = _read_json(cfg_path)
    run = model.peft_config["default"]
    try:
        n_layers = len(decoder_layers(model.get_base_model()))
    except (AttributeError, ValueError):
        n_layers = None
    problems = []
    if saved.get("peft_type", "LORA") != "LORA":
        problems.append(f"adapter_config.json peft_type is {saved.get('peft_type')!r}, not a LoRA adapter")
    for key, flag in _LORA_FIELDS:
        mine = _normalised(key, getattr(run, key, None), n_layers)
        theirs = _normalised(key, saved.get(key, _PEFT_DEFAULTS.get(key)), n_layers)
        if mine != theirs:
            how = f"(set by {flag})" if flag else "(this trainer always uses peft's default)"
            problems.append(f"adapter_config.json {key} is {theirs!r}, this run's is {mine!r} {how}")
    info = {}
    training_path = folder / "training.json"
    if training_path.is_file():
        info = _read_json(training_path)
        if info.get("format") != TRAINING_FORMAT:
            info = {}  # another tool's training.json: nothing of ours to compare
    if info:
        for key, flag, mine, theirs in (
                ("base_model.sha256", "--model", base_sha256, (info.get("base_model") or {}).get("sha256")),
                ("layout", "--layout", layout, info.get("layout", "state-first")),
                ("prompt_version", None, prompt_version, info.get("prompt_version")),
                ("readout", "--readout", readout, info.get("readout"))):
            if mine is not None and theirs != mine:
                how = f"(set by {flag})" if flag else "(the prompt changed since the adapter was trained)"
                problems.append(f"training.json {key} is {theirs!r}, this run's is {mine!r} {how}")
    if problems:
        raise InitAdapterError(f"--init-adapter {folder}: cannot start this run from it:\n  " + "\n  ".join(problems))
    weights = load_file(str(weights_path))
    want = get_peft_model_state_dict(model)
    missing = sorted(set(want) - set(weights))
    extra = sorted(set(weights) - set(want))
    shapes = [k for k in want if k in weights and tuple(weights[k].shape) != tuple(want[k].shape)]
    if missing or extra or shapes:
        raise InitAdapterError(f"--init-adapter {folder}: {ADAPTER_WEIGHTS} does not fit this run: "
                               f"{len(missing)} tensors missing (first {missing[:2]}), {len(extra)} extra "
                               f"(first {extra[:2]}), {len(shapes)} of another shape (first {shapes[:2]})")
    set_peft_model_state_dict(model, {k: v.to(torch.float32) for k, v in weights.items()})
    return {"path": str(folder.resolve()), "sha256": sha256_file(weights_path),
            "tensors": len(weights), "name": info.get("name"), "steps": info.get("steps"),
            "verified_base": bool(info)}
