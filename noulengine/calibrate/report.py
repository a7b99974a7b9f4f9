"""Human-facing outputs of a calibration run: a text summary and reliability diagrams."""

from __future__ import annotations

from pathlib import Path


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def summary_text(data: dict) -> str:
    """A short plain-text summary of a calibration file's content."""
    lines = [f"model: {(data.get('model') or {}).get('name')}  readout: {data['readout']}  debias: {data['debias']}  "
             f"group_by: {data['group_by']}  min_rows: {data['min_rows']}",
             f"rows: {data['rows']['calibration']} calibration, {data['rows']['selection']} selection "
             f"(limit per role and file: {data.get('limit_per_role')})",
             "temperatures:"]
    for g, gf in data["groups"].items():
        fit = gf.get("fit")
        if fit:
            how = f"fitted on {gf['n_rows']} rows, converged={fit['converged']}, hit_bound={fit['hit_bound']}"
        else:  # too few rows of its own: a parent group's temperature, which may be fitted on the same rows
            src_rows = (data["groups"].get(gf["source"]) or {}).get("n_rows")
            how = (f"{gf['n_rows']} rows, under min_rows: group {gf['source']}'s temperature"
                   + (", fitted on these same rows" if src_rows == gf["n_rows"] else
                      f", fitted on {src_rows} rows" if src_rows is not None else ""))
        lines.append(f"  {g:<16} T = {gf['temperature']:.4f}  ({how})")
    for role in ("calibration", "selection"):
        m = (data.get("metrics") or {}).get(role)
        if not m:
            continue
        lines.append(f"{role} (before -> after):   n      NLL              Brier            ECE(15)          acc")
        for src, ba in m.items():
            b, a = ba["before"], ba["after"]
            if b is None:
                continue
            lines.append(f"  {src:<14} {b['n']:>6}  {_fmt(b['nll'])} -> {_fmt(a['nll'])}  {_fmt(b['brier'])} -> "
                         f"{_fmt(a['brier'])}  {_fmt(b['ece'])} -> {_fmt(a['ece'])}  {_fmt(b['accuracy'])} -> "
                         f"{_fmt(a['accuracy'])}")
    lines.append(f"argmax changed by calibration: {data.get('argmax_changed')}")
    if not data.get("selection_nll_worse"):  # when worse, its warning below says so, once
        lines.append("selection NLL worse: False")
    for w in data.get("warnings", []):
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def plot_before_after(run, out_prefix: str | Path) -> list[Path]:
    """Reliability diagrams of the selection rows (calibration rows when there are none),
    before (T = 1) and after; returns the PNG paths ``<prefix>_before.png``, ``<prefix>_after.png``."""
    from noulengine.calibrate.scoring import reliability_inputs
    from noulengine.metrics.reliability import plot_reliability

    items = run.selection_items or run.calibration_items
    role = "selection" if run.selection_items else "calibration"
    prefix = Path(out_prefix)
    paths = []
    for tag, temp_of in (("before", lambda _it: 1.0), ("after", run.temperature_of)):
        conf, ok = reliability_inputs(items, temp_of)
        paths.append(plot_reliability(conf, ok, prefix.parent / f"{prefix.name}_{tag}.png",
                                      title=f"{role} rows, {tag} temperature scaling"))
    return paths
