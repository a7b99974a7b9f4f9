"""Training: fine-tune a causal LM on canonical records so it answers through a readout
(``symbols``, ``label-token``, ``label-sequence`` or ``auto``; docs/training.md).

``noulengine train --data train.jsonl --output DIR`` or :func:`train`. Prompts come from the
engine's compiler and the loss is read through the engine's masks and readout, so what is
trained is exactly what is served; the output directory loads wherever a model does.
"""

from noulengine.train.config import TrainConfig
from noulengine.train.data import TrainingDataError, load_training_rows


def __getattr__(name):  # lazy: the trainer imports torch; TrainConfig and the data checks do not
    if name in ("TrainResult", "train"):
        from noulengine.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'noulengine.train' has no attribute {name!r}")


__all__ = ["TrainConfig", "TrainResult", "TrainingDataError", "load_training_rows", "train"]
