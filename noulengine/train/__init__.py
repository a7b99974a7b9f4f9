"""Training: fine-tune a causal LM on canonical records so it answers through a readout
(``symbols``, ``label-token``, ``label-sequence`` or ``auto``; docs/training.md).

``noulengine train --data train.jsonl --output DIR`` or :func:`train`. Prompts come from the
engine's compiler and the loss is read through the engine's masks and readout, so what is
trained is exactly what is served; the output directory loads wherever a model does.
"""

from noulengine.train.data import TrainingDataError, load_training_rows
from noulengine.train.trainer import TrainConfig, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "TrainingDataError", "load_training_rows", "train"]
