#!/usr/bin/env python
"""Issue #54 item 2: choose the merged candidates on the recipe's selection rows, never on a test suite.

Builds a small grid of LoRA merges of the committed adapters (``noulengine merge``: v2, the last
candidate v6, and v4x5n, the model v6 continued from), scores every merge and the sources
themselves on the selection rows of the v6 recipe (``runs/train-v6/data/selection.jsonl``, built
by ``scripts/train_default.py --steps data --mix v6``: validation-v1's AG News and WildJailbreak
selection rows, the procedural selection rows, the held-out workflow-scenario, ToolRL tool and
yes/no rows), and names the candidates for the full suites by a rule fixed before any score was
seen (below). Prints one table and writes ``runs/merge54/selection.{json,md}``.

Usage::

    python scripts/merge_selection.py                 # build what is missing, score, print the table
    python scripts/merge_selection.py --plan          # the grid and the rule, nothing run

Every score is uncalibrated (``calibration="none"`` for every model, the sources too: a merge has
no temperatures until calibrated, and temperature scaling changes neither accuracy nor AUC).

The rule (docs/results.md, "Merging v2 with the later adapters"):

* score = the mean over the selection's *families* of accuracy (family: a row kind's text before
  ``:``, so AG News, WildJailbreak, procedural, scenario, tool and noul each weigh one sixth
  whatever their row counts), the same weighting the adoption rule's seven-suite mean uses;
* eligible: yes AUC ≥ 0.85 on every held-out yes/no kind (``noul:agnews``, ``noul:wildjailbreak``,
  ``noul:tool``: the adoption rule's clause, on these same rows; the procedural and scenario
  kinds' AUCs are reported, not required: a few dozen rows each);
* candidate 1 = the best eligible v2+v6 merge; candidate 2 = the best eligible v2+v4x5n merge;
  candidate 3 = the better eligible of v4x5n alone and the three-way uniform merge. A tie within
  0.5 points goes to the more principled merge (the uniform average, then TIES at its default
  density, then the rest), since the grid is small and the rows are few.

What the selection cannot see: typed_decisions (its gold is the agreement of LLM judges, and no
selection row is built like it), Jevbench and zh-decision-bench; v6 chose its epoch on these same
rows (it is favoured on them a little), and v2 never saw the tool, yes/no and scenario kinds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = Path("runs/merge54")
SELECTION = Path("runs/train-v6/data/selection.jsonl")
V2, V6, V4 = "noul-smollm2-135m-v2", "training-checkpoints/v6", "training-checkpoints/v4x5n"
MIN_YES_AUC = 0.85
YES_NO_KINDS = "noul:"  # the held-out yes/no kinds the adoption rule's AUC clause reads (AG News, WildJailbreak, tools)
TIE_POINTS = 0.5
# name: (family, [(source, weight)], method, rank of principle: lower wins a tie). TIES weights 1.0
# each: PEFT's ties averages the agreeing entries of the weighted deltas (the paper's lambda = 1).
GRID = {
    "v2": ("source", [(V2, 1.0)], None, 9),
    "v4x5n": ("c3", [(V4, 1.0)], None, 1),
    "v2v6-lin50": ("c1", [(V2, 0.5), (V6, 0.5)], "linear", 0),
    "v2v6-lin30": ("c1", [(V2, 0.3), (V6, 0.7)], "linear", 2),
    "v2v6-ties": ("c1", [(V2, 1.0), (V6, 1.0)], "ties", 1),
    "v2v4-lin50": ("c2", [(V2, 0.5), (V4, 0.5)], "linear", 0),
    "v2v4-lin30": ("c2", [(V2, 0.3), (V4, 0.7)], "linear", 2),
    "v2v4-ties": ("c2", [(V2, 1.0), (V4, 1.0)], "ties", 1),
    "v2v4v6-lin": ("c3", [(V2, 1 / 3), (V4, 1 / 3), (V6, 1 / 3)], "linear", 0),
    "v6": ("source", [(V6, 1.0)], None, 9),
}
CANDIDATES = {"c1": "best v2+v6 merge", "c2": "best v2+v4x5n merge", "c3": "v4x5n alone or the three-way merge"}


def model_path(name: str) -> str:
    """Where grid entry ``name`` loads from: a source as it is, a merge from ``runs/merge54/``."""
    _, pairs, method, _ = GRID[name]
    return pairs[0][0] if method is None else str(OUT / "models" / name)


def build(name: str) -> None:
    """Write merge ``name`` unless its folder is whole (the merges are deterministic)."""
    from noulengine.models.merge import merge_adapters

    _, pairs, method, _ = GRID[name]
    folder = Path(model_path(name))
    if method is None or (folder / "training.json").is_file():
        return
    t = time.perf_counter()
    merge_adapters(pairs, folder, method=method, name=f"merge54-{name}", overwrite=True)
    print(f"merged {name} in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)


def family(kind: str) -> str:
    return kind.split(":", 1)[0]


def summarize(metrics: dict) -> dict:
    """Per-family accuracy (decisions-weighted within a family), the score and the yes AUCs."""
    fams: dict[str, list] = {}
    for kind, m in metrics["kinds"].items():
        if m.get("decisions"):
            fams.setdefault(family(kind), []).append(m)
    acc = {f: sum(m["accuracy"] * m["decisions"] for m in ms) / sum(m["decisions"] for m in ms)
           for f, ms in sorted(fams.items())}
    aucs = {k: m["yes_auc"] for k, m in metrics["kinds"].items() if "yes_auc" in m}
    held_out = [a for k, a in aucs.items() if k.startswith(YES_NO_KINDS)]
    return {"families": acc, "score": sum(acc.values()) / len(acc), "yes_auc": aucs,
            "min_yes_auc": min(held_out) if held_out else None, "nll": metrics["all"]["nll"],
            "accuracy_all": metrics["all"]["accuracy"], "decisions": metrics["all"]["decisions"]}


def choose(results: dict) -> dict:
    """The rule of the module docstring: candidate slot -> grid name (None: no eligible entry)."""
    out = {}
    for slot in CANDIDATES:
        entries = [n for n, (fam, *_rest) in GRID.items() if fam == slot and n in results]
        eligible = [n for n in entries if (results[n]["min_yes_auc"] or 0) >= MIN_YES_AUC]
        if not eligible:
            out[slot] = None
            continue
        best = max(results[n]["score"] for n in eligible)
        close = [n for n in eligible if results[n]["score"] >= best - TIE_POINTS / 100]
        out[slot] = min(close, key=lambda n: (GRID[n][3], -results[n]["score"]))
    return out


def table(results: dict, chosen: dict) -> str:
    fams = sorted({f for r in results.values() for f in r["families"]})
    lines = ["| model | sources (weight) | method | " + " | ".join(fams) + " | score | min yes AUC | NLL | chosen |",
             "|---|---|---|" + "---:|" * (len(fams) + 3) + "---|"]
    for name, r in results.items():
        _, pairs, method, _ = GRID[name]
        src = " + ".join(f"{Path(s).name}·{w:.2g}" for s, w in pairs)
        slot = next((CANDIDATES[s] for s, n in chosen.items() if n == name), "")
        cells = [f"{100 * r['families'][f]:.1f}" if f in r["families"] else "–" for f in fams]
        auc = f"{r['min_yes_auc']:.3f}" if r["min_yes_auc"] is not None else "–"
        lines.append(f"| {name} | {src} | {method or '–'} | " + " | ".join(cells)
                     + f" | {100 * r['score']:.1f} | {auc} | {r['nll']:.3f} | {slot} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", action="store_true", help="print the grid and the rule, run nothing")
    ap.add_argument("--only", default=None, help="comma-separated grid names to score (default: all)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(GRID)
    unknown = [n for n in names if n not in GRID]
    if unknown:
        ap.error(f"--only: not in the grid: {', '.join(unknown)} (the grid: {', '.join(GRID)})")
    if args.plan:
        for n in names:
            fam, pairs, method, _ = GRID[n]
            print(f"{n}: {fam} {method or 'as is'} {pairs}")
        return 0
    if not SELECTION.is_file():
        raise SystemExit(f"{SELECTION} is missing: python scripts/train_default.py --steps data --mix v6 "
                         "--work runs/train-v6")
    from noulengine.engine.engine import Engine
    from noulengine.train.contamination import build_evaluation_index
    from noulengine.train.data import load_training_rows
    from noulengine.train.selection import selection_by_kind

    rows = load_training_rows(str(SELECTION), index=build_evaluation_index(), role="selection")
    (OUT / "scores").mkdir(parents=True, exist_ok=True)
    results = {}
    for name in names:
        cached = OUT / "scores" / f"{name}.json"
        if cached.is_file():
            results[name] = json.loads(cached.read_text())["summary"]
            continue
        build(name)
        t = time.perf_counter()
        engine = Engine.from_pretrained(model_path(name), calibration="none")
        metrics = selection_by_kind(engine, rows)
        summary = summarize(metrics)
        cached.write_text(json.dumps({"model": model_path(name), "identity": engine.identity.to_dict(),
                                      "metrics": metrics, "summary": summary}, indent=1) + "\n")
        results[name] = summary
        print(f"scored {name}: score {100 * summary['score']:.1f}, min yes AUC {summary['min_yes_auc']} "
              f"({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
        del engine
    for r in results.values():  # a cached summary is read with this version's eligibility
        held_out = [a for k, a in r["yes_auc"].items() if k.startswith(YES_NO_KINDS)]
        r["min_yes_auc"] = min(held_out) if held_out else None
    chosen = choose(results)
    md = table(results, chosen)
    print(md)
    (OUT / "selection.md").write_text(md + "\n")
    (OUT / "selection.json").write_text(json.dumps({"rows": len(rows), "selection": str(SELECTION),
                                                    "results": results, "chosen": chosen}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
