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
file, the field and the rule named (:class:`AdapterError`, never another exception): DoRA, LoRA
biases, ``modules_to_save``, trainable tokens, ``alpha_pattern``, ``fan_in_fan_out``, a module the
base lacks or whose shape differs; a config that is not a JSON object or has a field of the wrong
type or value; a safetensors file that is truncated or corrupt (its header checked against the
file's size before any tensor is read, :func:`safetensors_header`), a tensor that is not a 2-D
floating-point matrix or holds non-finite values; factors over a size cap (``max_bytes``); with a
``root`` (a server's ``--adapter-root``), a file of the folder that links out of it.
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


class AdapterAccessError(AdapterError):
    """A folder, or a file in it, outside the server's adapter root, or run-time loading off (HTTP 403)."""


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


# -- reading a folder ---------------------------------------------------------------------------
#
# Every rule below refuses with an AdapterError naming the folder, the file, the field and the rule
# (the server answers 400 ``adapter_refused`` with that text): a folder that cannot be read as an
# adapter never raises anything else, whether it is loaded at start, at run time or again after an
# eviction (tests/test_adapter_hardening.py).

MAX_JSON_BYTES = 1 << 20  # adapter_config.json, training.json: a PEFT config is a few KiB
MAX_HEADER_BYTES = 16 << 20  # a safetensors JSON header (safetensors itself stops at 100 MB)
# safetensors dtype -> bytes per element: LoRA factors are floating point
FLOAT_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_FOLDER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, "training.json", "calibration.json")


def _number(where: str, field_name: str, value, default: float) -> float:
    """A finite JSON number (not a boolean), else an AdapterError naming the field."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AdapterError(f"{where}: {ADAPTER_CONFIG} field {field_name!r}: expected a finite number, got "
                           f"{value!r} ({type(value).__name__})")
    return float(value)


def _read_json_object(where: str, file: Path) -> dict:
    """``file`` parsed as a JSON object of at most :data:`MAX_JSON_BYTES` (strict: no NaN/Infinity)."""
    try:
        with open(file, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise AdapterError(f"{where}: {file.name} cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise AdapterError(f"{where}: {file.name} is over {MAX_JSON_BYTES} bytes (a JSON config is a few KiB)")
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=lambda c: _reject(c))
    except (ValueError, RecursionError) as exc:
        raise AdapterError(f"{where}: {file.name} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise AdapterError(f"{where}: {file.name} must hold a JSON object, got a {type(value).__name__}")
    return value


def _reject(constant: str):
    raise ValueError(f"{constant} is not valid JSON")


def adapter_files(name: str, path: str | Path, *, root: Path | None = None) -> Path:
    """The folder of adapter ``name``, checked before any file in it is read.

    With ``root`` (a server's ``--adapter-root``, already resolved), the folder and every entry in it
    that is a symbolic link must resolve inside ``root``, as the folder itself does; a link out is
    refused without reading, or naming, its target. The files read (``adapter_config.json``,
    ``adapter_model.safetensors``, ``training.json``, ``calibration.json`` and the weight files
    hashed for a calibration check) must be regular files, never a FIFO or a device.

    Raises:
        AdapterError: no such folder or files; an entry resolves outside ``root``
            (:class:`AdapterAccessError`); a path that cannot be resolved (a symlink loop, a
            component over the system's limit).
    """
    path = Path(path).expanduser()
    where = f"adapter {name!r} ({path})"
    try:
        entries = list(path.iterdir()) if path.is_dir() else None
        if entries is None:
            raise AdapterError(f"{where}: needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} in a folder, and there is no "
                               "such folder (give a folder written by noulengine train, or a PEFT LoRA folder)")
        if root is not None:
            folder = path.resolve(strict=True)
            if folder != root and root not in folder.parents:
                raise AdapterAccessError(f"{where}: the folder lies outside the adapter root")
        for entry in entries:
            read = entry.name in _FOLDER_FILES or entry.suffix in (".safetensors", ".bin", ".gguf")
            if root is not None and entry.is_symlink():
                target = entry.resolve(strict=False)
                if target != root and root not in target.parents:
                    raise AdapterAccessError(f"{where}: {entry.name} is a link that resolves outside the adapter "
                                             "root (files of an adapter folder must lie under the root too)")
            if read and entry.exists() and not entry.is_file():
                raise AdapterError(f"{where}: {entry.name} is not a regular file")
    except (OSError, RuntimeError, ValueError) as exc:  # ELOOP, ENAMETOOLONG, Python's "Symlink loop"
        if isinstance(exc, AdapterError):
            raise
        raise AdapterError(f"{where}: the folder cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    if not (path / ADAPTER_CONFIG).is_file() or not (path / ADAPTER_WEIGHTS).is_file():
        raise AdapterError(f"{where}: needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (a folder written by noulengine "
                           "train, or a PEFT LoRA folder)")
    return path


def read_adapter_config(where: str, path: Path) -> tuple[float, bool, str | None]:
    """``adapter_config.json``'s ``(lora_alpha, use_rslora, base_model_name_or_path)``, every field
    this path serves checked for its type and value.

    Raises:
        AdapterError: not a JSON object; ``peft_type`` other than LORA; a refused PEFT feature set;
            ``bias`` other than ``"none"``; ``lora_alpha`` not a finite number; ``use_rslora`` not a
            boolean; ``base_model_name_or_path`` not a string.
    """
    config = _read_json_object(where, path / ADAPTER_CONFIG)
    peft_type = config.get("peft_type", "LORA")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise AdapterError(f"{where}: {ADAPTER_CONFIG} field 'peft_type' is {peft_type!r}; only LORA adapters are "
                           "served")
    refused = {"use_dora": "DoRA", "lora_bias": "LoRA biases", "fan_in_fan_out": "fan_in_fan_out (Conv1D) layers",
               "modules_to_save": "fully trained modules", "trainable_token_indices": "trainable tokens",
               "alpha_pattern": "per-module alphas"}
    for key, what in refused.items():
        if config.get(key):
            raise AdapterError(f"{where}: field {key!r} is set: {what} are not supported by the unmerged multi-adapter "
                               "path (merge this adapter into its base and load that folder instead)")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{where}: field 'bias' is {config['bias']!r}; only 'none' is supported")
    alpha = _number(where, "lora_alpha", config.get("lora_alpha"), 8.0)
    rslora = config.get("use_rslora")
    if rslora is not None and not isinstance(rslora, bool):
        raise AdapterError(f"{where}: {ADAPTER_CONFIG} field 'use_rslora': expected true or false, got {rslora!r}")
    base = config.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise AdapterError(f"{where}: {ADAPTER_CONFIG} field 'base_model_name_or_path': expected a string, got "
                           f"{type(base).__name__}")
    return alpha, bool(rslora), base


def safetensors_header(where: str, file: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int]:
    """Read and check the JSON header of a safetensors file without reading its tensors.

    Returns:
        ``({tensor name: (dtype, shape)}, bytes of tensor data)``.

    Raises:
        AdapterError: a header that is truncated, over :data:`MAX_HEADER_BYTES`, not a JSON object,
            or whose entries are malformed; a dtype that is not floating point
            (:data:`FLOAT_DTYPES`); a tensor that is not 2-D; offsets that do not match the shape
            and dtype; a file shorter or longer than its header declares (truncated or corrupt).
    """
    label = f"{where}: {file.name}"
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise AdapterError(f"{label} is {size} bytes: too short for a safetensors header (truncated?)")
            n = int.from_bytes(prefix, "little")
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise AdapterError(f"{label}: its header declares {n} bytes, the file holds {size} (truncated or not "
                                   "a safetensors file)")
            raw = fh.read(n)
    except OSError as exc:
        raise AdapterError(f"{label} cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise AdapterError(f"{label}: the header is not valid JSON (a corrupt or non-safetensors file)") from None
    if not isinstance(header, dict):
        raise AdapterError(f"{label}: the header must be a JSON object, got a {type(header).__name__}")
    tensors, spans = {}, []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict) or set(entry) - {"dtype", "shape", "data_offsets"}:
            raise AdapterError(f"{label}: tensor {key!r}: expected an object with dtype, shape, data_offsets")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in FLOAT_DTYPES:
            raise AdapterError(f"{label}: tensor {key!r} field 'dtype' is {dtype!r}; LoRA factors are floating point "
                               f"({', '.join(FLOAT_DTYPES)})")
        if (not isinstance(shape, list) or len(shape) != 2
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)):
            raise AdapterError(f"{label}: tensor {key!r} field 'shape' is {shape!r}; a LoRA factor is a 2-D matrix "
                               "with positive sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise AdapterError(f"{label}: tensor {key!r} field 'data_offsets' is {offsets!r}; expected [begin, end]")
        nbytes = shape[0] * shape[1] * FLOAT_DTYPES[dtype]
        if offsets[1] - offsets[0] != nbytes:
            raise AdapterError(f"{label}: tensor {key!r}: data_offsets {offsets} span {offsets[1] - offsets[0]} bytes, "
                               f"its shape {shape} of {dtype} needs {nbytes}")
        tensors[key] = (dtype, tuple(shape))
        spans.append(tuple(offsets))
    total = 0
    for begin, end in sorted(spans):  # the data is the tensors back to back, as safetensors writes it
        if begin != total:
            raise AdapterError(f"{label}: tensor data is not contiguous at byte {begin} (a corrupt file)")
        total = end
    if 8 + n + total != size:
        raise AdapterError(f"{label}: the header declares {total} bytes of tensors, the file holds {size - 8 - n} "
                           "(truncated or corrupt)")
    return tensors, total


def check_adapter_folder(name: str, path: str | Path, *, root: Path | None = None,
                         max_bytes: int | None = None) -> int:
    """Everything :func:`read_adapter` checks before it reads the factors: the folder and its files
    (:func:`adapter_files`, confined to ``root`` when given), ``adapter_config.json``
    (:func:`read_adapter_config`) and the safetensors header (:func:`safetensors_header`), and
    the factors' size against ``max_bytes`` (a server's ``--max-adapter-bytes``).

    Returns:
        The bytes of the factors as stored.

    Raises:
        AdapterError: as those functions; factors over ``max_bytes``, naming both sizes.
    """
    return _check(name, path, root, max_bytes)[-1]


def _check(name, path, root, max_bytes) -> tuple[Path, str, float, bool, str | None, int]:
    path = adapter_files(name, path, root=root)
    where = f"adapter {name!r} ({path})"
    alpha, rslora, base_model = read_adapter_config(where, path)
    _, total = safetensors_header(where, path / ADAPTER_WEIGHTS)
    if max_bytes is not None and total > max_bytes:
        raise AdapterError(f"{where}: {ADAPTER_WEIGHTS} holds {total} bytes of factors, over this server's "
                           f"--max-adapter-bytes {max_bytes}")
    return path, where, alpha, rslora, base_model, total


def read_adapter(name: str, path: str | Path, *, root: Path | None = None, max_bytes: int | None = None) -> LoraAdapter:
    """Read a LoRA adapter folder (``noulengine train`` output or a PEFT LoRA folder).

    The steps, in order: the folder and its files (confined to ``root`` when given), the config, the
    safetensors header and the size cap (:func:`check_adapter_folder`; nothing of the weights read
    yet), then the tensors; each ``lora_A`` ``(r, in)`` / ``lora_B`` ``(out, r)`` pair is checked
    and cast to float32 on CPU; ``training.json`` last.

    Raises:
        AdapterError: no such folder, no config or weights, an unsupported PEFT feature, a field of
            the wrong type or value, a truncated or corrupt weights file, a tensor of the wrong
            dtype, shape or with non-finite values, a tensor pair that does not match (naming the
            folder, the file, the field and the rule).
    """
    from safetensors.torch import load_file

    path, where, alpha, rslora, base_model, _ = _check(name, path, root, max_bytes)
    try:
        tensors = load_file(str(path / ADAPTER_WEIGHTS))
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: the file changed or is corrupt
        raise AdapterError(f"{where}: {ADAPTER_WEIGHTS} cannot be read as safetensors ({type(exc).__name__}: "
                           f"{str(exc)[:200]})") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                module = key.split(marker)[0]
                module = module[len(_PEFT_PREFIX):] if module.startswith(_PEFT_PREFIX) else module
                if part in pairs.get(module, {}):
                    raise AdapterError(f"{where}: {ADAPTER_WEIGHTS}: module {module!r} has two {part} tensors")
                pairs.setdefault(module, {})[part] = t
                break
        else:
            raise AdapterError(f"{where}: tensor {key!r} is neither lora_A nor lora_B (an unsupported adapter kind)")
    modules = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise AdapterError(f"{where}: module {module!r} has {sorted(ab)} but needs lora_A and lora_B")
        if not ab["lora_A"].is_floating_point() or not ab["lora_B"].is_floating_point():
            raise AdapterError(f"{where}: module {module!r}: LoRA factors are floating point, got "
                               f"{ab['lora_A'].dtype} and {ab['lora_B'].dtype}")
        a, b = ab["lora_A"].float(), ab["lora_B"].float()  # (r, in), (out, r)
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] < 1:
            raise AdapterError(f"{where}: module {module!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                               "form a rank-r pair")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"{where}: {ADAPTER_WEIGHTS}: module {module!r}: the factors hold non-finite values")
        r = a.shape[0]
        modules[module] = (a, b, alpha / (math.sqrt(r) if rslora else r))
    if not modules:
        raise AdapterError(f"{where}: {ADAPTER_WEIGHTS} holds no LoRA factors")
    training_path = path / "training.json"
    training = _read_json_object(where, training_path) if training_path.is_file() else None
    base = (training or {}).get("base_model") or {}
    if not isinstance(base, dict):
        raise AdapterError(f"{where}: training.json field 'base_model': expected an object, got {type(base).__name__}")
    for key in ("spec", "name", "sha256"):
        if base.get(key) is not None and not isinstance(base[key], str):
            raise AdapterError(f"{where}: training.json field 'base_model.{key}': expected a string, got "
                               f"{type(base[key]).__name__}")
    for key in ("readout", "layout", "name"):
        if (training or {}).get(key) is not None and not isinstance(training[key], str):
            raise AdapterError(f"{where}: training.json field {key!r}: expected a string, got "
                               f"{type(training[key]).__name__}")
    cal = path / "calibration.json"
    return LoraAdapter(name=name, path=path, modules=modules, training=training,
                       base_name=base.get("spec") or base.get("name") or base_model,
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
