"""Run outputs: ``metrics.json``, ``report.md`` and ``run.json`` (metadata and throughput)."""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np


def git_revision() -> str | None:
    """The checkout's ``git rev-parse HEAD`` (with ``-dirty`` when there are local changes)."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def library_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("noulengine", "torch", "transformers", "tokenizers", "numpy", "safetensors"):
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = None
    return out


def throughput(results) -> dict:
    """Requests/s, decisions/s, tokens/s over newly run predictions, and latency p50/p95 (s)."""
    seconds = sum(r.seconds for r in results)
    new = sum(r.new_predictions for r in results)
    lat = [x for r in results for x in r.latencies]
    decisions = sum(r.new_decisions for r in results)
    tokens = sum(r.input_tokens for r in results)
    return {"inference_seconds": seconds, "requests": new,
            "requests_per_s": new / seconds if seconds and new else None,
            "decisions_per_s": decisions / seconds if seconds and new else None,
            "tokens_per_s": tokens / seconds if seconds and new else None,
            "latency_p50_s": float(np.percentile(lat, 50)) if lat else None,
            "latency_p95_s": float(np.percentile(lat, 95)) if lat else None,
            "note": "throughput covers the rows run in this invocation (resumed rows are excluded)"}


def _fmt(x, pct=False):
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.4f}"


def write_outputs(results, out_dir: Path, meta: dict) -> dict:
    """Write ``metrics.json``, ``report.md`` and ``run.json``; returns the metrics dict."""
    out_dir = Path(out_dir)
    metrics = {r.name: {"status": r.status, "reason": r.reason if r.status != "ready" else "", "rows": r.rows,
                        "licence": r.licence, "notes": r.notes, "metrics": r.metrics} for r in results}
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, allow_nan=False) + "\n")
    meta = {**meta, "throughput": throughput(results)}
    (out_dir / "run.json").write_text(json.dumps(meta, indent=2, allow_nan=False, default=str) + "\n")
    lines = [f"# Evaluation report: {meta.get('suite')}", "",
             f"Model: `{(meta.get('engine') or {}).get('model', {}) and meta['engine']['model'].get('name')}` "
             f"(sha256 `{((meta.get('engine') or {}).get('model') or {}).get('sha256', '')[:16]}…`), "
             f"device {meta['engine'].get('device')}, dtype {meta['engine'].get('dtype')}, readout "
             f"`{meta['engine'].get('readout')}`, debias `{meta['engine'].get('debias')}`, calibration "
             f"`{meta['engine'].get('calibration')}`. Rows: {meta.get('selection')}. Git `{meta.get('git_revision')}`.",
             "", "| suite | status | rows | decisions | coverage | accuracy | NLL | Brier | ECE | ordinal MAE | TVD | flip rate |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        m = r.metrics
        if not m:
            lines.append(f"| {r.name} | {r.status} | – | – | – | – | – | – | – | – | – | – |")
            continue
        c = m["counts"]
        lines.append(f"| {r.name} | {r.status} | {r.rows} | {c['decisions']} | {_fmt(c['coverage'], True)} | "
                     f"{_fmt(m['accuracy'], True)} | {_fmt(m['nll'])} | {_fmt(m['brier'])} | {_fmt(m['ece'])} | "
                     f"{_fmt(m['ordinal']['mae'])} | {_fmt(m['distribution']['tvd']) if m['distribution']['tvd'] is not None else 'unavailable'} | "
                     f"{_fmt(m.get('flip_rate'))} |")
    for r in results:
        lines += ["", f"## {r.name}", "", f"Status: {r.status}. Licence: {r.licence.rstrip('.')}."]
        if r.status != "ready" and r.reason:
            lines.append(f"Reason: {r.reason}")
        lines += [f"- {n}" for n in r.notes]
        m = r.metrics
        if not m:
            continue
        if m.get("reliability"):
            lines.append(f"\nReliability diagram: `{m['reliability']}`")
        for dim in ("type", "field", "category"):
            sl = m.get("slices", {}).get(dim)
            if not sl or len(sl) < 2:
                continue
            lines += ["", f"| {dim} | decisions | accuracy | NLL | ECE |", "|---|---:|---:|---:|---:|"]
            for key, s in sl.items():
                lines.append(f"| {key} | {s['counts']['decisions']} | {_fmt(s['accuracy'], True)} | {_fmt(s['nll'])} | "
                             f"{_fmt(s['ece'])} |")
        slots = m.get("slots") or []
        if slots:
            lines += ["", "| slot | predicted share | gold share | flag |", "|---:|---:|---:|---|"]
            lines += [f"| {s['slot']} | {_fmt(s['predicted_share'], True)} | {_fmt(s['gold_share'], True)} | "
                      f"{', '.join(s['flags']) or ''} |" for s in slots]
    t = meta["throughput"]
    lines += ["", "## Throughput", "",
              f"{t['requests']} requests run in {t['inference_seconds']:.1f} s: "
              f"{_fmt(t['requests_per_s'])} requests/s, {_fmt(t['decisions_per_s'])} decisions/s, "
              f"{_fmt(t['tokens_per_s'])} tokens/s; latency p50 {_fmt(t['latency_p50_s'])} s, "
              f"p95 {_fmt(t['latency_p95_s'])} s."]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    return metrics
