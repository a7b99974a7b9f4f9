"""Run outputs: ``metrics.json``, ``report.md`` and ``run.json`` (metadata and throughput)."""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np

from noulengine.metrics.reference import reference_lines


def git_revision() -> str | None:
    """The checkout's ``git rev-parse HEAD``; with local changes to tracked files,
    ``<sha>-dirty-<12 hex of sha256(git diff HEAD)>``, so two different sets of local changes
    never read as the same code."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=root, capture_output=True, check=True).stdout
        return rev + (f"-dirty-{hashlib.sha256(diff).hexdigest()[:12]}" if diff.strip() else "")
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


GLOSSARY = [
    "**accuracy**: share of decisions (one question of one row) whose highest-probability label is the gold "
    "label; error rows count as wrong.",
    "**chance**: the accuracy of a uniform guess (mean 1/K). **majority**: always answering each question's most "
    "frequent gold option (the majority-class rate); both are read off the scored gold labels.",
    "**NLL**: mean negative log-probability of the gold label (floor 1e-12); lower is better, ln K is a uniform "
    "guess. **NLL floored**: decisions whose gold probability was at or below the floor (each adds 27.6 nats).",
    "**Brier**: mean over decisions of the sum over candidates of (p - gold)^2; 0 is perfect, 2 the worst.",
    "**ECE**: expected calibration error, 15 equal-width bins of the top probability; how far confidence is from "
    "accuracy.",
    "**TVD**: total variation distance from a gold probability distribution (where the suite has one).",
    "**x_mass**: the probability the model's next-token distribution puts on the candidates before they are "
    "renormalised; near 1 the model answers in the protocol, near 0 the answer rests on tiny numbers.",
    "**flip rate** (`--debias permute`): the mean share of an option list's cyclic rotations whose argmax "
    "differs from the unrotated one. **reversal changed** (`--probe reverse`): the share of scored choice "
    "decisions whose answer changes when the options are asked in reverse order. Both are 0 for a model that "
    "reads option content and near 1 for one that answers by position.",
    "**slot**: a candidate's position in criteria order (0 = first option); a model that predicts one slot far "
    "more often than gold has it is biased by position.",
]


def _selection_text(selection: dict | None) -> str:
    sel = selection or {}
    if sel.get("sample") is not None:
        text = f"a fixed-seed sample of {sel['sample']} rows per suite (seed {sel.get('seed', 0)})"
    elif sel.get("limit") is not None:
        text = f"the first {sel['limit']} rows of each suite"
    else:
        text = "every row"
    if sel.get("workers") is not None:
        text += f"; worker {sel['worker']}'s share of {sel['workers']} (by a hash of the row id)"
    if sel.get("merged_workers") is not None:
        text += f"; merged from {sel['merged_workers']} worker runs"
    return text


def previous_invocations(run_json: Path) -> list[dict]:
    """The invocations recorded by earlier runs into the same folder (resumed runs keep them).

    A ``run.json`` written before invocations were recorded yields its single ``throughput``.
    """
    try:
        old = json.loads(Path(run_json).read_text())
    except (OSError, ValueError):
        return []
    if isinstance(old.get("invocations"), list):
        return old["invocations"]
    if isinstance(old.get("throughput"), dict):
        return [{"started": None, "git_revision": old.get("git_revision"), "wall_s": old.get("wall_s"),
                 "model_load_s": old.get("model_load_s"), "throughput": old["throughput"]}]
    return []


def invocation_totals(invocations: list[dict]) -> dict:
    """Requests, inference seconds and wall seconds summed over every invocation that wrote into a
    run folder (``wall_s``: an interrupted invocation's runs to its kill or last heartbeat, so the
    seconds of a batch lost to the kill count too; None when no invocation recorded one)."""
    req = sum(i["throughput"].get("requests") or 0 for i in invocations)
    sec = sum(i["throughput"].get("inference_seconds") or 0.0 for i in invocations)
    walls = [i["wall_s"] for i in invocations if isinstance(i.get("wall_s"), (int, float))]
    return {"invocations": len(invocations), "requests": req, "inference_seconds": sec,
            "wall_s": sum(walls) if walls else None, "requests_per_s": req / sec if req and sec else None}


_BUILT_IN_SLICES = ("suite", "type", "field", "category")  # noulengine.metrics.scorer.SLICE_DIMENSIONS (no torch here)


def _fmt(x, pct=False):
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.4f}"


def write_outputs(results, out_dir: Path, meta: dict) -> dict:
    """Write ``metrics.json``, ``report.md`` and ``run.json``; returns the metrics dict."""
    out_dir = Path(out_dir)
    metrics = {r.name: {"status": r.status, "reason": r.reason if r.status != "ready" else "", "rows": r.rows,
                        "licence": r.licence, "notes": r.notes, "metrics": r.metrics} for r in results}
    # non-ASCII text (Chinese labels, slice values) is written as itself, in UTF-8
    from noulengine.writes import write_text_atomic  # a failed write: OutputWriteError, no half file

    write_text_atomic(out_dir / "metrics.json", json.dumps(metrics, indent=2, allow_nan=False, ensure_ascii=False) + "\n")
    meta = {"throughput": throughput(results), **meta}  # a caller that computed it already wins
    write_text_atomic(out_dir / "run.json", json.dumps(meta, indent=2, allow_nan=False, default=str, ensure_ascii=False)
                      + "\n")
    eng = meta.get("engine") or {}
    model = eng.get("model") or {}
    sha = model.get("sha256") or ""
    lines = [f"# Evaluation report: {meta.get('suite')}", "",
             f"Model `{model.get('name') or 'unknown'}`" + (f" (sha256 `{sha[:16]}…`)" if sha else "") +
             f"; device {eng.get('device')}, dtype {eng.get('dtype')}; readout `{eng.get('readout')}`, debias "
             f"`{eng.get('debias')}`, calibration " + (f"`{eng['calibration']}`" if eng.get("calibration") else "none") +
             f". Rows: {_selection_text(meta.get('selection'))}." +
             (f" Probe: `{meta['probe']}` (every choice question asked again with its options reversed)."
              if meta.get("probe") else "") + f" Code: git `{meta.get('git_revision') or 'unknown'}`.",
             "", "| suite | status | rows | decisions | coverage | accuracy | chance | majority | NLL | NLL floored | "
                 "Brier | ECE | ordinal MAE | TVD | flip rate | reversal changed | median x_mass |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    warnings = []
    trained, compiled = eng.get("trained_prompt_version"), eng.get("prompt_version")
    if trained and compiled and trained != compiled:
        warnings.append(f"- **model**: trained on prompts of `{trained}`, read here with `{compiled}` (the prompt "
                        "text or its tokenization changed since training; retrain to match)")
    for r in results:
        m = r.metrics
        if not m:
            lines.append(f"| {r.name} | {r.status} |" + " – |" * 15)
            continue
        c = m["counts"]
        base = m.get("baselines") or {}
        tvd = m["distribution"]["tvd"]
        lines.append(f"| {r.name} | {r.status} | {r.rows} | {c['decisions']} | {_fmt(c['coverage'], True)} | "
                     f"{_fmt(m['accuracy'], True)} | {_fmt(base.get('chance'), True)} | "
                     f"{_fmt(base.get('majority'), True)} | {_fmt(m['nll'])} | {m.get('nll_floored', 0)} | "
                     f"{_fmt(m['brier'])} | {_fmt(m['ece'])} | "
                     f"{_fmt(m['ordinal']['mae'])} | {_fmt(tvd) if tvd is not None else 'unavailable'} | "
                     f"{_fmt(m.get('flip_rate'))} | {_fmt(m.get('reversal_change_share'))} | "
                     f"{_mass((m.get('x_mass') or {}).get('median'))} |")
        warnings += [f"- **{r.name}**: {w}" for w in m.get("warnings") or []]
    if warnings:
        lines += ["", "## Warnings", "", *warnings]
    for r in results:
        lines += ["", f"## {r.name}", "", f"Status: {r.status}. Licence: {r.licence.rstrip('.')}."]
        if r.status != "ready" and r.reason:
            lines.append(f"Reason: {r.reason}")
        # the licence is on the Status line: the suite's own "licence: ..." note would say it twice
        lines += [f"- {n}" for n in r.notes if not n.startswith("licence: ")]
        m = r.metrics
        if not m:
            continue
        if m.get("reliability"):
            lines.append(f"\nReliability diagram: `{m['reliability']}`")
        lines += order_probe_lines(m)
        yn = m.get("noul") or {}
        if yn.get("n"):  # accuracy alone hides a P(yes) that sits near 0.5 whatever the text says
            lines.append(f"\nYes/no answers ({yn['n']}): P(yes) separates gold yes from gold no with ROC AUC "
                         f"{_fmt(yn.get('yes_auc'))} (0.5 = no information); median P(yes) "
                         f"{_fmt(yn.get('p_yes_median_yes'))} on gold-yes, {_fmt(yn.get('p_yes_median_no'))} on gold-no.")
        lines += reference_lines(m)  # a benchmark family's own rules, beside the generic metrics
        # the built-in slices, then any the suite's manifest names ("slices": ["level"])
        for dim in ("type", "field", "category", *[d for d in m.get("slices", {}) if d not in _BUILT_IN_SLICES]):
            sl = m.get("slices", {}).get(dim)
            if not sl or len(sl) < 2:
                continue
            ref = any(s.get("reference") for s in sl.values())
            lines += ["", f"| {dim} | decisions | accuracy | NLL | ECE |" + (" reference accuracy | reference ECE |"
                                                                             if ref else ""),
                      "|---|---:|---:|---:|---:|" + ("---:|---:|" if ref else "")]
            for key, s in sl.items():
                sref = s.get("reference") or {}
                lines.append(f"| {key} | {s['counts']['decisions']} | {_fmt(s['accuracy'], True)} | {_fmt(s['nll'])} | "
                             f"{_fmt(s['ece'])} |" + (f" {_fmt(sref.get('accuracy'), True)} | {_fmt(sref.get('ece'))} |"
                                                      if ref else ""))
        conc = m.get("answer_concentration") or []
        if conc:  # per field: does the model answer with the evidence, or one label whatever it says?
            lines += ["", "| field | decisions | most common answer | its share | gold's most common | its share | "
                          "constant |", "|---|---:|---|---:|---|---:|---|"]
            lines += [f"| {c['field']} | {c['n']} | {c['answer_label']} | {_fmt(c['answer_share'], True)} | "
                      f"{c['gold_label']} | {_fmt(c['gold_share'], True)} | {'**yes**' if c['constant'] else ''} |"
                      for c in conc]
        slots = m.get("slots") or []
        if slots:
            names = r.slot_labels or {}
            lines += ["", "| slot | label | predicted share | gold share | flag |", "|---:|---|---:|---:|---|"]
            lines += [f"| {s['slot']} | {names.get(s['slot'], '(varies by row)')} | {_fmt(s['predicted_share'], True)} | "
                      f"{_fmt(s['gold_share'], True)} | {', '.join(s['flags']) or ''} |" for s in slots]
    lines += ["", "## Throughput", ""]
    if meta.get("cpu_busy_at_start"):  # read when the run started (its own threads would fill the load later)
        lines += [f"The CPU was already busy when this invocation started: {meta['cpu_busy_at_start'][6:]}.", ""]
    for inv in meta.get("invocations") or [{"throughput": meta["throughput"]}]:
        t = inv["throughput"]
        when = f"{inv['started']} (git `{inv.get('git_revision') or 'unknown'}`): " if inv.get("started") else ""
        if inv.get("worker") is not None:
            when = f"worker {inv['worker']}" + (f", {when}" if when else ": ")
        stopped = inv.get("status") in ("interrupted", "terminated", "failed")  # its rows stay in predictions.jsonl, its timing here
        if not t["requests"]:
            lines.append(f"- {when}{inv['status']} before any new prediction landed." if stopped else
                         f"- {when}no new requests (every row was already predicted; resumed).")
            continue
        if stopped:
            when += f"{inv['status']} after "
        lines.append(f"- {when}{t['requests']} requests run in {t['inference_seconds']:.1f} s: "
                     f"{_fmt(t['requests_per_s'])} requests/s, {_fmt(t['decisions_per_s'])} decisions/s, "
                     f"{_fmt(t['tokens_per_s'])} tokens/s; latency p50 {_fmt(t['latency_p50_s'])} s, "
                     f"p95 {_fmt(t['latency_p95_s'])} s.")
    tot = meta.get("totals")
    if tot and tot["invocations"] > 1:
        wall = f" ({tot['wall_s']:.1f} s of wall time)" if tot.get("wall_s") is not None else ""
        lines.append(f"- all {tot['invocations']} invocations: {tot['requests']} requests in "
                     f"{tot['inference_seconds']:.1f} s of inference{wall}.")
    lines += ["", "## Glossary", "", *[f"- {g}" for g in GLOSSARY]]
    write_text_atomic(out_dir / "report.md", "\n".join(lines) + "\n")
    return metrics


def order_probe_lines(m: dict) -> list[str]:
    """A suite's order-probe paragraph for report.md (none without ``--probe``)."""
    p = m.get("order_probe")
    if not p:
        return []
    text = (f"\nOption order (`--probe {p['probe']}`): {p['changed']} of {p['items']} choice decisions changed their "
            f"answer when the options were reversed ({_fmt(p['change_share'])})")
    if m.get("flip_rate") is not None:
        text += f"; rotation flip rate {_fmt(m['flip_rate'])}"
    if p.get("gold_items"):
        text += (f". Accuracy on those with a gold label ({p['gold_items']}): {_fmt(p['accuracy_in_order'], True)} in "
                 f"order, {_fmt(p['accuracy_reversed'], True)} reversed")
    extra = [f"{p[k]} {what}" for k, what in (("errors", "not compared (an error row)"),
                                              ("missing", "predicted without the probe")) if p.get(k)]
    return [text + "." + (f" {'; '.join(extra)}." if extra else "")]


def _mass(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"
