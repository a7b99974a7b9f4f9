#!/usr/bin/env python
"""Experiment behind docs/results.md#base-models-on-the-same-short-budget-issue-22-3 ("Base models on the same short budget (issue #22 §3)"); reproduce: `python experiments/compare_bases.py`.

Issue #22 §3: compare base models for the default on the same short training budget.

Each base is fine-tuned by ``noulengine train`` with the default recipe's settings
(``scripts/train_default.py``: LoRA r 16 / alpha 32 on the top 12 decoder layers, lr 1e-3, the
``auto`` readout, full-vocabulary loss, soft targets, every row's options permuted) on the SAME
fixed-seed subset of the recipe's training file, one epoch, and scored on the recipe's selection
rows (AG News + WildJailbreak validation-v1 selection rows + procedural rows of another seed) and
its permutation flip rate. Speed is measured apart, on an idle CPU, by
``experiments/compare_models_speed.py`` (never while these trainings run).

Steps (``--steps``, default all):

* ``subset``: build the recipe's data if missing (``train_default.py --steps data``), then write
  ``<out>/subset.jsonl``: ``--rows`` rows drawn with ``random.Random(--seed)`` (sha256 recorded).
* ``train``: one ``noulengine train`` per ``--bases`` entry into ``<out>/<base>/`` (skipped when
  its ``training.json`` exists, so an interrupted comparison resumes base by base). Two bases can
  run at once in two processes (``--bases smollm2`` and ``--bases gemma3``), one thread each.
* ``eval``: each trained model (uncalibrated) on fixed-seed samples with the reversal probe
  (``python -m noulengine.eval --probe reverse``): procedural-v1 (``--eval-proc`` records) and
  every accuracy-v1 suite (``--eval-acc`` rows each), into ``<out>/eval-proc-<base>/`` and
  ``<out>/eval-acc-<base>/`` (resumable like any eval run).
* ``report``: ``<out>/comparison.md`` and ``comparison.json`` from the ``training.json`` files
  and the eval runs' ``metrics.json``.

Usage::

    python experiments/compare_bases.py                                  # both bases, one after the other
    NOULENGINE_THREADS=1 python experiments/compare_bases.py --bases gemma3 --steps subset,train,eval
    python experiments/compare_bases.py --steps report
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import train_default as recipe  # noqa: E402  (one recipe: its data, seed and training flags)

from noulengine.eval.suites import resolve_data_dir  # noqa: E402
from noulengine.models.loading import sha256_file  # noqa: E402

DATA = recipe.WORK / "data"


# embedded base names (noulengine.models.embedded): the package holds the GGUF, the adapter records the name
BASES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "gemma-3-270m"}


def make_subset(out: Path, rows: int, seed: int) -> dict:
    """Draw ``rows`` training rows (fixed seed) from the recipe's train.jsonl."""
    if not (DATA / "train.jsonl").is_file():
        data_dir = resolve_data_dir(None)
        if data_dir is None:
            raise SystemExit("no raw data root found (set NOULENGINE_DATA)")
        recipe.build_data(data_dir, DATA)  # the recipe's own data step
    lines = [ln for ln in (DATA / "train.jsonl").read_text(encoding="utf-8").splitlines() if ln.strip()]
    if rows > len(lines):
        raise SystemExit(f"--rows {rows} exceeds the recipe's {len(lines)} training rows")
    picked = sorted(random.Random(seed).sample(range(len(lines)), rows))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "subset.jsonl"
    path.write_text("".join(lines[i] + "\n" for i in picked), encoding="utf-8")
    info = {"path": str(path), "rows": rows, "seed": seed, "sha256": sha256_file(path),
            "from": str(DATA / "train.jsonl"), "from_sha256": sha256_file(DATA / "train.jsonl")}
    (out / "subset.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def train_base(out: Path, base: str) -> None:
    folder = out / base
    if (folder / "training.json").is_file():
        print(f"{base}: {folder}/training.json exists, skipped")
        return
    if folder.exists():  # an interrupted run: noulengine train wants an empty folder
        shutil.rmtree(folder)
    cmd = [sys.executable, "-m", "noulengine.train", "--data", str(out / "subset.jsonl"),
           "--selection", str(DATA / "selection.jsonl"), "--output", str(folder), "--progress", "false",
           *recipe.train_args(BASES[base], f"compare-{base}")]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=REPO)
    print(f"{base}: trained in {time.time() - t0:.0f} s", flush=True)


def eval_base(out: Path, base: str, proc_records: int, acc_rows: int) -> None:
    """The reversal-probe evaluations of one trained base (no calibration file: raw temperatures)."""
    common = ["--seed", "0", "--probe", "reverse", "--model", str(out / base), "--no-plots", "--no-progress"]
    for suite, n, folder in (("procedural-v1", proc_records, f"eval-proc-{base}"),
                             ("accuracy-v1", acc_rows, f"eval-acc-{base}")):
        cmd = [sys.executable, "-m", "noulengine.eval", "--suite", suite, "--sample", str(n), *common,
               "--output", str(out / folder)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO)


def _eval_rows(out: Path, base: str) -> dict:
    """Per suite: decisions, accuracy, chance, majority, reversal change share (when run)."""
    rows = {}
    for folder in (f"eval-proc-{base}", f"eval-acc-{base}"):
        path = out / folder / "metrics.json"
        if not path.is_file():
            continue
        for suite, entry in json.loads(path.read_text(encoding="utf-8")).items():
            m = entry.get("metrics") or {}
            if not m:
                continue
            probe = m.get("order_probe") or {}
            rows[suite] = {"decisions": m["counts"]["decisions"], "accuracy": m["accuracy"],
                           "chance": m["baselines"]["chance"], "majority": m["baselines"]["majority"],
                           "reversal_change_share": m.get("reversal_change_share"),
                           "choice_items": probe.get("items")}
    return rows


def report(out: Path, bases: list[str]) -> dict:
    rows = {}
    for base in bases:
        path = out / base / "training.json"
        if not path.is_file():
            print(f"{base}: no {path} yet")
            continue
        t = json.loads(path.read_text(encoding="utf-8"))
        sel = t["epochs"][-1]["selection"]
        perm = (t.get("final") or {}).get("permutation") or {}
        rows[base] = {"model": t["base_model"]["name"], "trainable_parameters": t["trainable_parameters"],
                      "steps": t["steps"], "train_s": t["train_s"], "examples_per_s": t["examples_per_s"],
                      "selection": sel, "flip_rate": perm.get("flip_rate"),
                      "flip_rate_accuracy": perm.get("accuracy"), "flip_rate_decisions": perm.get("decisions"),
                      "eval": _eval_rows(out, base)}
    lines = ["| base | trainable params | updates | train s | rows/s | selection decisions | accuracy | NLL | "
             "ECE(15) | median x_mass | flip rate (AG News rows) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for base, r in rows.items():
        s = r["selection"]
        lines.append(f"| {r['model']} | {r['trainable_parameters']:,} | {r['steps']} | {r['train_s']:.0f} | "
                     f"{r['examples_per_s']:.2f} | {s['decisions']} | {100 * s['accuracy']:.1f}% | {s['nll']:.3f} | "
                     f"{s['ece']:.3f} | {s['x_mass_median']:.3f} | "
                     f"{'-' if r['flip_rate'] is None else format(r['flip_rate'], '.3f')} |")
    suites = sorted({s for r in rows.values() for s in r["eval"]})
    if suites:
        names = list(rows)
        lines += ["", "| suite (sample, reversal probe) | decisions | chance | majority | "
                  + " | ".join(f"{rows[b]['model']} accuracy / changed by reversal" for b in names) + " |",
                  "|---|---:|---:|---:|" + "---:|" * len(names)]
        for suite in suites:
            first = next(rows[b]["eval"][suite] for b in names if suite in rows[b]["eval"])
            cells = []
            for b in names:
                e = rows[b]["eval"].get(suite)
                rev = None if e is None else e["reversal_change_share"]
                cells.append("-" if e is None else f"{100 * e['accuracy']:.1f}% / "
                             + ("-" if rev is None else f"{rev:.3f}"))
            lines.append(f"| {suite} | {first['decisions']} | {100 * first['chance']:.1f}% | "
                         f"{100 * first['majority']:.1f}% | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / "comparison.md").write_text(text, encoding="utf-8")
    (out / "comparison.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(text)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bases", default="smollm2,gemma3", help="comma-separated: " + ", ".join(BASES))
    ap.add_argument("--rows", type=int, default=800, help="training rows drawn from the recipe's train.jsonl")
    ap.add_argument("--seed", type=int, default=0, help="the subset's seed")
    ap.add_argument("--output", default=str(REPO / "runs" / "compare-bases"))
    ap.add_argument("--eval-proc", type=int, default=200, help="procedural-v1 records in the eval step's sample")
    ap.add_argument("--eval-acc", type=int, default=40, help="rows per accuracy-v1 suite in the eval step's sample")
    ap.add_argument("--steps", default="subset,train,eval,report")
    args = ap.parse_args(argv)
    bases = [b.strip() for b in args.bases.split(",") if b.strip()]
    unknown = [b for b in bases if b not in BASES]
    if unknown:
        ap.error(f"unknown base(s) {unknown}; choose from {list(BASES)}")
    out, steps = Path(args.output), set(args.steps.split(","))
    if "subset" in steps:
        print(json.dumps(make_subset(out, args.rows, args.seed)))
    if "train" in steps:
        for base in bases:
            train_base(out, base)
    if "eval" in steps:
        for base in bases:
            eval_base(out, base, args.eval_proc, args.eval_acc)
    if "report" in steps:
        report(out, list(BASES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
