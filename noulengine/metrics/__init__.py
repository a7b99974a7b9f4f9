"""Decision metrics: answer validation, proper scores, calibration error, slices and a scorer.

* :mod:`~noulengine.metrics.validation`: ``validate_answer``, ``check_answer``, ``answer_probabilities``.
* :mod:`~noulengine.metrics.functional`: tensor metrics (accuracy, NLL, Brier, ordinal MAE, RPS,
  KL, Brier vs a distribution, TVD, binary ROC AUC).
* :mod:`~noulengine.metrics.calibration`: 15-bin ECE (``expected_calibration_error``).
* :mod:`~noulengine.metrics.slots`: predicted vs gold share per candidate slot.
* :mod:`~noulengine.metrics.reliability`: ``plot_reliability`` (matplotlib, imported lazily).
* :mod:`~noulengine.metrics.scorer`: ``Scorer`` / ``score`` over ``(record, answer_map)`` pairs.

Importing this package does not import torch; the submodules that need it import it themselves.
"""

_EXPORTS = {
    "validate_answer": "validation", "check_answer": "validation", "answer_probabilities": "validation",
    "InvalidAnswerError": "validation",
    "accuracy": "functional", "nll": "functional", "brier": "functional", "expected_level": "functional",
    "ordinal_mae": "functional", "rps": "functional", "kl_divergence": "functional",
    "brier_distribution": "functional", "total_variation": "functional", "binary_auc": "functional",
    "expected_calibration_error": "calibration", "calibration_bins": "calibration", "bin_index": "calibration",
    "slot_shares": "slots",
    "plot_reliability": "reliability",
    "Scorer": "scorer", "score": "scorer", "summarize": "scorer",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"noulengine.metrics.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'noulengine.metrics' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
