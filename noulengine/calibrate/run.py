"""The calibration flow: collect logits, fit grouped temperatures on calibration rows only,
score selection rows before and after, and build the calibration file's content.

Temperature scaling follows Guo et al. 2017 (one ``T`` per group, NLL-fitted, argmax-preserving);
with ``debias="contextual"`` the logits already have the content-free prior removed (Zhao et al.
2021), and the temperature is fitted on top of that.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field

from noulengine.calibrate.collect import Item, collect
from noulengine.calibrate.file import FORMAT, GROUP_MODES, VERSION, Calibration, group_key, parse_calibration
from noulengine.calibrate.scoring import argmax, probabilities, score_items
from noulengine.calibrate.temperature import fit_grouped
from noulengine.calibrate.validation import ValidationSet, limit_per_role

DEFAULT_MIN_ROWS = 50
DEFAULT_BOUNDS = (0.05, 20.0)


@dataclass
class CalibrationRun:
    """What :func:`run_calibration` produced.

    Attributes:
        data: the calibration file content (JSON-able dict).
        calibration: the same, parsed (``temperature_for`` ready).
        calibration_items, selection_items: the collected decisions of each role.
        warnings: every doubtful thing, also stored in ``data["warnings"]``.
    """

    data: dict
    calibration: Calibration
    calibration_items: list[Item]
    selection_items: list[Item]
    warnings: list[str] = field(default_factory=list)

    def temperature_of(self, item: Item) -> float:
        return self.calibration.temperature_for(item.type, item.num_candidates)


def _by_source(items: list[Item]) -> dict[str, list[Item]]:
    out: dict[str, list[Item]] = {}
    for it in items:
        out.setdefault(it.source, []).append(it)
    return out


def _metrics(items: list[Item], temp_of) -> dict:
    one = lambda _it: 1.0  # noqa: E731
    out = {"all": {"before": score_items(items, one), "after": score_items(items, temp_of)}}
    for src, part in sorted(_by_source(items).items()):
        out[src] = {"before": score_items(part, one), "after": score_items(part, temp_of)}
    return out


def run_calibration(engine, vset: ValidationSet, *, group_by: str = "type+options", min_rows: int = DEFAULT_MIN_ROWS,
                    limit_per_role_n: int | None = None, bounds: tuple[float, float] = DEFAULT_BOUNDS,
                    progress=None) -> CalibrationRun:
    """Fit temperatures on ``vset``'s calibration rows with ``engine``; score its selection rows.

    Args:
        engine: an uncalibrated :class:`~noulengine.engine.engine.Engine` (its readout and debias
            are recorded; any loaded calibration is ignored since ``Answer.logprobs`` is pre-temperature).
        vset: from :func:`~noulengine.calibrate.validation.load_validation` (already checked).
        group_by: ``global`` | ``type`` | ``type+options``.
        min_rows: a group with fewer rows falls back to its parent (``choice+4`` -> ``choice`` -> ``global``).
        limit_per_role_n: keep at most this many rows per role and file
            (:func:`~noulengine.calibrate.validation.limit_per_role`); None keeps all.
        bounds: temperature bounds for the fit.

    Raises:
        ValueError: bad ``group_by``; no calibration decision could be collected.
    """
    if group_by not in GROUP_MODES:
        raise ValueError(f"group_by must be one of {list(GROUP_MODES)}, got {group_by!r}")
    cal_rows = limit_per_role(vset.calibration, limit_per_role_n)
    sel_rows = limit_per_role(vset.selection, limit_per_role_n)
    cal_items, cal_err = collect(engine, cal_rows, progress=progress)
    sel_items, sel_err = collect(engine, sel_rows, progress=progress)
    if not cal_items:
        raise ValueError(f"no calibration decision was answered ({len(cal_err)} engine errors); nothing to fit")
    keys = [group_key(group_by, it.type, it.num_candidates) for it in cal_items]
    fits = fit_grouped([(it.logits, it.gold) for it in cal_items], keys, min_rows=min_rows, bounds=bounds)
    warnings: list[str] = []
    for g, gf in sorted(fits.items()):
        if gf.fit is not None:
            warnings.extend(f"group {g!r}: {w}" for w in gf.fit.warnings)
        if gf.source != g:
            src_rows = fits[gf.source].n_rows if gf.source in fits else None
            same = " (fitted on these same rows)" if src_rows == gf.n_rows else ""
            warnings.append(f"group {g!r} has {gf.n_rows} calibration rows (< min_rows={min_rows}); "
                            f"uses the temperature of group {gf.source!r}, {gf.temperature:.4g}{same}")
    if cal_err or sel_err:
        warnings.append(f"the engine refused {len(cal_err)} calibration and {len(sel_err)} selection request(s); "
                        "they are excluded")
    identity = getattr(engine, "identity", None)
    data = {
        "format": FORMAT, "version": VERSION,
        "model": identity.to_dict() if identity is not None else None,
        "readout": engine.config.readout, "debias": engine.config.debias,
        # an engine-like object without a compiler (a stand-in in tests) was state-first
        "layout": getattr(getattr(engine, "compiler", None), "layout", "state-first"),
        "prompt_version": getattr(getattr(engine, "compiler", None), "prompt_version", None),
        "group_by": group_by, "min_rows": min_rows, "bounds": list(bounds),
        "groups": {g: gf.to_dict() for g, gf in sorted(fits.items())},
        "validation_files": list(vset.files),
        "limit_per_role": limit_per_role_n,
        "rows": {"calibration": len(cal_rows), "selection": len(sel_rows),
                 "calibration_decisions": len(cal_items), "selection_decisions": len(sel_items),
                 "engine_errors": cal_err + sel_err,
                 "available": {"calibration": len(vset.calibration), "selection": len(vset.selection)}},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    cal = parse_calibration(data)
    run = CalibrationRun(data=data, calibration=cal, calibration_items=cal_items, selection_items=sel_items,
                         warnings=warnings)
    temp_of = run.temperature_of
    data["metrics"] = {"calibration": _metrics(cal_items, temp_of),
                       "selection": _metrics(sel_items, temp_of) if sel_items else None}
    changed = 0
    for items in (cal_items, sel_items):
        if items:
            p = probabilities(items, temp_of)
            changed += int((p.argmax(dim=1) != argmax(items)).sum())
    data["argmax_changed"] = changed
    worse = False
    if sel_items:
        sel = data["metrics"]["selection"]["all"]
        worse = not (sel["after"]["nll"] <= sel["before"]["nll"]) or not math.isfinite(sel["after"]["nll"])
        if worse:
            warnings.append(f"selection NLL got worse after calibration ({sel['before']['nll']:.4f} -> "
                            f"{sel['after']['nll']:.4f} nats): the file is flagged (selection_nll_worse: true); "
                            "check the data before using these temperatures")
    else:
        warnings.append("no selection rows: the temperatures were not checked on held-out rows")
    data["selection_nll_worse"] = worse
    data["warnings"] = warnings
    return run
