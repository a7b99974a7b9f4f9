"""Several LoRA adapters on one base model, unmerged, mixed in one forward pass.

Each targeted linear layer of the base is wrapped by :class:`MultiLoraLinear`, which computes, for
every row ``b`` of a batch with adapter ``a(b)``::

    y_b = x_b W^T + s_a (x_b A_a^T) B_a^T        (Hu et al., "LoRA", 2021: h = W0 x + B A x * alpha/r)

the base matmul once for the whole batch and the low-rank term per adapter over that adapter's rows
(rows of the base alone, adapter slot 0, add nothing). This is the segmented gather of Punica
(Chen et al., "Punica: Multi-Tenant LoRA Serving", 2023) written with torch ops: group the rows by
adapter, one ``(rows, in) @ (in, r) @ (r, out)`` product per group. It is the reference a fused
kernel (SGMV) would be tested against; merged into ``W`` alone, an adapter gives the same
probabilities within float rounding (``tests/test_adapters.py``: 1e-5).

Which adapter each row uses is set on the engine's :class:`LoraRouting` before each forward pass:
one slot for the whole batch, or a ``(B,)`` int64 tensor of slots.

An adapter is read from a folder written by ``noulengine train`` or any PEFT LoRA folder
(``adapter_config.json`` + ``adapter_model.safetensors``), as vLLM loads them; the tensors name the
modules they adapt, so ranks and target modules may differ between adapters. Refused, with the
rule named: DoRA, LoRA biases, ``modules_to_save``, trainable tokens, ``alpha_pattern``,
``fan_in_fan_out``, a module the base lacks or whose shape differs.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from noulengine.records.errors import NoulEngineError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


class AdapterError(NoulEngineError, ValueError):
    """An adapter that cannot be loaded or used: the message names the folder, the field and the rule."""


@dataclass
class LoraAdapter:
    """One adapter's low-rank factors, by module path of the base model.

    Attributes:
        name: the adapter's name (what a request's ``"adapter"`` names).
        path: the folder it was read from.
        modules: module path (``model.layers.3.self_attn.q_proj``) -> ``(A, B, scale)``: ``A`` float
            ``(r, in_features)``, ``B`` ``(out_features, r)``, ``scale`` = alpha / r (alpha /
            sqrt(r) with rsLoRA).
        training: the folder's ``training.json`` (a ``noulengine train`` folder), else None.
        base_name: the base the adapter names (``training.json``'s base, else PEFT's
            ``base_model_name_or_path``), for messages.
        base_sha256: the base's sha256 from ``training.json`` (None for a plain PEFT folder).
        nbytes: bytes of its factors.
    """

    name: str
    path: Path
    modules: dict[str, tuple[torch.Tensor, torch.Tensor, float]]
    training: dict | None = None
    base_name: str | None = None
    base_sha256: str | None = None
    calibration_path: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b, _ in self.modules.values())

    @property
    def ranks(self) -> set[int]:
        return {a.shape[0] for a, _, _ in self.modules.values()}


def read_adapter(name: str, path: str | Path) -> LoraAdapter:
    """Read a LoRA adapter folder (``noulengine train`` output or a PEFT LoRA folder).

    Raises:
        AdapterError: no such folder, no config or weights, an unsupported PEFT feature, a tensor
            pair that does not match (naming the folder, the field and the rule).
    """
    from safetensors.torch import load_file

    path = Path(path).expanduser()
    where = f"adapter {name!r} ({path})"
    if not (path / ADAPTER_CONFIG).is_file() or not (path / ADAPTER_WEIGHTS).is_file():
        raise AdapterError(f"{where}: needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (a folder written by noulengine "
                           "train, or a PEFT LoRA folder)")
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise AdapterError(f"{where}: {ADAPTER_CONFIG} is not valid JSON ({exc})") from None
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{where}: field 'peft_type' is {config.get('peft_type')!r}; only LORA adapters are served")
    refused = {"use_dora": "DoRA", "lora_bias": "LoRA biases", "fan_in_fan_out": "fan_in_fan_out (Conv1D) layers",
               "modules_to_save": "fully trained modules", "trainable_token_indices": "trainable tokens",
               "alpha_pattern": "per-module alphas"}
    for key, what in refused.items():
        if config.get(key):
            raise AdapterError(f"{where}: field {key!r} is set: {what} are not supported by the unmerged multi-adapter "
                               "path (merge this adapter into its base and load that folder instead)")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{where}: field 'bias' is {config['bias']!r}; only 'none' is supported")
    alpha = float(config.get("lora_alpha", 8))
    rslora = bool(config.get("use_rslora"))
    tensors = load_file(str(path / ADAPTER_WEIGHTS))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                module = key.split(marker)[0]
                module = module[len(_PEFT_PREFIX):] if module.startswith(_PEFT_PREFIX) else module
                pairs.setdefault(module, {})[part] = t
                break
        else:
            raise AdapterError(f"{where}: tensor {key!r} is neither lora_A nor lora_B (an unsupported adapter kind)")
    modules = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise AdapterError(f"{where}: module {module!r} has {sorted(ab)} but needs lora_A and lora_B")
        a, b = ab["lora_A"].float(), ab["lora_B"].float()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"{where}: module {module!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                               "form a rank-r pair")
        r = a.shape[0]
        modules[module] = (a, b, alpha / (math.sqrt(r) if rslora else r))
    if not modules:
        raise AdapterError(f"{where}: {ADAPTER_WEIGHTS} holds no LoRA factors")
    training_path = path / "training.json"
    training = json.loads(training_path.read_text(encoding="utf-8")) if training_path.is_file() else None
    base = (training or {}).get("base_model") or {}
    cal = path / "calibration.json"
    return LoraAdapter(name=name, path=path, modules=modules, training=training,
                       base_name=base.get("spec") or base.get("name") or config.get("base_model_name_or_path"),
                       base_sha256=base.get("sha256"), calibration_path=str(cal) if cal.is_file() else None)


class LoraRouting:
    """Which adapter slot each row of the next forward pass uses (0 = the base alone).

    ``rows`` is None (every row the base), an int (every row that slot) or a ``(B,)`` int64 tensor.
    """

    def __init__(self):
        self.rows: int | torch.Tensor | None = None

    @contextlib.contextmanager
    def use(self, rows):
        """Route the passes run inside the block: ``rows`` an int slot, a list or tensor of slots."""
        before = self.rows
        if isinstance(rows, (list, tuple)):
            rows = rows[0] if len(set(rows)) == 1 else torch.tensor(rows, dtype=torch.long)
        self.rows = rows
        try:
            yield
        finally:
            self.rows = before


class MultiLoraLinear(nn.Module):
    """A base :class:`torch.nn.Linear` plus the LoRA factors of any number of adapter slots.

    ``forward(x)``: ``x`` ``(B, L, in)`` (or ``(N, in)``); returns ``base(x)`` plus, for each row
    routed to slot ``k > 0`` that adapts this module, ``scale_k * (x_row @ A_k^T) @ B_k^T``, in
    ``x``'s dtype. The base weight is never modified.
    """

    def __init__(self, base: nn.Linear, routing: LoraRouting):
        super().__init__()
        self.base = base
        self.routing = routing
        self.factors: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self):
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self.routing.rows
        if rows is None or not self.factors:
            return y
        if isinstance(rows, int):
            if rows in self.factors:
                a, b, s = self.factors[rows]
                y = y + (x @ a.t().to(x.dtype)) @ b.t().to(x.dtype) * s
            return y
        if rows.shape[0] != x.shape[0]:
            raise RuntimeError(f"LoRA routing has {rows.shape[0]} rows for a batch of {x.shape[0]}")
        rows = rows.to(x.device)
        out = y.clone()
        for slot, (a, b, s) in self.factors.items():
            idx = (rows == slot).nonzero(as_tuple=True)[0]
            if idx.numel():
                xs = x.index_select(0, idx)
                out.index_add_(0, idx, (xs @ a.t().to(x.dtype)) @ b.t().to(x.dtype) * s)
        return out


@dataclass
class AdapterSet:
    """The adapters loaded on one engine: name -> slot (1, 2, ...), the wrapped modules, routing."""

    routing: LoraRouting = field(default_factory=LoraRouting)
    slots: dict[str, int] = field(default_factory=dict)
    adapters: dict[str, LoraAdapter] = field(default_factory=dict)
    wrapped: dict[str, MultiLoraLinear] = field(default_factory=dict)
    # the slot of requests that name no adapter: 0 (the base alone), or a trained model's own
    # adapter when it is served unmerged as the default (Engine.from_pretrained(..., unmerged=True))
    default_slot: int = 0
    _next: int = 1

    def slot(self, name: str | None) -> int:
        """The slot of adapter ``name`` (``default_slot`` for None: the base, or the default adapter).

        Raises:
            AdapterError: no adapter of that name is loaded (naming the loaded ones).
        """
        if name is None:
            return self.default_slot
        if name not in self.slots:
            loaded = ", ".join(sorted(self.slots)) or "none"
            raise AdapterError(f"field 'adapter': no adapter named {name!r} is loaded (loaded: {loaded})")
        return self.slots[name]

    def add(self, model: nn.Module, adapter: LoraAdapter, *, device, dtype) -> int:
        """Attach ``adapter``'s factors to ``model`` (wrapping each adapted linear layer once).

        Raises:
            AdapterError: the name is taken, a module is missing or not a linear layer, or a factor's
                shape does not fit the module.
        """
        if adapter.name in self.slots:
            raise AdapterError(f"adapter {adapter.name!r} is already loaded; unload it first")
        modules = dict(model.named_modules())
        for path, (a, b, _) in adapter.modules.items():
            target = self.wrapped.get(path) or modules.get(path)
            if target is None:
                raise AdapterError(f"adapter {adapter.name!r} ({adapter.path}): module {path!r} is not in this base model "
                                   f"(made for {adapter.base_name!r}?)")
            if not isinstance(target, (nn.Linear, MultiLoraLinear)):
                raise AdapterError(f"adapter {adapter.name!r}: module {path!r} is a {type(target).__name__}, not a "
                                   "linear layer")
            if a.shape[1] != target.in_features or b.shape[0] != target.out_features:
                raise AdapterError(f"adapter {adapter.name!r} ({adapter.path}): module {path!r} is {target.in_features} -> "
                                   f"{target.out_features} in this base, the adapter's factors {a.shape[1]} -> "
                                   f"{b.shape[0]} (made for another base: {adapter.base_name!r})")
        slot = self._next
        self._next += 1
        for path, (a, b, s) in adapter.modules.items():
            wrapper = self.wrapped.get(path)
            if wrapper is None:
                parent_path, _, child = path.rpartition(".")
                parent = modules[parent_path] if parent_path else model
                wrapper = MultiLoraLinear(getattr(parent, child), self.routing)
                setattr(parent, child, wrapper)
                self.wrapped[path] = wrapper
            wrapper.factors[slot] = (a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype), s)
        self.slots[adapter.name] = slot
        self.adapters[adapter.name] = adapter
        return slot

    def remove(self, name: str) -> None:
        """Detach adapter ``name`` (its slot is never reused, so no stale prefix can match it).

        Raises:
            AdapterError: no adapter of that name is loaded.
        """
        slot = self.slot(name)
        for wrapper in self.wrapped.values():
            wrapper.factors.pop(slot, None)
        del self.slots[name]
        del self.adapters[name]
