"""The decision engine: requests in, calibrated candidate probabilities out, one pass per request.

Pipeline for a list of requests:

1. compile each request to a packed token tree (shared prefix, one branch per question);
2. plan batches longest first within a padded-token budget;
3. per batch: collate (4D tree mask, position ids), run the base model once, read candidate
   log-probabilities at the answer positions (candidate rows of the head only);
4. per question: combine views, subtract a contextual prior, apply temperature, softmax.

A request's answer does not depend on its neighbours, its slot or the batch size (masks isolate
rows; tested).
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Protocol

import torch

from noulengine.compile import Compiler, CompilerConfig
from noulengine.compile.render import layout_of_prompt_version
from noulengine.compile.layout import CompiledRequest
from noulengine.engine.batching import collate, plan_batches
from noulengine.engine.config import EngineConfig  # noqa: F401 - re-exported (noulengine.EngineConfig)
from noulengine.engine.decision import Decision, make_answer
from noulengine.engine.model_runner import ModelRunner, pick_device, pick_dtype
from noulengine.engine.prefix_cache import chunked_hidden_steps, prefix_cache_unsupported, prefix_cached_hidden_batch
from noulengine.engine.lora import AdapterError, AdapterSet, read_adapter
from noulengine.engine.prefix_store import (PrefixKVStore, causal_batch_hidden, drain, mixed_causal_batch_hidden,
                                           prefix_chain)
from noulengine.engine.readout import batch_candidate_logprobs
from noulengine.records.errors import NonFiniteLogitsError, NoulEngineError, RecordError, UnsupportedModalityError
from noulengine.records.schema import Question, Request, request_from_json
from noulengine.vision.adapters import adapter_for, is_vision_language

CONTENT_FREE_STATES = ("N/A", "", "[MASK]")  # Zhao et al. 2021, "Calibrate Before Use"


def _error_dict(exc: Exception, record_id=None) -> dict:
    """One error row shape for every failure: ``error_type``, ``message``, ``record_id``, ``field``,
    ``rule``, ``file``, ``line`` (None where they do not apply)."""
    if isinstance(exc, RecordError):
        out = exc.to_dict()
        if out.get("record_id") is None:
            out["record_id"] = record_id
        return out
    return {"error_type": type(exc).__name__, "message": str(exc), "record_id": record_id,
            "field": getattr(exc, "field", None),
            "rule": getattr(exc, "rule", None) or str(exc), "file": None, "line": None}


class Temperatures(Protocol):
    """What the engine needs from a calibration: a temperature per question group (Guo et al.
    2017, ``p = softmax(z / T)``). :class:`~noulengine.calibrate.file.Calibration` is one."""

    def temperature_for(self, qtype: str, num_candidates: int) -> float: ...


def precheck_adapters(name_or_path, adapters: dict, dtype: str | None = None, *,
                      max_bytes: int | None = None) -> Path | None:
    """Check, before any weights load, that ``adapters`` (``{name: folder or shipped name}``) can
    join the model ``name_or_path`` (anything :meth:`Engine.from_pretrained` takes).

    Returns:
        The folder of the trained model ``name_or_path`` names (the default, a shipped name, a
        ``noulengine train`` or ``noulengine merge`` folder), which is then served unmerged; None
        for a base model (an embedded base, a transformers folder, a ``.gguf``).

    Raises:
        AdapterError: int8 weights (adapters need float weights: drop ``--dtype int8``); a folder
            that is not a LoRA adapter (its files, config and safetensors header, and its factors'
            size against ``max_bytes``: nothing of the factors is read here); an adapter trained on another base than the model's (naming
            both, and the ``--model`` that serves it).
    """
    from noulengine.engine.lora import ADAPTER_CONFIG, check_adapter_folder
    from noulengine.models.embedded import embedded_base
    from noulengine.models.loading import (BASE_ALIAS, ModelNotFoundError, check_shipped_pin, default_base,
                                           default_model_spec, is_base_name, read_training, shipped_model_dir)

    spec = default_model_spec() if name_or_path is None else name_or_path
    trained, base_sha = None, None
    if is_base_name(spec):
        base = default_base() if spec == BASE_ALIAS else embedded_base(spec)
        base_sha = base.sha256 if base is not None else None
    else:
        folder = shipped_model_dir(spec) or Path(spec).expanduser()
        training = read_training(folder) if folder.is_dir() else None
        if training is not None and (folder / ADAPTER_CONFIG).is_file():
            trained, base_sha = folder, (training.get("base_model") or {}).get("sha256")
    if trained is not None:
        own = (read_training(trained) or {}).get("name") or trained.name
        if own in adapters:
            raise AdapterError(f"--adapter {own}=...: {own!r} is the name of the model itself (it answers every "
                               "request that names no adapter); give the adapter another name")
    if adapters and dtype == "int8":
        raise AdapterError("adapters are served on float weights only, and --dtype int8 quantizes them: drop "
                           "--dtype int8 to serve --adapter")
    shown = "the default model" if name_or_path is None else f"--model {name_or_path}"
    for name, path in adapters.items():
        folder = shipped_model_dir(path) or Path(path).expanduser()
        if folder.is_dir():
            try:
                check_shipped_pin(folder)
            except ModelNotFoundError as exc:
                raise AdapterError(f"adapter {name!r}: {exc}") from None
        check_adapter_folder(name, folder, max_bytes=max_bytes)  # config and header: no factor is read
        theirs = ((read_training(folder) or {}).get("base_model") or {})
        their_sha, their_name = theirs.get("sha256"), theirs.get("spec") or theirs.get("name")
        if their_sha and base_sha and their_sha != base_sha:
            raise AdapterError(f"adapter {name!r} ({folder}) was trained on base {their_name!r} (sha256 "
                               f"{their_sha[:12]}…), and {shown} is on another base (sha256 "
                               f"{base_sha[:12]}…): serve it with --model {their_name} (its base)")
    return trained


def _read_temperatures(config: EngineConfig, identity) -> Temperatures | None:
    """The temperatures ``config.calibration`` names, read by the model loader (which owns files
    on disk) and checked against this model's identity, readout and debias mode; None without one."""
    if not config.calibration or config.calibration == "none":
        return None
    from noulengine.models.loading import load_temperatures

    return load_temperatures(config.calibration, identity=identity, readout=config.readout, debias=config.debias,
                             layout=config.layout if config.layout not in (None, "auto") else "state-first")


class DecideJob:
    """A batch of requests answered one forward pass at a time (:meth:`Engine.start_batch`).

    Call :meth:`step` until it returns False, then read :attr:`decisions` (one per request, in
    input order, as :meth:`Engine.decide_batch` returns them). With ``on_error="raise"`` a bad
    request's error is raised by the step that compiles it (the first).
    """

    def __init__(self, steps):
        self._steps = steps
        self.steps = 0  # forward passes run so far
        self.decisions: list[Decision] | None = None

    @property
    def done(self) -> bool:
        return self.decisions is not None

    def step(self) -> bool:
        """Run the next forward pass (the first step also compiles); True while passes remain."""
        if self.decisions is not None:
            return False
        try:
            next(self._steps)
        except StopIteration as stop:
            self.decisions = stop.value
            return False
        self.steps += 1
        return True


class Engine:
    """A causal LM turned into a decision model.

    Use :meth:`from_pretrained` (default model, a local directory or a GGUF file) or
    :meth:`from_model` (an already loaded transformers model and tokenizer).
    """

    def __init__(self, model, tokenizer, config: EngineConfig | None = None, *, identity=None, processor=None,
                 temperatures: Temperatures | None = None):
        """Wrap a loaded model.

        Args:
            model, tokenizer: a transformers causal LM (or VLM) and its tokenizer.
            config: engine settings; ``config.calibration`` only records where ``temperatures``
                came from (the engine receives temperatures, it does not read files: use
                :meth:`from_pretrained` or :meth:`from_model` to load a calibration file).
            identity: the model's name, path and sha256 (run keys, calibration checks).
            processor: a vision-language model's processor.
            temperatures: fitted temperatures (a :class:`~noulengine.calibrate.file.Calibration`
                or anything with ``temperature_for(question_type, num_candidates) -> float``),
                or None for T = 1.

        Raises:
            ValueError: ``config.calibration`` names a file but no ``temperatures`` were given.
        """
        from noulengine.threads import apply_env_threads

        apply_env_threads()  # NOULENGINE_THREADS, when set (the commands set their default before loading)
        self.config = config or EngineConfig()
        if self.config.layout in (None, "auto"):
            self.config.layout = "state-first"  # from_pretrained resolves a trained model's own layout first
        self.processor = processor
        vision = None
        if is_vision_language(model) and processor is not None:
            vision = adapter_for(model.config, processor)  # raises for a family without an adapter
        self.runner = ModelRunner(model, vision=vision)
        self.tokenizer = tokenizer
        max_pos = self.config.max_positions or self.runner.max_positions
        self.compiler = Compiler(tokenizer, vision=vision, config=CompilerConfig(
            readout=self.config.readout, debias="permute" if self.config.debias == "permute" else "none",
            max_positions=max_pos, max_packed_tokens=max(self.config.batch_tokens, max_pos),
            use_chat_template=self.config.use_chat_template, symbols_fallback=bool(self.config.symbols_fallback),
            layout=self.config.layout))
        self.identity = identity
        self._base_identity = None  # set when a trained model is served unmerged (base_identity)
        self.default_adapter: str | None = None
        self.training = None  # training.json of a trained model (set by from_pretrained)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._priors: dict[tuple[int, str], torch.Tensor] = {}  # (adapter slot, question template)
        if self.config.prefix_cache_min_tokens < 0:
            raise ValueError(f"prefix_cache_min_tokens must be >= 0, got {self.config.prefix_cache_min_tokens}")
        if self.config.chunk_tokens < 0:
            raise ValueError(f"chunk_tokens must be >= 0 (0 turns chunked scheduling off), got {self.config.chunk_tokens}")
        if self.config.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 turns cross-request prefix caching off), "
                             f"got {self.config.prefix_cache_mb}")
        # Cross-request prefix caching (prefix_store.py): built with the engine, the frame head
        # prefilled on first use. None where the model's cache cannot hold a prefix exactly.
        self.prefix_store = (PrefixKVStore(int(self.config.prefix_cache_mb * 2**20))
                             if self.config.prefix_cache_mb > 0 and prefix_cache_unsupported(self.runner) is None
                             else None)
        self._frame_head_seeded = False
        self._static_seen: OrderedDict[int, None] = OrderedDict()  # static prefixes seen (admission)
        if temperatures is None and self.config.calibration and self.config.calibration != "none":
            raise ValueError(f"config.calibration={self.config.calibration!r} but no temperatures were given: the "
                             "engine receives temperatures, not files; load the file with Engine.from_pretrained("
                             "..., calibration=path) or Engine.from_model(..., calibration=path)")
        self.calibration = temperatures
        # LoRA adapters served unmerged beside the model (load_adapter; noulengine/engine/lora.py)
        self.adapters = AdapterSet()
        self._adapter_temperatures: dict[int, Temperatures | None] = {}

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str | None = None, *, device: str | None = None, dtype: str | None = None,
                        readout: str = "auto", adapters: dict | None = None, unmerged: bool | None = None,
                        **kwargs) -> "Engine":
        """Load a model and build an engine.

        Args:
            name_or_path: None for the embedded default decision model (SmolLM2-135M-Instruct
                plus the committed LoRA adapter trained by ``scripts/train_default.py``, with its
                fitted temperatures), a shipped decision model's name (``"noul-smollm2-135m-v2"``:
                ``noulengine.models.loading.SHIPPED_ADAPTER_SHA256``; older defaults stay loadable),
                ``"base"`` for the default's untrained base, an embedded base's name
                (``"SmolLM2-135M-Instruct"``, ``"gemma-3-270m"``: ``noulengine.models.embedded``), a
                local directory with ``config.json`` and weights, a directory written by
                ``noulengine train``, or a ``.gguf`` file (dequantized once into a cached float32
                safetensors directory keyed by its sha256). A trained model is read with the
                readout it was trained with when ``readout`` is ``"auto"``.
            device, dtype, readout: see :class:`EngineConfig`; other :class:`EngineConfig`
                fields as keyword arguments (``debias``, ``calibration``, ``batch_tokens``, ...).
            adapters: ``{name: folder or shipped model name}`` LoRA adapters to serve unmerged on
                this model (:meth:`load_adapter`); a request picks one with ``"adapter": name``.
                When ``name_or_path`` is itself a trained model (the default, a shipped name, a
                ``noulengine train`` or ``noulengine merge`` folder), it is loaded unmerged too:
                its base, with its adapter as the default that answers requests naming no adapter
                (:attr:`default_adapter`), so the named adapters join the same base.
            unmerged: serve a trained model unmerged (as above) even with no ``adapters`` yet, so
                adapters loaded later (a server's run-time loads) can join it; default: when
                ``adapters`` are given. False keeps the merged model (the fastest: no low-rank term).

        Raises:
            noulengine.models.loading.ModelNotFoundError: nothing loadable at ``name_or_path``.
            AdapterError: an adapter cannot be served on this model (:meth:`load_adapter`); one
                that can be told from its folder alone (another base, int8) is refused before the
                model loads, naming the flag that works.
        """
        from noulengine.models.loading import load_model

        if unmerged is None:
            unmerged = bool(adapters)
        if adapters or unmerged:
            trained = precheck_adapters(name_or_path, adapters or {}, dtype)
            if trained is not None and unmerged:
                return cls._from_pretrained_unmerged(name_or_path, trained, adapters or {}, device=device, dtype=dtype,
                                                     readout=readout, **kwargs)

        dev = pick_device(device)
        torch_dtype = pick_dtype(dtype, dev)
        if dtype == "int8" and dev.type != "cpu":
            raise ValueError(f"--dtype int8 is a CPU path (dynamic int8 linear layers); the device is {dev}")
        attn = kwargs.get("attn_implementation", EngineConfig.attn_implementation)
        loaded = load_model(name_or_path, dtype=torch_dtype, device=dev, attn_implementation=attn)
        if dtype == "int8":
            from noulengine.models.quantize import quantize_int8_dynamic

            quantize_int8_dynamic(loaded.model)
        training = loaded.training or {}
        if readout == "auto" and training.get("readout"):
            readout = training["readout"]  # a trained model is read the way it was trained
            if kwargs.get("symbols_fallback") is None:
                kwargs["symbols_fallback"] = True  # ... and still takes 2..255 options
        if kwargs.get("layout") in (None, "auto"):
            # a trained model is served with the layout it was trained on (recorded in training.json;
            # models trained before layouts existed were trained state-first)
            kwargs["layout"] = training.get("layout") or layout_of_prompt_version(training.get("prompt_version"))
        if kwargs.get("calibration") is None and loaded.shipped_temperatures is not None:
            # The model's own fitted temperatures apply when they were fitted for this readout and
            # debias mode (a calibration file records both); otherwise none is applied.
            shipped = loaded.shipped_temperatures
            if (shipped.readout == readout and shipped.debias == kwargs.get("debias", "none")
                    and shipped.layout == kwargs["layout"]):
                kwargs["calibration"] = loaded.calibration_path
        if kwargs.get("calibration") == "none":
            kwargs["calibration"] = None
        config = EngineConfig(model=None if name_or_path is None else str(name_or_path), device=device, dtype=dtype,
                              readout=readout, **kwargs)
        temperatures = _read_temperatures(config, loaded.identity)
        engine = cls(loaded.model, loaded.tokenizer, config, identity=loaded.identity, processor=loaded.processor,
                     temperatures=temperatures)
        engine.training = loaded.training
        for name, path in (adapters or {}).items():
            engine.load_adapter(name, path)
        return engine

    @classmethod
    def _from_pretrained_unmerged(cls, name_or_path, folder: Path, adapters: dict, *, device, dtype, readout,
                                  **kwargs) -> "Engine":
        """A trained model served unmerged: its base, its adapter loaded as the default slot (rows
        that name no adapter), then ``adapters``. Answers equal the merged model's within float
        rounding (``tests/test_adapters.py``); the identity, readout, layout and temperatures are the
        trained model's, as :func:`~noulengine.models.loading.load_model` would give them."""
        from noulengine.models.loading import adapter_identity, load_temperatures, read_training

        training = read_training(folder)
        base_spec = (training.get("base_model") or {}).get("spec")
        if readout == "auto" and training.get("readout"):
            readout = training["readout"]
            if kwargs.get("symbols_fallback") is None:
                kwargs["symbols_fallback"] = True
        if kwargs.get("layout") in (None, "auto"):
            kwargs["layout"] = training.get("layout") or layout_of_prompt_version(training.get("prompt_version"))
        calibration = kwargs.pop("calibration", None)
        engine = cls.from_pretrained(base_spec, device=device, dtype=dtype, readout=readout, calibration="none",
                                     **kwargs)
        name = training.get("name") or folder.name
        engine.load_adapter(name, folder, strict_calibration=False)
        slot = engine.adapters.slots[name]
        engine.adapters.default_slot = slot
        engine.default_adapter = name
        engine._base_identity = engine.identity
        engine.identity = adapter_identity(folder, engine.base_identity, training)
        engine.training = training
        engine.config.model = None if name_or_path is None else str(name_or_path)
        if calibration == "none":
            engine._adapter_temperatures[slot] = None
        elif calibration is not None:  # a file the user named: fitted for this model, readout and layout
            engine._adapter_temperatures[slot] = load_temperatures(
                calibration, identity=engine.identity, readout=engine.config.readout, debias=engine.config.debias,
                layout=engine.compiler.layout)
        engine.calibration = engine._adapter_temperatures[slot]
        engine.config.calibration = (calibration if calibration not in (None, "none") else
                                     engine.adapters.adapters[name].calibration_path if engine.calibration else None)
        for adapter_name, path in adapters.items():
            engine.load_adapter(adapter_name, path)
        return engine

    @classmethod
    def from_model(cls, model, tokenizer, *, processor=None, adapters: dict | None = None, **kwargs) -> "Engine":
        """Wrap an already loaded transformers causal LM and its tokenizer.

        Args:
            processor: a vision-language model's processor (``AutoProcessor``): with it, image
                requests reach the model; without it a VLM answers text requests only.
            adapters: ``{name: folder}`` LoRA adapters to serve unmerged (:meth:`load_adapter`).
            kwargs: :class:`EngineConfig` fields; ``calibration`` is a calibration file's path
                (read here, checked against the readout and debias mode) or ``"none"``.

        Raises:
            UnsupportedModalityError: a VLM family without an adapter (docs/vision.md).
            noulengine.calibrate.file.CalibrationFileError: the calibration file is unreadable or
                was made for another readout or debias mode.
        """
        if kwargs.get("calibration") == "none":
            kwargs["calibration"] = None
        config = EngineConfig(**kwargs)
        engine = cls(model, tokenizer, config, processor=processor, temperatures=_read_temperatures(config, None))
        for name, path in (adapters or {}).items():
            engine.load_adapter(name, path)
        return engine

    # -- adapters ---------------------------------------------------------------------------
    @property
    def base_identity(self):
        """The identity of the weights in memory, which an adapter must have been trained on: the
        model's own, or its base's when a trained model is served unmerged (:attr:`identity` is
        then the trained model's, what requests naming no adapter get)."""
        return self._base_identity if self._base_identity is not None else self.identity

    def load_adapter(self, name: str, path, *, strict_calibration: bool = True) -> None:
        """Serve the LoRA adapter in folder ``path`` as ``name``, unmerged, beside the model.

        The folder is one written by ``noulengine train`` (its ``calibration.json`` then applies to
        this adapter's answers), a shipped decision model's name (``"noul-smollm2-135m-v2"``: its
        folder, checked against its pin) or any PEFT LoRA folder. Requests naming it (``"adapter": name``)
        run in the same forward passes as every other request: the base matmul once, each row's
        low-rank term from its own adapter (:mod:`noulengine.engine.lora`); their prefixes are
        cached under the adapter, never shared with another.

        ``strict_calibration=False`` serves the adapter without temperatures when its calibration
        file was fitted for another readout, debias mode or layout (what a merged model's own file
        gets from :meth:`from_pretrained`) instead of refusing it.

        Raises:
            AdapterError: the name is taken or blank; the folder is not a LoRA adapter; it was trained
                on another base (naming both), with another readout or prompt layout than this
                engine reads, or its calibration file was fitted otherwise (``strict_calibration``);
                a module it adapts is
                missing or shaped differently here; the model is quantized or a vision-language model.
        """
        from noulengine.models.loading import (ModelNotFoundError, adapter_identity, check_shipped_pin,
                                               load_temperatures, shipped_model_dir)

        if not isinstance(name, str) or not name.strip():
            raise AdapterError(f"an adapter name must be a non-blank string, got {name!r}")
        if getattr(self.runner, "quantized", False) or self.runner.vision is not None:
            raise AdapterError(f"adapter {name!r}: adapters are served on float text models only (this one is "
                               f"{'quantized' if getattr(self.runner, 'quantized', False) else 'a vision-language model'})")
        path = shipped_model_dir(path) or path
        if Path(path).is_dir():
            try:
                check_shipped_pin(Path(path))
            except ModelNotFoundError as exc:
                raise AdapterError(f"adapter {name!r}: {exc}") from None
        adapter = read_adapter(name, path)
        ident = self.base_identity
        if adapter.base_sha256 and ident is not None and adapter.base_sha256 != ident.sha256:
            raise AdapterError(f"adapter {name!r} ({adapter.path}) was trained on base {adapter.base_name!r} (sha256 "
                               f"{adapter.base_sha256[:12]}…), but this engine's model is {ident.name!r} (sha256 "
                               f"{ident.sha256[:12]}…); load the adapter on its own base")
        training = adapter.training or {}
        for key, mine in (("readout", self.config.readout), ("layout", self.compiler.layout)):
            theirs = training.get(key)
            if theirs is not None and theirs != mine:
                raise AdapterError(f"adapter {name!r} ({adapter.path}) was trained with {key} {theirs!r}, this engine "
                                   f"reads {key} {mine!r}; build the engine with {key}={theirs!r}")
        temps = None
        if adapter.calibration_path is not None:  # fitted on base + this adapter: checked against both
            try:
                if ident is not None:
                    temps = load_temperatures(adapter.calibration_path, identity=adapter_identity(
                        adapter.path, ident, adapter.training), readout=self.config.readout,
                        debias=self.config.debias, layout=self.compiler.layout)
                else:  # an unidentified base (from_model): the settings it was fitted for still must match
                    temps = load_temperatures(adapter.calibration_path)
                    fitted = (temps.readout, temps.debias, temps.layout)
                    if fitted != (self.config.readout, self.config.debias, self.compiler.layout):
                        raise AdapterError(f"its calibration file was fitted for readout, debias, layout {fitted}, "
                                           f"this engine runs {(self.config.readout, self.config.debias, self.compiler.layout)}")
            except (NoulEngineError, ValueError, OSError) as exc:  # the calibration file's own error
                if strict_calibration:
                    raise AdapterError(f"adapter {name!r}: {exc}") from None
                temps = None
        slot = self.adapters.add(self.runner.model, adapter, device=self.runner.device, dtype=self.runner.dtype)
        self._adapter_temperatures[slot] = temps

    def unload_adapter(self, name: str) -> None:
        """Stop serving adapter ``name``: its factors and cached prefixes are dropped; a later
        request naming it is an error row.

        Raises:
            AdapterError: no adapter of that name is loaded.
        """
        if name is not None and name == self.default_adapter:
            raise AdapterError(f"adapter {name!r} is this engine's default model (it answers every request that "
                               "names no adapter) and cannot be unloaded")
        slot = self.adapters.slot(name)
        self.adapters.remove(name)
        self._adapter_temperatures.pop(slot, None)
        if self.prefix_store is not None:
            self.prefix_store.clear(adapter=slot)

    def _routed(self, rows):
        """A context routing the next passes' rows to adapter slots (no-op without adapters)."""
        return self.adapters.routing.use(rows) if self.adapters.slots else contextlib.nullcontext()

    # -- public API -------------------------------------------------------------------------
    def decide(self, request: Request | dict, *, escalate=None) -> Decision:
        """Answer one request (all its questions in one forward pass).

        Args:
            escalate: an :class:`~noulengine.escalate.EscalationConfig`: questions whose
                confidence is under ``escalate.below`` are then asked of that generative LLM
                (see :meth:`decide_batch`).

        Raises:
            RecordError, OverlengthError, UnsupportedModalityError: the request is invalid.
        """
        return self.decide_batch([request], on_error="raise", escalate=escalate)[0]

    def decide_batch(self, requests: Iterable[Request | dict], *, batch_tokens: int | None = None,
                     on_error: str = "record", progress=None, escalate=None) -> list[Decision]:
        """Answer many requests, packed into forward passes longest first.

        Args:
            requests: :class:`Request` objects or JSON objects with ``state``/``questions``.
            batch_tokens: padded-token budget per pass (default ``config.batch_tokens``).
            on_error: ``"record"`` returns a :class:`Decision` with ``error`` set for a bad
                request (the others still get answers); ``"raise"`` raises the first error.
            progress: optional callable ``progress(n_done_requests)`` called after each batch
                (``self.last_batch`` then holds that batch's ``requests``, ``tokens``, ``seconds``).
            escalate: None, or an :class:`~noulengine.escalate.EscalationConfig`: after the
                forward passes, every question under its confidence threshold is sent to that
                OpenAI-compatible LLM (calls run concurrently across requests, bounded by
                ``max_concurrent``); a valid candidate label replaces the model's, anything else
                keeps it with the reason (``Answer.source``, ``Answer.escalation``,
                ``Decision.escalation``). A failed LLM call never fails the request.

        Returns:
            One :class:`Decision` per request, in input order.
        """
        if on_error not in ("record", "raise"):
            raise ValueError(f"on_error must be 'record' or 'raise', got {on_error!r}")
        return drain(self._decide_steps(list(requests), batch_tokens=batch_tokens, on_error=on_error,
                                        progress=progress, escalate=escalate))

    def start_batch(self, requests: Iterable[Request | dict], *, batch_tokens: int | None = None,
                    on_error: str = "record") -> "DecideJob":
        """:meth:`decide_batch` as a job run one forward pass at a time (:meth:`DecideJob.step`).

        The server's worker starts a job per group of requests and steps its jobs in turn, so the
        requests that arrive while a large one is computed (in chunks: ``EngineConfig.chunk_tokens``)
        are answered between its chunks, not after it. Every request's probabilities are the same
        bits as :meth:`decide_batch` of the same requests gives (each pass's shapes and inputs
        depend on its own requests only); other jobs may run between two steps, but nothing else may
        change the engine (weights, adapters, settings) while a job is unfinished.

        Raises:
            ValueError: ``on_error`` is neither ``"record"`` nor ``"raise"``.
        """
        if on_error not in ("record", "raise"):
            raise ValueError(f"on_error must be 'record' or 'raise', got {on_error!r}")
        return DecideJob(self._decide_steps(list(requests), batch_tokens=batch_tokens, on_error=on_error))

    def _decide_steps(self, items: list, *, batch_tokens: int | None = None, on_error: str = "record", progress=None,
                      escalate=None):
        """:meth:`decide_batch`'s body as a generator: compiles on the first step, yields after each
        forward pass (:meth:`_run_steps`) and returns the decisions."""
        decisions: list[Decision | None] = [None] * len(items)
        compiled: dict[int, CompiledRequest] = {}
        parsed: dict[int, Request] = {}
        slots: dict[int, int] = {}  # LoRA adapter slot per request (0: the model as loaded)
        compile_s: dict[int, float] = {}
        for i, item in enumerate(items):
            t0 = time.perf_counter()
            try:
                if isinstance(item, Request):
                    req = item
                    if req.images:  # built in Python, never parsed: the same image rules apply
                        from noulengine.records.images import check_images

                        check_images(req.images, record_id=req.id)
                else:
                    req = request_from_json(item, media_root=self.media_root)
                if req.images and not self.runner.supports_images:
                    where = f"record {req.id!r}: " if req.id is not None else ""
                    if is_vision_language(self.runner.model):
                        why = ("this vision-language model was given no processor, so it cannot read images "
                               f"({len(req.images)} given); pass processor= to Engine.from_model (or load the "
                               "checkpoint folder with Engine.from_pretrained), or remove the images")
                    else:
                        why = (f"this model is text-only and cannot read images ({len(req.images)} given); use a "
                               "vision-language model or remove the images")
                    raise UnsupportedModalityError(f"{where}field 'images': {why}")
                slot = self.adapters.slot(req.adapter)  # an unknown adapter: this request's error row
                compiled[i] = self.compiler.compile(req)
                parsed[i] = req
                slots[i] = slot
            except Exception as exc:  # noqa: BLE001 - one bad request never loses the others' answers
                if on_error == "raise":
                    raise
                rid = item.id if isinstance(item, Request) else (item.get("id") if isinstance(item, dict) else None)
                rid = rid if isinstance(rid, str) else None
                decisions[i] = Decision(id=rid, error=_error_dict(exc, rid))
            compile_s[i] = time.perf_counter() - t0
        if compiled:
            self._ensure_priors(parsed, compiled, slots)
        order = list(compiled)
        results = yield from self._run_steps([compiled[i] for i in order], batch_tokens=batch_tokens,
                                             progress=progress, slots=[slots[i] for i in order])
        for slot, i in enumerate(order):
            logps, batch_s = results[slot]
            c = compiled[i]
            answers = {}
            try:
                for q, plan, lp in zip(parsed[i].questions, c.questions, logps):
                    prior = self._priors.get((slots[i], plan.spec_key)) if self.config.debias == "contextual" else None
                    answers[plan.field] = make_answer(plan, lp, temperature=self._temperature(plan, slots[i]),
                                                      prior_logprobs=prior, debias=self.config.debias,
                                                      descriptions=q.descriptions)
            except NonFiniteLogitsError as exc:  # the whole request is an error row; the others stand
                if on_error == "raise":
                    raise
                decisions[i] = Decision(id=c.request_id, error=_error_dict(exc, c.request_id),
                                        input_tokens=c.input_tokens)
                continue
            decisions[i] = Decision(id=c.request_id, answers=answers, input_tokens=c.input_tokens,
                                    latency_s=compile_s[i] + batch_s)
        if escalate is not None:
            from noulengine.escalate.runner import escalate_decisions  # the layer built on decisions

            decisions = escalate_decisions(decisions, [parsed.get(i) if decisions[i].ok else None  # type: ignore[union-attr]
                                                        for i in range(len(items))], escalate)
        return decisions  # type: ignore[return-value]

    def prepare_images(self, request: Request) -> None:
        """Run the processor on ``request``'s images now (any thread) and keep the result for
        its compile step (a VLM's adapter cache); nothing for text requests or text models.

        The HTTP server calls it in its request threads, so resizing pixels never stalls the
        model's worker thread.

        Raises:
            RecordError: an image cannot be decoded or the processor refuses it.
        """
        if request.images and self.runner.vision is not None:
            self.runner.vision.encode(request.images, record_id=request.id)

    def is_chunked(self, request: Request | dict) -> bool:
        """Whether :meth:`decide_batch` computes ``request`` alone in canonical chunks (a large
        request: ``EngineConfig.chunk_tokens``), which a scheduler can interleave with other work
        (:meth:`start_batch`). Compiles the request (its packed length decides).

        Raises:
            RecordError, OverlengthError: the request is invalid (as :meth:`compile`).
        """
        if self.config.chunk_tokens <= 0 or (isinstance(request, Request) and request.images):
            return False
        cached_ok = self.config.prefix_cache and prefix_cache_unsupported(self.runner) is None
        return cached_ok and self._chunked(self.compile(request), cached_ok)

    def compile(self, request: Request | dict) -> CompiledRequest:
        """The packed token tree the engine would run for ``request`` (for inspection and tests)."""
        req = request if isinstance(request, Request) else request_from_json(request, media_root=self.media_root)
        return self.compiler.compile(req)

    @property
    def media_root(self):
        """Where relative image paths are read from: ``config.media_root``, ``MEDIA_ROOT`` or the
        working directory."""
        from pathlib import Path

        from noulengine import envs

        return Path(self.config.media_root) if self.config.media_root else (envs.media_root() or Path.cwd())

    # -- internals --------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)

    def _run(self, compiled: list[CompiledRequest], *, batch_tokens: int | None, progress=None,
             slots: list[int] | None = None):
        """Forward passes; returns per request ``(per-question (V, K) log-probs, batch seconds)``.

        ``slots``: each request's LoRA adapter slot (None: all the model as loaded); a batch mixes
        adapters freely, each row routed to its own (:mod:`noulengine.engine.lora`)."""
        return drain(self._run_steps(compiled, batch_tokens=batch_tokens, progress=progress, slots=slots))

    def _chunked(self, c: CompiledRequest, cached_ok: bool) -> bool:
        """Whether ``c`` is a large request, computed alone in canonical chunks
        (:func:`~noulengine.engine.prefix_cache.chunked_hidden_steps`): chunking on
        (``chunk_tokens > 0``), a model the prefix cache supports, a text request, at least
        ``chunk_min_tokens`` and more than ``chunk_tokens`` packed tokens. Decided from the
        request alone, so its path, and its bits, never depend on what else is being served."""
        chunk = self.config.chunk_tokens
        return (cached_ok and chunk > 0 and c.vision is None and c.input_tokens > chunk
                and c.input_tokens >= self.config.chunk_min_tokens)

    def _run_steps(self, compiled: list[CompiledRequest], *, batch_tokens: int | None, progress=None,
                   slots: list[int] | None = None):
        """:meth:`_run` as a generator: yields (None) after each forward pass (a batch, or one chunk of
        a large request) and returns what :meth:`_run` returns. A scheduler
        (:class:`DecideJob`, the server's worker) runs other requests' passes between the steps."""
        slots = slots or [0] * len(compiled)
        chunk = self.config.chunk_tokens
        budget = batch_tokens or self.config.batch_tokens
        out: list[Any] = [None] * len(compiled)
        # Linear requests and tree requests are planned apart: a batch is either causal (the
        # model's own attention) or a tree batch (dense tree mask), never a mix.
        # Tree requests use the prefix KV cache where the model allows it ("cached" batches) and
        # where it pays: long requests, or requests with a static prefix (schema-first questions).
        # The choice depends on the request alone, never on what the store holds: a request's
        # path, and so its bits, are the same whatever the engine answered before (issue #46).
        cached_ok = self.config.prefix_cache and prefix_cache_unsupported(self.runner) is None
        head = self._frame_head_len() if cached_ok or self.config.causal_path else 0
        static, static_key, admitted = self._static_prefixes(compiled, head, slots) if cached_ok else ({}, {}, set())
        groups: dict[str, list[int]] = {"causal": [], "tree": [], "cached": [], "chunked": []}
        for i, c in enumerate(compiled):
            if self._chunked(c, cached_ok):
                kind = "chunked"  # large: alone, in canonical chunks (the same bits alone or interleaved)
            elif c.vision is not None:
                # image requests: the tree path only. Their image tokens are placeholders, the
                # same ids whatever the pixels, so no token-keyed cache may hold them.
                kind = "tree"
            elif self.config.causal_path and c.is_linear:
                kind = "causal"
            elif cached_ok and (c.input_tokens >= self.config.prefix_cache_min_tokens or i in static):
                kind = "cached"  # long, or a static prefix (schema) to share
            else:
                kind = "tree"
            groups[kind].append(i)
        plans = [("chunked", [i]) for i in sorted(groups["chunked"], key=lambda i: -compiled[i].input_tokens)]
        for kind in ("cached", "causal", "tree"):
            # requests that share a static prefix are batched together, so each batch reuses one entry
            by_key: dict[int | None, list[int]] = {}
            for i in groups[kind]:
                by_key.setdefault(static_key.get(i), []).append(i)
            pooled = [i for key, idx in by_key.items() if key is None or len(idx) < 2 for i in idx]
            parts = [idx for key, idx in by_key.items() if key is not None and len(idx) >= 2]
            for members in parts + ([pooled] if pooled else []):
                for part in plan_batches([compiled[i].input_tokens for i in members], batch_tokens=budget,
                                         max_batch_size=self.config.max_batch_size):
                    plans.append((kind, [members[j] for j in part]))
        self.last_padding_share = 0.0
        padded = real = 0
        store = self._seeded_prefix_store() if groups["causal"] or groups["cached"] or groups["chunked"] else None
        for kind, indices in plans:
            self._sync()
            t0 = time.perf_counter()
            keys = {static_key.get(i) for i in indices}
            batch_static = min(static.get(i, 0) for i in indices) if len(keys) == 1 and None not in keys else 0
            rows = [slots[i] for i in indices]
            if kind == "chunked":
                i = indices[0]
                steps = chunked_hidden_steps(self.runner, compiled[i], store, chunk=chunk, head=head,
                                             static=static.get(i, 0), keep_static=i in admitted, slot=slots[i],
                                             routing=self.adapters.routing if self.adapters.slots else None)
                spent = 0.0  # this request's own compute time: other passes run between its steps
                while True:
                    try:
                        with torch.inference_mode():
                            next(steps)
                    except StopIteration as done:
                        hidden = done.value
                        break
                    self._sync()
                    spent += time.perf_counter() - t0
                    yield
                    t0 = time.perf_counter()
                t0 -= spent
                n_real = n_padded = compiled[i].input_tokens
            elif kind == "cached":
                with torch.inference_mode():
                    hidden = prefix_cached_hidden_batch(
                        self.runner, compiled, indices, store=store, head=head, static=static, keep_static=admitted,
                        slots={i: slots[i] for i in indices},
                        routing=self.adapters.routing if self.adapters.slots else None, chunk=chunk)
                n_real = n_padded = sum(compiled[i].input_tokens for i in indices)
            else:
                batch = collate(compiled, indices, pad_id=self.pad_id, causal=kind == "causal")
                if kind == "causal" and store is not None and len(set(rows)) == 1:
                    # one adapter for every row: its cached head (and static prefix) serve them all;
                    # a batch mixing adapters runs whole instead (each row's keys are its adapter's)
                    with torch.inference_mode(), self._routed(rows[0]):
                        hidden = causal_batch_hidden(self.runner, batch, [compiled[i] for i in indices], store,
                                                     head=head, static=batch_static,
                                                     keep_static=bool(batch_static) and indices[0] in admitted,
                                                     adapter=rows[0], chunk=chunk)
                elif kind == "causal" and store is not None:  # mixed adapters: each row's own cached head
                    with torch.inference_mode():
                        hidden = mixed_causal_batch_hidden(self.runner, batch, [compiled[i] for i in indices], store,
                                                           head=head, slots=rows, routing=self.adapters.routing,
                                                           chunk=chunk)
                else:
                    with self._routed(rows):
                        hidden = self.runner.hidden_states(batch)
                n_real, n_padded = batch.real_tokens, batch.padded_tokens
            with torch.inference_mode():
                per_row = batch_candidate_logprobs(hidden, self.runner.head, compiled, indices)
            self._sync()
            dt = time.perf_counter() - t0
            padded += n_padded
            real += n_real
            for row, idx in enumerate(indices):
                out[idx] = (per_row[row], dt)
            if progress is not None:
                self.last_batch = {"requests": len(indices), "tokens": n_real, "seconds": dt}  # for the callback
                progress(len(indices))
            yield
        self.last_padding_share = 1.0 - real / padded if padded else 0.0
        return out

    def _frame_head_len(self) -> int:
        """Tokens of the frame head every request starts with (0 when the probe cannot compile)."""
        try:
            return len(self.compiler.frame_head_ids())
        except NoulEngineError:  # a context window too small for the probe requests
            return 0

    def _static_prefixes(self, compiled: list[CompiledRequest], head: int,
                         slots: list[int] | None = None) -> tuple[dict[int, int], dict[int, int], set[int]]:
        """The requests with a static prefix (``CompiledRequest.static_tokens``: the questions of a
        schema-first prompt) long enough to share, and which of them the prefix store should keep.

        A static prefix longer than the frame head by the store's ``min_tokens`` is a cut of its
        request's canonical prefix (:func:`~noulengine.engine.prefix_store.prefix_chain`) and sends
        the request down the prefix-cache path, whatever the store holds. It is *kept* in the store
        when already stored, when two requests of this call share it, or when an earlier call saw it
        (the engine remembers the last 4,096 it saw): a workload that repeats its questions pays for
        them once. (The state-first layout's static prefix is the frame head itself.)

        Returns:
            ``(static, key, admitted)``: request index -> its static prefix length; request index
            -> a hash of its static prefix's ids (requests with the same key are batched together;
            a hash collision only affects batching and admission, never answers: the store itself
            compares token ids); the request indices whose static prefix is to be stored.
        """
        store = self.prefix_store
        if store is None:
            return {}, {}, set()
        keyed: dict[int, tuple[int, int]] = {}
        counts: dict[int, int] = {}
        slots = slots or [0] * len(compiled)
        for i, c in enumerate(compiled):
            if c.vision is None and c.static_tokens >= head + store.min_tokens:
                key = hash((slots[i], tuple(c.token_ids[:c.static_tokens])))  # an adapter's own static prefix
                keyed[i] = (key, c.static_tokens)
                counts[key] = counts.get(key, 0) + 1
        static, static_key, admitted = {}, {}, set()
        for i, (key, n) in keyed.items():
            static[i], static_key[i] = n, key
            stored = len(store.lookup(compiled[i].token_ids, n, slots[i]) or ()) == n
            if stored or counts[key] >= 2 or key in self._static_seen:
                admitted.add(i)
        for key in counts:
            self._static_seen[key] = None
            self._static_seen.move_to_end(key)
        while len(self._static_seen) > 4096:
            self._static_seen.popitem(last=False)
        return static, static_key, admitted

    def reset_prefix_cache(self, *, keep_head: bool = False) -> None:
        """Drop every cached prefix (the frame head too, unless ``keep_head``; it is prefilled
        again on next use) and forget which static prefixes were seen (admission starts afresh).

        Call it after changing the model's weights in place (training, a loaded adapter): cached
        keys and values were computed with the old weights. ``keep_head=True`` (same weights)
        starts a measurement from what a fresh server holds.
        """
        if self.prefix_store is not None:
            self.prefix_store.clear(keep_pinned=keep_head)
        self._frame_head_seeded = self._frame_head_seeded and keep_head
        self._static_seen.clear()

    def _seeded_prefix_store(self) -> PrefixKVStore | None:
        """The prefix store, with the frame head (every request's first tokens) prefilled and
        pinned on first use; None when cross-request prefix caching is off or unsupported."""
        store = self.prefix_store
        if store is not None and not self._frame_head_seeded:
            self._frame_head_seeded = True
            try:
                head = self.compiler.frame_head_ids()
            except NoulEngineError:  # e.g. a context window too small for the probe requests:
                head = ()  # no head to share; batch-shared and state prefixes are still cached
            if len(head) >= store.min_tokens:
                with torch.inference_mode():  # along the canonical cuts, as every request computes it
                    entry, _, _ = prefix_chain(self.runner, None, head, [len(head)], chunk=self.config.chunk_tokens)
                entry.pinned = True
                store.insert(entry)
        return store

    def _temperature(self, plan, slot: int = 0) -> float:
        """The temperature of a question: the model's calibration, or for an adapter's request its
        own (its folder's calibration.json; T = 1 without one: the base's does not apply to it)."""
        calibration = self.calibration if slot == 0 else self._adapter_temperatures.get(slot)
        if calibration is None:
            return 1.0
        return calibration.temperature_for(plan.type, plan.num_candidates)

    def _ensure_priors(self, parsed: dict[int, Request], compiled: dict[int, CompiledRequest],
                       slots: dict[int, int] | None = None) -> None:
        """Contextual debiasing: the mean content-free prior per question template (and adapter), cached."""
        if self.config.debias != "contextual":
            return
        slots = slots or {}
        missing: dict[tuple[int, str], Question] = {}
        for i, c in compiled.items():
            for q, plan in zip(parsed[i].questions, c.questions):
                key = (slots.get(i, 0), plan.spec_key)
                if key not in self._priors:
                    missing[key] = q
        if not missing:
            return
        keys = list(missing)
        prior_requests = [self.compiler.compile(Request(state=s, questions=(missing[k],)))
                          for k in keys for s in CONTENT_FREE_STATES]
        results = self._run(prior_requests, batch_tokens=None,
                            slots=[k[0] for k in keys for _ in CONTENT_FREE_STATES])
        n = len(CONTENT_FREE_STATES)
        for j, key in enumerate(keys):
            probs = torch.stack([torch.softmax(results[j * n + s][0][0][0], dim=0) for s in range(n)]).mean(0)
            self._priors[key] = torch.log(probs)

    def describe(self, adapter: str | None = None) -> dict:
        """JSON-able description: model identity, device, dtype, the resolved readout, debias and
        calibration (what the engine uses, ``auto`` already resolved), torch CPU threads, the loaded
        adapters. With ``adapter`` (a loaded adapter's name): the model and calibration that answer
        requests naming it (base + adapter, the identity the merged folder would have).

        Raises:
            AdapterError: ``adapter`` is not loaded.
        """
        trained = (self.training or {}).get("prompt_version")
        model = self.identity.to_dict() if self.identity else None
        calibration = self.config.calibration
        if adapter is not None:
            from noulengine.models.loading import adapter_identity

            self.adapters.slot(adapter)  # raises for a name not loaded
            a = self.adapters.adapters[adapter]
            base = self.base_identity
            model = (adapter_identity(a.path, base, a.training).to_dict() if base is not None
                     else {"name": adapter, "path": str(a.path), "sha256": None})
            calibration = a.calibration_path
            trained = (a.training or {}).get("prompt_version")
        return {"model": model, "device": str(self.runner.device),
                "prompt_version": self.compiler.prompt_version, "layout": self.compiler.layout,
                "trained_prompt_version": trained,
                "dtype": "int8" if self.config.dtype == "int8" else str(self.runner.dtype).replace("torch.", ""),
                "readout": self.config.readout,
                "debias": self.config.debias, "calibration": calibration, "adapter": adapter,
                "adapters": {n: str(a.path) for n, a in self.adapters.adapters.items()},
                "attn_implementation": self.runner.attn_implementation, "threads": torch.get_num_threads(),
                "vision": ({"family": self.runner.vision.name, "model_type": self.runner.vlm.config.model_type}
                           if self.runner.vision is not None else None),
                "modalities": ["text", "image"] if self.runner.supports_images else ["text"],
                "config": {f.name: getattr(self.config, f.name) for f in fields(self.config)}}
