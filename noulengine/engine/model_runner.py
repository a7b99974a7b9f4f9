"""The model side of the engine: one packed forward pass to final hidden states.

Measured pitfalls this module guards against (see docs): the eager attention path misreads a
boolean mask (it gets an additive mask), results are wrong without explicit position ids, and
models with sliding-window layers (Gemma 3) need a separate sliding mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import inspect

import torch

from noulengine.engine.batching import Batch


def pick_device(device: str | torch.device | None) -> torch.device:
    """``device`` if given, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    from noulengine import envs

    forced = envs.default_device()
    if forced:
        return torch.device(forced)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
# "int8": float32 compute with dynamically quantized linear layers (CPU only; models/quantize.py)
DTYPE_NAMES = tuple(DTYPES) + ("int8",)


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``dtype`` if given, else bfloat16 on CUDA and float32 on CPU.

    Raises:
        ValueError: a name not in :data:`DTYPES` (nor ``"auto"``).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == "int8":
        return torch.float32  # the float parts of an int8 model (embeddings, norms, head)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {dtype!r}")
    return DTYPES[dtype]


@dataclass
class HeadInfo:
    """The output head: (V, D) weight, optional (V,) bias, and the final logit soft-cap."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    softcap: float | None


class ModelRunner:
    """Runs the base (decoder) model of a causal LM on packed batches.

    The output head is never applied here: :mod:`noulengine.engine.readout` applies it to the
    read positions only.

    Args:
        model: a transformers causal LM, or a vision-language model
            (``...ForConditionalGeneration``; its language model is the base).
        train: put the model in training mode (the trainer's runner).
        vision: the VLM's family adapter (:class:`noulengine.vision.VisionAdapter`); batches with
            image rows then run on merged image + token embeddings. None: text only.
    """

    def __init__(self, model, *, train: bool = False, vision=None):
        self.model = model.train() if train else model.eval()
        self.vision = vision
        # the transformers model under a peft wrapper (the trainer's LoRA model): family adapters
        # call its own methods (get_image_features, get_rope_index)
        self.vlm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, model.base_model_prefix)
        text_cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = text_cfg
        head = model.get_output_embeddings()
        softcap = getattr(text_cfg, "final_logit_softcapping", None)
        if vision is not None and not vision.applies_softcap:
            softcap = None  # the VLM's own forward does not cap its logits (the readout mirrors the model)
        self.head = HeadInfo(head.weight, getattr(head, "bias", None), softcap)
        layer_types = getattr(text_cfg, "layer_types", None) or []
        window = getattr(text_cfg, "sliding_window", None)
        self.sliding_window = window if window and "sliding_attention" in layer_types else None
        self.attn_implementation = getattr(model.config, "_attn_implementation", "sdpa") or "sdpa"
        self.max_positions = int(getattr(text_cfg, "max_position_embeddings", 8192) or 8192)
        self.supports_images = vision is not None
        # dynamically quantized int8 layers (models/quantize.py): their activation scales depend on
        # the whole input tensor, so prefixes computed apart are not exact (no prefix caching)
        self.quantized = any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
        # transformers 5.x renamed the decoder's ``past_key_values`` argument to ``cache``
        # (the old name warns, and goes in 5.40); older versions know only the old one.
        params = inspect.signature(self.base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def _device_mask(self, mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(self.device, non_blocking=True)
        if self.attn_implementation == "eager":
            # eager adds the mask to the scores: a boolean mask would be read as 0/1 values.
            additive = torch.zeros(mask.shape, dtype=self.dtype, device=self.device)
            return additive.masked_fill_(~mask, torch.finfo(self.dtype).min)
        return mask

    def forward_with_cache(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask, cache) -> torch.Tensor:
        """(B, T, D) final hidden states of ``T`` new tokens per row, attending to ``cache``.

        Args:
            input_ids, position_ids: (B, T) int64 on the model's device.
            attention_mask: None (the model's own causal mask, offset by the cache length) or a
                (B, 1, T, cached + T) mask (see :meth:`_device_mask`).
            cache: a :class:`transformers.DynamicCache` with B rows (extended in place).
        """
        out = self.base(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                        use_cache=True, **{self._cache_kwarg: cache})
        return out.last_hidden_state

    @torch.inference_mode()
    def hidden_states(self, batch: Batch) -> torch.Tensor:
        """(B, L, D) final normalised hidden states for a packed batch (model dtype, on device)."""
        return self.forward_hidden(batch)

    def forward_hidden(self, batch: Batch) -> torch.Tensor:
        """:meth:`hidden_states` with autograd on: the training step's forward pass (same masks
        and position ids as inference, so what is trained is exactly what is served)."""
        input_ids = batch.input_ids.to(self.device, non_blocking=True)
        position_ids = batch.position_ids.to(self.device, non_blocking=True)
        mask = batch.mask
        inputs_embeds = None
        if batch.vision:
            inputs_embeds, position_ids, mask = self._vision_inputs(batch, input_ids, position_ids)
        if batch.causal:
            # Linear requests: the model's own causal path (fused causal attention, no dense mask;
            # it builds its own sliding-window mask). Right padding: no real token sees a pad.
            attention_mask = None
        elif self.attn_implementation == "flex_attention" and self.device.type == "cuda" and not (
                batch.vision and self.vision.bidirectional_images):
            # CUDA only: a flex BlockMask skips the tiles a branch cannot see (CPU path unchanged).
            from noulengine.engine.flex_attention import runner_attention_mask

            attention_mask = runner_attention_mask(batch, self.device, self.sliding_window)
        elif self.sliding_window is not None:
            pos = batch.position_ids
            near = (pos[:, :, None] - pos[:, None, :]) < self.sliding_window  # (B, L, L)
            attention_mask = {"full_attention": self._device_mask(mask),
                              "sliding_attention": self._device_mask(mask & near[:, None])}
        else:
            attention_mask = self._device_mask(mask)
        if inputs_embeds is not None:
            out = self.base(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        else:
            out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        return out.last_hidden_state

    def _vision_inputs(self, batch: Batch, input_ids: torch.Tensor, position_ids: torch.Tensor):
        """Merged embeddings, position ids and mask for a batch with image rows.

        The image rows' pixel tensors are concatenated in row order and run through the vision
        tower once; the features replace the image-token embeddings in order (as the model's own
        forward merges them). The family adapter gives the position ids (Qwen2-VL: 3-D) and,
        for bidirectional image attention (Gemma 3), the image blocks are added to the tree mask.

        Returns:
            ``(inputs_embeds (B, L, D) model dtype, position_ids, mask (B, 1, L, L) bool, CPU)``.

        Raises:
            RuntimeError: a row's image tokens do not match its image features in number.
        """
        from noulengine.vision.adapters import image_blocks

        adapter = self.vision
        items = [inputs for _, _, inputs in batch.vision]
        tensors = {k: v.to(self.device, dtype=self.dtype if v.is_floating_point() else v.dtype)
                   for k, v in adapter.concat(items).items()}
        feats = adapter.image_features(self.vlm, tensors)
        is_image = torch.zeros_like(input_ids, dtype=torch.bool)
        for row, prefix, inputs in batch.vision:
            row_mask = input_ids[row, :prefix] == adapter.image_token_id
            if int(row_mask.sum()) != inputs.image_tokens:
                raise RuntimeError(f"batch row {row}: {int(row_mask.sum())} image tokens in the prefix, "
                                   f"{inputs.image_tokens} expected")
            is_image[row, :prefix] = row_mask
        if feats.shape[0] != int(is_image.sum()):
            raise RuntimeError(f"the vision tower gave {feats.shape[0]} feature rows for {int(is_image.sum())} "
                               "image tokens")
        embeds = self.vlm.get_input_embeddings()(input_ids)
        embeds = embeds.masked_scatter(is_image[..., None], feats.to(embeds.dtype))
        position_ids = adapter.position_ids(self.vlm, input_ids, position_ids, batch.vision)
        mask = batch.mask
        if adapter.bidirectional_images:
            mask = mask | image_blocks(batch.input_ids, adapter.image_token_id)[:, None]
        return embeds, position_ids, mask
