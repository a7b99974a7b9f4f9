"""Vision-language models: family adapters, processors and image inputs (docs/vision.md)."""

from noulengine.vision.adapters import ADAPTERS, VisionAdapter, adapter_for, is_vision_language
from noulengine.vision.inputs import VisionInputs

__all__ = ["ADAPTERS", "VisionAdapter", "VisionInputs", "adapter_for", "is_vision_language"]
