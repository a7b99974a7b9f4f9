"""The calibration file: temperatures fitted for one model, readout and debias mode.

A calibration file is one JSON object (written by ``noulengine calibrate``)::

    {"format": "noulengine-calibration", "version": 1,
     "model": {"name", "path", "sha256"} | null,     # Engine.identity.to_dict(); null for unidentified models
     "readout": "auto", "debias": "none", "layout": "state-first", "prompt_version": "...",
     "group_by": "global" | "type" | "type+options", "min_rows": 50,
     "groups": {key: {"temperature", "source", "n_rows", "fallback", "fit"}},   # GroupFit.to_dict()
     "rows": {...}, "metrics": {...}, "warnings": [...], "selection_nll_worse": bool}

Only ``format``, ``version``, ``model``, ``readout``, ``debias``, ``layout`` (absent in files
written before prompt layouts existed: ``state-first``), ``group_by`` and ``groups`` are
needed to apply it; the rest documents how it was made. Temperatures follow Guo et al. 2017:
``p = softmax(z / T)`` with ``T`` looked up per question group, walking up
``"choice+4" -> "choice" -> "global"`` for groups that had no fit of their own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from noulengine.calibrate.temperature import GLOBAL, default_parent
from noulengine.records.errors import NoulEngineError

FORMAT = "noulengine-calibration"
VERSION = 1
GROUP_MODES = ("global", "type", "type+options")


class CalibrationFileError(NoulEngineError, ValueError):
    """A calibration file is malformed or was made for another model, readout or debias mode."""


def group_key(group_by: str, qtype: str, num_candidates: int) -> str:
    """The leaf group of a question: ``"global"``, ``"choice"`` or ``"choice+4"``."""
    if group_by == "global":
        return GLOBAL
    if group_by == "type":
        return qtype
    if group_by == "type+options":
        return f"{qtype}+{int(num_candidates)}"
    raise ValueError(f"group_by must be one of {list(GROUP_MODES)}, got {group_by!r}")


@dataclass
class Calibration:
    """Temperatures per question group, as loaded from a calibration file.

    Attributes:
        temperatures: group key -> the temperature that group uses (after fallback).
        group_by: how questions map to groups (see :func:`group_key`).
        model: the model identity dict the file was fitted for, or None.
        readout, debias: the engine settings the temperatures were fitted under.
        layout: the prompt layout they were fitted under (``state-first`` or ``schema-first``).
        data: the whole file content (for :meth:`to_dict`).
        path: where it was read from, or None.
    """

    temperatures: dict[str, float]
    group_by: str
    model: dict | None
    readout: str
    debias: str
    data: dict = field(default_factory=dict)
    path: str | None = None
    layout: str = "state-first"

    def temperature_for(self, qtype: str, num_candidates: int) -> float:
        """The temperature for a question of type ``qtype`` with ``num_candidates`` candidates.

        Unseen groups walk up to their nearest fitted ancestor (``"global"`` always exists).
        """
        key: str | None = group_key(self.group_by, qtype, num_candidates)
        while key is not None:
            if key in self.temperatures:
                return self.temperatures[key]
            key = default_parent(key)
        return self.temperatures[GLOBAL]

    def to_dict(self) -> dict:
        """The file content (JSON-able)."""
        return dict(self.data)


def _fail(path, rule: str) -> CalibrationFileError:
    return CalibrationFileError(f"calibration file {path}: {rule}")


def parse_calibration(data, *, path="<dict>") -> Calibration:
    """Validate a calibration dict and build a :class:`Calibration`.

    Raises:
        CalibrationFileError: naming the rule broken.
    """
    if not isinstance(data, dict):
        raise _fail(path, f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise _fail(path, f"'format' must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("version") != VERSION:
        raise _fail(path, f"unsupported 'version' {data.get('version')!r}; this noulengine reads version {VERSION}")
    model = data.get("model")
    if model is not None and not (isinstance(model, dict) and isinstance(model.get("sha256"), (str, type(None)))):
        raise _fail(path, "'model' must be null or an object with a 'sha256' string")
    for key in ("readout", "debias"):
        if not isinstance(data.get(key), str):
            raise _fail(path, f"'{key}' must be a string, got {data.get(key)!r}")
    layout = data.get("layout", "state-first")
    if layout not in ("state-first", "schema-first"):
        raise _fail(path, f"'layout' must be 'state-first' or 'schema-first', got {layout!r}")
    group_by = data.get("group_by")
    if group_by not in GROUP_MODES:
        raise _fail(path, f"'group_by' must be one of {list(GROUP_MODES)}, got {group_by!r}")
    groups = data.get("groups")
    if not isinstance(groups, dict) or GLOBAL not in groups:
        raise _fail(path, "'groups' must be an object holding at least the 'global' group")
    temps: dict[str, float] = {}
    for key, g in groups.items():
        t = g.get("temperature") if isinstance(g, dict) else None
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise _fail(path, f"group {key!r}: 'temperature' must be a finite positive number, got {t!r}")
        temps[key] = float(t)
    return Calibration(temperatures=temps, group_by=group_by, model=model, readout=data["readout"],
                       debias=data["debias"], data=data, path=None if path == "<dict>" else str(path), layout=layout)


def check_engine(cal: Calibration, engine, *, path="<dict>") -> None:
    """Refuse a calibration made for another model, readout, debias mode or prompt layout than ``engine``'s.

    Model check: the file's ``model.sha256`` must equal ``engine.identity.sha256``. A file that
    records no model (``null``, made with an unidentified model such as a test fixture) is accepted
    for any engine; a file that names a model is refused for an engine whose model has no identity,
    since it cannot be checked.

    Raises:
        CalibrationFileError: naming both values.
    """
    identity = getattr(engine, "identity", None)
    mine = identity.to_dict() if identity is not None else None
    want = (cal.model or {}).get("sha256")
    have = (mine or {}).get("sha256")
    if want is not None and want != have:
        name = (cal.model or {}).get("name")
        raise _fail(path, f"made for model {name!r} (sha256 {want}), but the engine runs "
                          f"{'an unidentified model' if mine is None else repr(mine.get('name'))} (sha256 {have}); "
                          "temperatures do not transfer between models: re-run noulengine calibrate")
    config = engine.config
    for key in ("readout", "debias", "layout"):
        if key == "layout" and getattr(config, "layout", None) is None:
            continue  # a caller that does not know its layout (an older API user): not checked
        if getattr(config, key) != getattr(cal, key):
            raise _fail(path, f"made with {key} {getattr(cal, key)!r}, but the engine uses {key} "
                              f"{getattr(config, key)!r}; the logits differ, so the temperatures do not apply: "
                              f"re-run noulengine calibrate --{key} {getattr(config, key)}")


def load_calibration(path, engine=None) -> Calibration:
    """Read and validate a calibration file; with ``engine``, refuse a file made for another setup.

    Args:
        path: the JSON file written by ``noulengine calibrate``.
        engine: an :class:`~noulengine.engine.engine.Engine` (or anything with ``identity`` and
            ``config.readout``/``config.debias``), or None to skip the compatibility check.

    Raises:
        CalibrationFileError: unreadable, malformed, or incompatible with ``engine``.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CalibrationFileError(f"calibration file {p} does not exist") from None
    except (OSError, ValueError) as exc:
        raise _fail(p, f"not readable JSON: {exc}") from None
    cal = parse_calibration(data, path=p)
    if engine is not None:
        check_engine(cal, engine, path=p)
    return cal
