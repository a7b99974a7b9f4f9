"""noulengine as an lm-evaluation-harness model (``--model noulengine``; docs/lm-eval.md).

Importing this package registers the model with lm-eval's registry (lazily: the model module, and
torch, load when lm-eval first asks for ``noulengine``), so ``lm_eval.simple_evaluate(model=
"noulengine", ...)`` works after ``import noulengine.lmeval``; ``noulengine lm-eval ARGS...`` runs
lm-eval's own command line with it registered (lm-eval 0.4.13 has no entry-point plugin mechanism
for models).

Modules: :mod:`~noulengine.lmeval.model` (the ``LM``: arguments, tokenisation as the ``hf`` backend,
refusals), :mod:`~noulengine.lmeval.tree` (requests grouped by context into token trees),
:mod:`~noulengine.lmeval.loglikelihood` (the forward passes), :mod:`~noulengine.lmeval.readout`
(full-vocabulary log-probabilities and greedy flags), :mod:`~noulengine.lmeval.cli` (the command).
"""

from __future__ import annotations

MODEL_NAME = "noulengine"
MODEL_TARGET = "noulengine.lmeval.model:NoulEngineLM"


def register() -> None:
    """Register ``noulengine`` in lm-eval's model registry (idempotent; imports no torch).

    Raises:
        ImportError: lm-eval is not installed (``pip install 'noulengine[lm-eval]'``).
    """
    import lm_eval.models  # noqa: F401 - lm-eval's own models first: it fills an empty registry only
    from lm_eval.api.registry import model_registry

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)


try:
    register()
except ImportError:  # lm-eval not installed: `noulengine lm-eval` says how to install it
    pass
