"""Tiny random vision-language models, one per supported family, built from configs with fixed seeds.

Sizes follow transformers' own tests for these models (text hidden 64 with 2 layers as in
``conftest.py``; vision towers of 2 layers, 32 hidden): each builds in well under a second on a
CPU. Every builder returns ``(model, processor, tokenizer)``; the processors are the families'
real processor classes with their PIL image processors (no torchvision here), so placeholder
expansion is the processor's own.
"""

from __future__ import annotations

import io

import torch

from tests.conftest import build_tiny_tokenizer

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm", "gemma3")

_QWEN_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
_IDEFICS_SPECIALS = (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
                     + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])
_GEMMA_NAMED = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}

def _text(hidden: int, layers: int) -> dict:
    return dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=2048)


def _ids(tok):
    return dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def build(family: str, *, seed: int = 0, attn: str = "sdpa", dtype=torch.float32, hidden: int = 64,
          layers: int = 2, max_pixels: int = 56 * 56, min_pixels: int = 28 * 28):
    """``(model, processor, tokenizer)`` for one of :data:`FAMILIES` (eval mode).

    ``hidden`` / ``layers`` size the language model; ``min_pixels`` / ``max_pixels`` bound the
    Qwen image processor's resize (56 * 56: 4 image tokens per image; 112 * 112: 16).
    """
    import transformers as tf

    from noulengine.vision.processor import image_only

    _TEXT = _text(hidden, layers)

    if family in ("qwen2_vl", "qwen2_5_vl"):
        tok = build_tiny_tokenizer(_QWEN_SPECIALS)
        vs, ve, img, vid = tok.convert_tokens_to_ids(_QWEN_SPECIALS)
        text = dict(vocab_size=len(tok), **_TEXT, **_ids(tok),
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [hidden // 16, hidden // 32, hidden // 32]})
        if family == "qwen2_vl":
            vision = dict(depth=2, embed_dim=32, hidden_size=hidden, num_heads=4, mlp_ratio=2, patch_size=14,
                          spatial_merge_size=2, temporal_patch_size=2)
            cfg_cls, model_cls, proc_cls = tf.Qwen2VLConfig, tf.Qwen2VLForConditionalGeneration, tf.Qwen2VLProcessor
        else:
            vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=hidden,
                          patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                          fullatt_block_indexes=[1])
            cfg_cls, model_cls = tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLForConditionalGeneration
            proc_cls = tf.Qwen2_5_VLProcessor
        cfg = cfg_cls(text_config=text, vision_config=vision, image_token_id=img, video_token_id=vid,
                      vision_start_token_id=vs, vision_end_token_id=ve, tie_word_embeddings=False,
                      attn_implementation=attn)
        ip = tf.Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, temporal_patch_size=2,
                                         merge_size=2)
        proc = image_only(proc_cls)(image_processor=ip, tokenizer=tok)
    elif family in ("idefics3", "smolvlm"):
        tok = build_tiny_tokenizer(_IDEFICS_SPECIALS)
        cfg_cls = tf.Idefics3Config if family == "idefics3" else tf.SmolVLMConfig
        model_cls = tf.Idefics3ForConditionalGeneration if family == "idefics3" else tf.SmolVLMForConditionalGeneration
        cfg = cfg_cls(text_config=dict(model_type="llama", vocab_size=len(tok), **_TEXT, **_ids(tok)),
                      vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, image_size=32, patch_size=8),
                      scale_factor=2, image_token_id=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
                      attn_implementation=attn)
        ip = tf.Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 32},
                                          max_image_size={"longest_edge": 32})
        proc_cls = tf.Idefics3Processor if family == "idefics3" else image_only(tf.SmolVLMProcessor)
        if family == "smolvlm":
            ip = tf.SmolVLMImageProcessorPil(do_image_splitting=False, size={"longest_edge": 32},
                                             max_image_size={"longest_edge": 32})
        proc = proc_cls(image_processor=ip, tokenizer=tok, image_seq_len=4)
    elif family == "gemma3":
        tok = build_tiny_tokenizer(named=_GEMMA_NAMED)
        cfg = tf.Gemma3Config(
            text_config=dict(vocab_size=len(tok), **_TEXT, head_dim=16, sliding_window=8,
                             layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
                             final_logit_softcapping=30.0,
                             query_pre_attn_scalar=16, **_ids(tok)),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8),
            mm_tokens_per_image=4, image_token_index=tok.image_token_id, boi_token_index=tok.boi_token_id,
            eoi_token_index=tok.eoi_token_id, attn_implementation=attn)
        model_cls = tf.Gemma3ForConditionalGeneration
        ip = tf.Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
        proc = tf.Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=4)
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = model_cls(cfg).to(dtype).eval()
    if family == "gemma3":
        # Gemma 3's projector weight starts at zeros (transformers initialises it so): with random
        # weights the image would not reach the text at all, and no test could see the pixels.
        with torch.no_grad():
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.5)
    return model, proc, tok


def png_bytes(size=(64, 64), seed=0, *, fill=None) -> bytes:
    """A PNG of random pixels (or one ``fill`` colour), as raw bytes."""
    import numpy as np
    from PIL import Image

    if fill is not None:
        im = Image.new("RGB", size, fill)
    else:
        rng = np.random.default_rng(seed)
        im = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def image_field(data: bytes) -> dict:
    """``{"type": "image/png", "data": <base64>}``: the canonical record / HTTP shape."""
    import base64

    return {"type": "image/png", "data": base64.b64encode(data).decode()}
