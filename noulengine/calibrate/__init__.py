"""Calibration of decision probabilities.

* :mod:`~noulengine.calibrate.temperature`: temperature scaling (Guo et al. 2017):
  ``fit_temperature``, ``apply_temperature``, ``calibrated_probabilities``, ``fit_grouped``,
  ``temperature_for``.
* :mod:`~noulengine.calibrate.file`: the calibration file (``load_calibration``, ``Calibration``).
* :mod:`~noulengine.calibrate.validation`: validation files and their refusal rules (``load_validation``).
* :mod:`~noulengine.calibrate.run`: the whole flow (``run_calibration``); CLI in ``__main__``.

Importing this package does not import torch.
"""

_EXPORTS = ("TemperatureFit", "GroupFit", "fit_temperature", "apply_temperature", "calibrated_probabilities",
            "fit_grouped", "temperature_for", "default_parent", "pack_logits", "mean_nll")
_OTHER = {"load_calibration": "file", "parse_calibration": "file", "Calibration": "file",
          "CalibrationFileError": "file", "load_validation": "validation", "ValidationFileError": "validation",
          "run_calibration": "run"}


def __getattr__(name):
    if name in _EXPORTS:
        from noulengine.calibrate import temperature

        return getattr(temperature, name)
    if name in _OTHER:
        import importlib

        return getattr(importlib.import_module(f"noulengine.calibrate.{_OTHER[name]}"), name)
    raise AttributeError(f"module 'noulengine.calibrate' has no attribute {name!r}")


__all__ = sorted(_EXPORTS + tuple(_OTHER))
