"""Loading a vision-language checkpoint's processor offline, without video support.

``AutoProcessor`` builds the checkpoint's own processor. Qwen2-VL / Qwen2.5-VL and SmolVLM
processors also require a video processor, which needs torchvision; torchvision does not import
with the CPU torch 2.13 build used here (../shared/FACTS.md). noulengine reads still images only,
so for those families the same processor class is built without its video part: image
processor and tokenizer from the checkpoint, the processor's own placeholder expansion unchanged.
"""

from __future__ import annotations

import functools


# model_type -> the processor class transformers builds only with a video processor
IMAGE_ONLY_PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                         "smolvlm": "SmolVLMProcessor"}


@functools.lru_cache(maxsize=None)
def image_only(processor_cls):
    """``processor_cls`` with an ``__init__`` that takes no video processor.

    ``ProcessorMixin`` reads a processor's parts from its ``__init__`` signature, so a subclass
    without the ``video_processor`` argument saves and loads as image processor + tokenizer. The
    attributes the parent's ``__init__`` sets (token strings and ids, SmolVLM's
    ``image_seq_len``) are set the same way; the text expansion is the parent's, unchanged.
    """
    from transformers import ProcessorMixin

    if processor_cls.__name__ == "SmolVLMProcessor":
        def __init__(self, image_processor=None, tokenizer=None, image_seq_len: int = 169, chat_template=None,
                     **kwargs):
            for name, default in (("fake_image_token", "<fake_token_around_image>"), ("image_token", "<image>"),
                                  ("end_of_utterance_token", "<end_of_utterance>"),
                                  ("global_image_token", "<global-img>"), ("video_token", "<video>")):
                setattr(self, name, getattr(tokenizer, name, default))
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.image_seq_len = image_seq_len
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
    else:  # Qwen2-VL / Qwen2.5-VL
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            for kind, default in (("image", "<|image_pad|>"), ("video", "<|video_pad|>")):
                token = getattr(tokenizer, f"{kind}_token", None) or default
                setattr(self, f"{kind}_token", token)
                setattr(self, f"{kind}_token_id", tokenizer.convert_tokens_to_ids(token))
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return type(f"ImageOnly{processor_cls.__name__}", (processor_cls,), {"__init__": __init__, "__doc__":
                f"{processor_cls.__name__} without its video processor (still images only)."})


def load_processor(directory: str, config):
    """The processor of the VLM checkpoint in ``directory`` (local files only).

    ``AutoProcessor`` first; for the families in :data:`IMAGE_ONLY_PROCESSORS` whose processor
    cannot be built here (no torchvision for the video processor, no ``num2words``), the same
    class without video, from the checkpoint's image processor, tokenizer and
    ``processor_config.json`` settings.

    Raises:
        OSError: no processor can be built (names the directory and the first error).
    """
    import json
    from pathlib import Path

    import transformers
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
    if model_type not in IMAGE_ONLY_PROCESSORS:
        why = error or f"AutoProcessor gave a {type(processor).__name__}, not an image processor"
        raise OSError(f"{directory}: cannot load the {model_type!r} processor: {why}")
    cls = image_only(getattr(transformers, IMAGE_ONLY_PROCESSORS[model_type]))
    settings = {}
    saved = Path(directory) / "processor_config.json"
    if saved.is_file() and model_type == "smolvlm":
        settings = {k: v for k, v in json.loads(saved.read_text(encoding="utf-8")).items() if k == "image_seq_len"}
    image_processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return cls(image_processor=image_processor, tokenizer=tokenizer, **settings)
