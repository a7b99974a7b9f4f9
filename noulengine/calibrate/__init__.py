"""Calibration of decision probabilities.

* :mod:`~noulengine.calibrate.temperature`: temperature scaling (Guo et al. 2017):
  ``fit_temperature``, ``apply_temperature``, ``calibrated_probabilities``, ``fit_grouped``,
  ``temperature_for``.

Importing this package does not import torch.
"""

_EXPORTS = ("TemperatureFit", "GroupFit", "fit_temperature", "apply_temperature", "calibrated_probabilities",
            "fit_grouped", "temperature_for", "default_parent", "pack_logits", "mean_nll")


def __getattr__(name):
    if name in _EXPORTS:
        from noulengine.calibrate import temperature

        return getattr(temperature, name)
    raise AttributeError(f"module 'noulengine.calibrate' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
