"""noulengine: turn a language model into a decision model.

A request carries a ``state`` (JSON evidence, optionally images) and one or more typed questions
(``choice``, ``score``, ``noul``); the engine answers each with probabilities over its candidate
labels, read from the model's logits in one forward pass, without generating text.
"""

__version__ = "0.1.0"


def __getattr__(name):  # lazy: importing noulengine must not import torch/transformers
    if name == "EngineConfig":
        from noulengine.engine.config import EngineConfig

        return EngineConfig
    if name == "Engine":
        from noulengine.engine.engine import Engine

        return Engine
    if name in ("Decision", "Answer"):
        from noulengine.engine import decision as _decision

        return getattr(_decision, name)
    raise AttributeError(f"module 'noulengine' has no attribute {name!r}")


__all__ = ["Answer", "Decision", "Engine", "EngineConfig", "__version__"]
