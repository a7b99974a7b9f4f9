"""Loading a vision-language checkpoint's processor offline, without video support.

``AutoProcessor`` builds the checkpoint's own processor. Qwen2-VL / Qwen2.5-VL and SmolVLM
processors also require a video processor, which needs torchvision; torchvision does not import
with the CPU torch 2.13 build used here (../shared/FACTS.md). noulengine reads still images only,
so for those families the same processor class is built without its video part: image
processor and tokenizer from the checkpoint, the processor's own placeholder expansion unchanged.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def image_only(processor_cls):
    """``processor_cls`` with an ``__init__`` that takes no video processor.

    ``ProcessorMixin`` reads a processor's parts from its ``__init__`` signature, so a subclass
    without the ``video_processor`` argument saves and loads as image processor + tokenizer.
    """
    from transformers import ProcessorMixin

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # what the parent's __init__ sets before ProcessorMixin.__init__ (token strings and ids)
        for kind, default in (("image", "<|image_pad|>"), ("video", "<|video_pad|>")):
            token = getattr(tokenizer, f"{kind}_token", None) or default
            setattr(self, f"{kind}_token", token)
            setattr(self, f"{kind}_token_id", tokenizer.convert_tokens_to_ids(token))
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return type(f"ImageOnly{processor_cls.__name__}", (processor_cls,), {"__init__": __init__, "__doc__":
                f"{processor_cls.__name__} without its video processor (still images only)."})


def load_processor(directory: str, config):
    """The processor of the VLM checkpoint in ``directory`` (local files only).

    Raises:
        OSError / ValueError: neither the checkpoint's processor nor an image-only one can be built
            (the message names the directory and the first error).
    """
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    model_type = getattr(config, "model_type", "")
    try:
        processor = AutoProcessor.from_pretrained(directory, local_files_only=True)
        error = None
    except (OSError, ValueError, AttributeError, ImportError) as exc:
        processor, error = None, exc
    # A processor class transformers does not know (e.g. a saved image-only one) makes
    # AutoProcessor fall back to the bare tokenizer: that is no processor either.
    if processor is not None and hasattr(processor, "image_processor"):
        return processor
    if model_type not in ("qwen2_vl", "qwen2_5_vl"):
        why = error or f"AutoProcessor gave a {type(processor).__name__}, not an image processor"
        raise OSError(f"{directory}: cannot load the {model_type!r} processor: {why}")
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor

    cls = image_only(Qwen2_5_VLProcessor if model_type == "qwen2_5_vl" else Qwen2VLProcessor)
    image_processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return cls(image_processor=image_processor, tokenizer=tokenizer)
