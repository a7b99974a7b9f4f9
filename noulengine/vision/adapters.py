"""Vision-language families: one small adapter per family, nothing family-specific elsewhere.

The engine runs a vision-language model (VLM) the way it runs a text model: one packed tree per
request (the state, with its images, is the shared prefix; every question a branch after it),
one forward pass of the *language model* with a custom 4-D attention mask and explicit position
ids, candidate logits read at the answer positions. A family adapter supplies only what differs:

1. :meth:`VisionAdapter.encode`: the processor's expansion of the image placeholders (tokens per
   image, tiles, row/column tags: never re-implemented here) and its pixel tensors;
2. :meth:`VisionAdapter.image_features`: the vision tower + projector on the pixel tensors of
   several requests concatenated in row order, one feature row per image token;
3. :meth:`VisionAdapter.position_ids`: the language model's position ids when they are not the
   tree depths (Qwen2-VL's 3-D multimodal rotary positions);
4. :attr:`VisionAdapter.bidirectional_images`: image tokens of one image attend to each other
   both ways (Gemma 3), so the tree mask must add that block, as the model's own mask does.

The merged input embeddings are the token embeddings with the image-token rows replaced by the
image features in order (``masked_scatter``), exactly as each model's own ``forward`` merges them
(route checked against a plain transformers forward in ``tests/test_vision_models.py``).

Adding a family (see docs/vision.md): subclass :class:`VisionAdapter`, set ``model_types`` to the
checkpoints' ``config.model_type`` values and ``placeholder`` to the text the processor expands,
override the methods whose defaults do not hold, and add the class to :data:`ADAPTERS`; then add
a tiny-config test to ``tests/test_vision_models.py``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Sequence

import torch

from noulengine.records.errors import RecordError, UnsupportedModalityError
from noulengine.vision.inputs import VisionInputs, to_pil


class VisionAdapter:
    """The rules of one vision-language family (base class; see the module docstring).

    Args:
        config: the model's top-level config (``model.config``, with ``vision_config``).
        processor: the checkpoint's processor (``AutoProcessor`` or an image-only equivalent,
            :func:`noulengine.vision.processor.load_processor`).

    Attributes:
        placeholder: the text one image contributes to the processor's input; the processor
            replaces it with the image's tokens.
        pixel_keys: the processor outputs the vision tower reads.
        bidirectional_images: image tokens of the same image attend to each other in both
            directions (the tree mask adds that block).
        applies_softcap: whether the model's own forward applies ``final_logit_softcapping``
            (the readout mirrors the model).
    """

    model_types: tuple[str, ...] = ()
    placeholder: str = ""
    pixel_keys: tuple[str, ...] = ("pixel_values",)
    bidirectional_images: bool = False
    applies_softcap: bool = True

    # processed images kept for reuse (bytes of pixel tensors): the HTTP server runs the
    # processor in its request threads (Engine.prepare_images) and the model's worker thread then
    # finds the result here instead of resizing pixels while every other request waits
    cache_bytes: int = 256 * 2**20

    def __init__(self, config, processor):
        self.config = config
        self.processor = _with_own_tokenizer(processor)
        token = getattr(config, "image_token_id", None)  # Gemma 3 names it image_token_index
        self.image_token_id = int(token if token is not None else config.image_token_index)
        self._cache: OrderedDict[tuple[str, ...], VisionInputs] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return type(self).__name__.removesuffix("Adapter")

    # -- compile time (CPU) -----------------------------------------------------------------
    def encode(self, images: Sequence, *, record_id=None) -> VisionInputs:
        """Run the processor on one request's images (in order).

        Results are cached by the images' sha256 (LRU within :attr:`cache_bytes`), so the same
        images are processed once; a cached result is shared, never modified.

        Args:
            images: :class:`noulengine.records.schema.Image` objects (checked, not yet decoded).

        Returns:
            :class:`VisionInputs` with the expanded image block and the pixel tensors.

        Raises:
            RecordError: an image cannot be decoded, or the processor refuses it (names the
                record, the field ``images`` and the processor's message).
        """
        key = tuple(hashlib.sha256(im.data).hexdigest() for im in images)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        inputs = self._encode(images, record_id=record_id)
        size = inputs.nbytes
        with self._lock:
            if key not in self._cache and size <= self.cache_bytes:
                self._cache[key] = inputs
                self._cached_bytes += size
                while self._cached_bytes > self.cache_bytes:
                    self._cached_bytes -= self._cache.popitem(last=False)[1].nbytes
        return inputs

    def _encode(self, images: Sequence, *, record_id=None) -> VisionInputs:
        """:meth:`encode` without the cache."""
        pil = [to_pil(im, record_id=record_id, field=f"images[{i}]") for i, im in enumerate(images)]
        text = self.placeholder * len(pil)
        try:
            out = self.processor(text=[text], images=pil, return_tensors="pt", add_special_tokens=False)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise RecordError(f"the {self.name} processor refused the images: {exc}", record_id=record_id,
                              field="images") from None
        ids = tuple(int(t) for t in out["input_ids"][0].tolist())
        tensors = {k: out[k] for k in self.pixel_keys if k in out}
        return VisionInputs(image_ids=ids, tensors=tensors, num_images=len(pil),
                            image_tokens=sum(1 for t in ids if t == self.image_token_id))

    # -- forward time (model device) --------------------------------------------------------
    def concat(self, items: Sequence[VisionInputs]) -> dict[str, torch.Tensor]:
        """The pixel tensors of several requests concatenated in row order (default: dim 0)."""
        return {k: torch.cat([it.tensors[k] for it in items], 0) for k in items[0].tensors}

    def image_features(self, model, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """(N, D) image features, one row per image token of the concatenated requests, in order.

        Args:
            model: the top-level VLM (``...ForConditionalGeneration``); its ``model`` holds the
                vision tower and projector.
            tensors: :meth:`concat`'s output on the model's device.
        """
        out = model.model.get_image_features(**tensors)
        feats = getattr(out, "pooler_output", out)
        if isinstance(feats, (list, tuple)):
            feats = torch.cat(list(feats), 0)
        return feats.reshape(-1, feats.shape[-1])

    def position_ids(self, model, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     rows: Sequence[tuple[int, int, VisionInputs]]) -> torch.Tensor:
        """Position ids for the language model (default: the tree depths as given).

        Args:
            model: the top-level VLM.
            input_ids, position_ids: (B, L) int64 on the model's device (tree depths).
            rows: ``(row, prefix_tokens, inputs)`` for each row that holds images.

        Returns:
            (B, L) int64, or what the family's language model takes (Qwen2-VL: (3, B, L)).
        """
        return position_ids


class Qwen2VLAdapter(VisionAdapter):
    """Qwen2-VL and Qwen2.5-VL: 3-D multimodal rotary positions (``get_rope_index``).

    The prefix (holding every image) gets the model's own ``(3, P)`` positions; every token after
    it continues from the prefix's rope offset: text position ``p`` (tree depth) becomes
    ``p + delta`` on all three axes, with ``delta = max(prefix positions) + 1 - P``, which is what
    ``get_rope_index`` gives the branch tokens of a separate ``prefix + branch`` prompt.
    """

    model_types = ("qwen2_vl", "qwen2_5_vl")
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    pixel_keys = ("pixel_values", "image_grid_thw")

    def position_ids(self, model, input_ids, position_ids, rows):
        """(3, B, L) int64: the tree depths on all three axes; rows with images rebuilt as above."""
        pos3 = position_ids[None].expand(3, -1, -1).clone()
        for row, p, inputs in rows:
            ids = input_ids[row:row + 1, :p]
            mm = (ids == self.image_token_id).to(torch.int)
            grid = inputs.tensors["image_grid_thw"].to(ids.device)
            prefix_pos, _ = model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid)
            delta = int(prefix_pos.max()) + 1 - p
            pos3[:, row, :p] = prefix_pos[:, 0]
            tail = pos3[:, row, p:]
            pos3[:, row, p:] = torch.where(tail > 0, tail + delta, tail)  # padding (position 0) stays 0
        return pos3


class Idefics3Adapter(VisionAdapter):
    """Idefics3 and SmolVLM: 1-D positions; images (and tiles) as ``(1, N, 3, S, S)`` pixels."""

    model_types = ("idefics3", "smolvlm")
    placeholder = "<image>"
    pixel_keys = ("pixel_values", "pixel_attention_mask")

    def concat(self, items):
        """All requests' images (tiles) as one batch row: ``(1, sum N, 3, H, W)`` pixels, each
        request's images padded with zeros to the largest height and width (the vision tower drops
        all-zero images and masks padded pixels through ``pixel_attention_mask``)."""
        h = max(it.tensors["pixel_values"].shape[-2] for it in items)
        w = max(it.tensors["pixel_values"].shape[-1] for it in items)
        pix, masks = [], []
        for it in items:
            pv = it.tensors["pixel_values"]
            n = pv.shape[1]
            padded = pv.new_zeros((1, n, pv.shape[2], h, w))
            padded[..., : pv.shape[-2], : pv.shape[-1]] = pv
            pix.append(padded)
            pm = it.tensors.get("pixel_attention_mask")
            if pm is None:
                pm = torch.ones((1, n, pv.shape[-2], pv.shape[-1]), dtype=torch.long)
            m = pm.new_zeros((1, n, h, w))
            m[..., : pm.shape[-2], : pm.shape[-1]] = pm
            masks.append(m)
        return {"pixel_values": torch.cat(pix, 1), "pixel_attention_mask": torch.cat(masks, 1)}


class Gemma3Adapter(VisionAdapter):
    """Gemma 3 (image-text): the image's soft tokens attend to each other bidirectionally.

    ``Gemma3ForConditionalGeneration`` applies no final-logit soft-cap (only
    ``Gemma3ForCausalLM`` does, transformers 5.24 ``modeling_gemma3.py``), so neither does the
    readout.
    """

    model_types = ("gemma3",)
    placeholder = "<start_of_image>"
    bidirectional_images = True
    applies_softcap = False


ADAPTERS: tuple[type[VisionAdapter], ...] = (Qwen2VLAdapter, Idefics3Adapter, Gemma3Adapter)


def is_vision_language(model_or_config) -> bool:
    """True for a vision-language model or its config (the config has a ``vision_config``)."""
    return hasattr(getattr(model_or_config, "config", model_or_config), "vision_config")


def _with_own_tokenizer(processor):
    """A shallow copy of ``processor`` holding its own copy of the tokenizer.

    Hugging Face fast tokenizers implement ``split_special_tokens`` by setting a flag on the
    shared Rust tokenizer for the call. The compiler tokenizes user text with it on (special-token
    strings stay text) and the processor with it off (placeholders become image tokens). With one
    tokenizer, a processor call in an HTTP request thread during a compile in the model's worker
    thread flipped the flag under the other: placeholders were split (the processor refused the
    image) and user text could become real special tokens. Separate copies share no flag.
    """
    import copy

    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None:
        return processor
    own = copy.copy(processor)
    own.tokenizer = copy.deepcopy(tokenizer)
    return own


def adapter_for(config, processor) -> VisionAdapter:
    """The adapter for a VLM config (by ``config.model_type``).

    Raises:
        UnsupportedModalityError: no adapter for this family (names it and the supported ones).
    """
    model_type = getattr(config, "model_type", None)
    for cls in ADAPTERS:
        if model_type in cls.model_types:
            if processor is None:
                raise UnsupportedModalityError(f"vision-language model {model_type!r} needs its processor "
                                               "(give processor= or load with Engine.from_pretrained)")
            return cls(config, processor)
    known = sorted(t for cls in ADAPTERS for t in cls.model_types)
    raise UnsupportedModalityError(f"vision-language family {model_type!r} has no adapter; supported: {known} "
                                   "(docs/vision.md: adding a family)")


def image_blocks(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(B, L, L) bool: True where query and key are image tokens of the same contiguous run.

    The rule of Gemma 3's own mask (``token_type_ids`` runs, transformers
    ``gemma3.modeling_gemma3.get_block_sequence_ids_for_mask``): each image's tokens form one
    block that attends both ways; different images and text stay causal.
    """
    from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

    group = get_block_sequence_ids_for_mask((input_ids == image_token_id).to(torch.int64))
    return (group[:, :, None] == group[:, None, :]) & (group[:, :, None] >= 0)
