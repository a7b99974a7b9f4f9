"""Engine settings: :class:`EngineConfig` and the valid values of its enumerated fields.

Kept free of torch and transformers, so the command line builds its parsers (and ``--help``)
without loading them; ``tests/test_cli_light.py`` checks the value lists against the modules that
define them (:mod:`noulengine.compile.layout`, :mod:`noulengine.compile.compiler`,
:mod:`noulengine.engine.model_runner`).
"""

from __future__ import annotations

from dataclasses import dataclass

READOUT_CHOICES = ("symbols", "label-token", "label-sequence")  # = compile.layout.READOUT_MODES
DEBIAS_CHOICES = ("none", "permute", "contextual")  # = compile.compiler.DEBIAS_MODES
LAYOUT_CHOICES = ("state-first", "schema-first")  # = compile.render.LAYOUTS
DTYPE_CHOICES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "int8")  # = engine.model_runner.DTYPE_NAMES


@dataclass
class EngineConfig:
    """Engine settings (the CLI and the server are generated from these fields).

    Attributes:
        model: None (the embedded default decision model), a shipped decision model by name (noul-smollm2-135m-v2), base (the default's untrained base), an embedded base by name (SmolLM2-135M-Instruct, gemma-3-270m), a local directory (a noulengine train output too) or a .gguf file.
        device: ``cuda``, ``cuda:N``, ``cpu`` or None (CUDA when available, else CPU).
        dtype: ``bfloat16`` | ``float32`` | ``float16`` | ``int8`` (CPU: dynamic int8 linear layers, head in float32) or None (bf16 on CUDA, fp32 on CPU).
        readout: ``auto`` | ``symbols`` | ``label-token`` | ``label-sequence``.
        debias: ``none`` | ``permute`` | ``contextual``.
        batch_tokens: padded tokens per forward pass (B x L budget).
        max_batch_size: requests per forward pass at most.
        max_positions: context window in tokens (None: the model's ``max_position_embeddings``).
        calibration: path of a calibration JSON (temperatures); None applies the calibration a
            trained model ships with (when fitted for the same readout and debias mode), ``"none"``
            applies no temperature.
        use_chat_template: None uses the model's chat template when it has one.
        symbols_fallback: with readout symbols, read questions with more options than symbols by label-sequence (None: only for a trained model read with its own readout).
        attn_implementation: ``sdpa`` (default) or ``eager``.
        causal_path: run linear requests (one question, one view, no label-sequence candidates)
            through the model's own causal attention, with no dense tree mask; false runs every request through the tree path (the reference).
        prefix_cache: run tree requests (several branches) with a prefix KV cache: the shared prefix prefilled once, then every branch as a batch against the cached keys and values (models without sliding-window layers; others keep the tree path).
        prefix_cache_min_tokens: tree requests of fewer packed tokens keep the tree path unless they have a static prefix to share (schema-first questions); what the prefix store holds never changes a request's path, so a repeated request gets the same bits (measured on a 2-core CPU: the cached path ran at 0.91-0.94x the tree path at ~515 tokens, 1.0-1.1x at ~1,400 and 1.4-1.5x at ~2,600); 0 sends every tree request through the prefix cache.
        prefix_cache_mb: cross-request prefix caching budget in MiB: keys and values of the frame head every request starts with, of static prefixes (schema-first questions) and of tree requests' whole prefixes (states) are kept and reused across requests (LRU, keyed by token ids; each computed in one canonical shape, so a reused prefix gives the same bits as a recomputed one); 0 turns it off. Used by the causal path and the prefix-cache path (not the tree path, the reference); never for sliding-window or int8 models. Call Engine.reset_prefix_cache() after changing weights in place.
        layout: the prompt layout: ``state-first`` (the state, then each question) or ``schema-first`` (every question first, then the state, then a short cue per question: requests that ask the same questions share that prefix, which the prefix cache serves); None = the layout a trained model was trained with, else state-first.
        chunk_tokens: chunked scheduling of large requests: a request of at least chunk_min_tokens (and more than chunk_tokens) packed tokens runs alone, in passes of at most this many new tokens (its prefix along the canonical cut points, then its branches in packed order against the keys and values of everything before them), and the server answers requests that arrive meanwhile between those passes; every prefix piece longer than this is cut too (one canonical shape, the same bits alone or interleaved). A 256-token chunk is about 0.7 s of SmolLM2-135M on 2 CPU threads at the start of a prompt (FACTS.md: 0.66-0.73 s per 256-token pass) and more further in (attention reads every earlier key: about 2 s at one thread 4,000-6,000 tokens in; docs/serving.md), so requests arriving behind a large one wait about one chunk, not for all of it. 0 turns chunking off (large requests are batched whole, prefix pieces not cut). Models without the prefix cache (sliding-window, int8) and image requests are never chunked.
        chunk_min_tokens: requests of at least this many packed tokens are large, computed in chunks of chunk_tokens (smaller ones are batched whole as before; a request of a few chunks stalls others for a few chunks at most).
        media_root: the folder relative image paths in requests are read from (default ``MEDIA_ROOT``, else the --input file's folder for noulengine decide, else the working directory); HTTP requests never read paths.
    """

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    readout: str = "auto"
    debias: str = "none"
    batch_tokens: int = 8192
    max_batch_size: int = 64
    max_positions: int | None = None
    calibration: str | None = None
    use_chat_template: bool | None = None
    symbols_fallback: bool | None = None
    attn_implementation: str = "sdpa"
    causal_path: bool = True
    prefix_cache: bool = True
    prefix_cache_min_tokens: int = 1024
    prefix_cache_mb: int = 256
    chunk_tokens: int = 256
    chunk_min_tokens: int = 1024
    media_root: str | None = None
    layout: str | None = None
