"""The adoption rule (docs/results.md, "The adoption rule"), clause by clause, from the files the
candidate chain writes (``scripts/candidate_chain.py``): does the candidate replace the default?

Usage::

    python scripts/adoption_verdict.py --baseline v2 --candidate v3 [--dir runs/chain45]
        [--baseline-model noul-smollm2-135m-v2] [--candidate-model runs/train-v6/model]

Reads, in ``--dir``:

* ``compare/compare.json`` (``noulengine compare``): the suite clauses it decides (worse with the
  paired interval entirely below zero unless the baseline shows no skill there; under chance with
  the interval entirely below; the seven-suite mean higher) and each run's constant fields per
  suite;
* ``selection.json`` (``experiments/selection_by_kind.py``): yes AUC per held-out yes/no kind;
* ``tickets.json`` (``experiments/readme_tickets.py --output``): the README's refund ticket in
  both option orders;
* ``speed.json`` (``experiments/compare_models_speed.py --output``, A the baseline, B the candidate);

and each model folder's ``calibration.json`` (calibrated ECE on validation-v1's selection rows).

A clause whose file is missing is ``not measured``, and the verdict is then ``undecided``, never a
pass. Writes ``verdict.json`` and ``verdict.md`` into ``--dir`` and prints the markdown. Exit
status: 0 the candidate passes every clause, 1 a clause failed, 3 undecided (evidence missing), 2
bad arguments or unreadable inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MIN_YES_AUC = 0.85  # on every held-out yes/no kind
MAX_ECE = 0.05  # calibrated, validation-v1 selection rows (all)
MIN_SPEED_RATIO = 0.95  # "speed unchanged": the candidate's decisions/s at least 95% of the baseline's
REFUND_TICKET = "I returned the shoes last week, please send my money back."
CONSTANT_SUITE = "typed_decisions"


def _read(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _model_dir(spec: str) -> Path | None:
    from noulengine.models.loading import shipped_model_dir

    folder = shipped_model_dir(spec) or Path(spec)
    return folder if folder.is_dir() else None


def _by_name(results: dict | None, spec: str, label: str):
    """A results dict keyed by model spec (selection_by_kind, readme_tickets): the entry for ``spec``."""
    if results is None:
        return None
    if spec in results:
        return results[spec]
    raise SystemExit(f"error: no entry for the {label} model {spec!r} (has {', '.join(results)})")


def clauses(folder: Path, baseline: str, candidate: str, baseline_model: str, candidate_model: str) -> list[dict]:
    """Every clause as ``{"clause", "status": "pass"|"fail"|"not measured", "evidence"}``."""
    out = []

    def add(clause, status, evidence):
        out.append({"clause": clause, "status": status, "evidence": evidence})

    compare = _read(folder / "compare" / "compare.json")
    if compare is None:
        for c in ("no suite worse (paired 95% interval below zero)", "seven-suite mean higher, no suite under chance",
                  f"no new constant field on {CONSTANT_SUITE}"):
            add(c, "not measured", f"no {folder / 'compare' / 'compare.json'}")
    else:
        if compare.get("baseline") != baseline or candidate not in compare.get("verdicts", {}):
            raise SystemExit(f"error: {folder / 'compare' / 'compare.json'} compares baseline {compare.get('baseline')!r} "
                             f"with {', '.join(compare.get('verdicts', {}))}; want {baseline!r} and {candidate!r}")
        v = compare["verdicts"][candidate]
        worse = v["worse"]
        add("no suite worse (paired 95% interval below zero)", "fail" if worse else "pass",
            "worse on " + ", ".join(worse) if worse else
            "none worse" + (f" (excused, the baseline at chance there: {', '.join(v['worse_excused'])})"
                            if v["worse_excused"] else ""))
        mean, under = v["mean_higher"], v["below_chance"]
        m = compare.get("mean") or {}
        diff = ((m.get("runs") or {}).get(candidate) or {}).get("diff")
        shown = f"mean difference {100 * diff['value']:+.1f} points [{100 * diff['low']:+.1f}, {100 * diff['high']:+.1f}]" \
            if diff else "no mean (a suite missing)"
        status = "not measured" if mean is None else ("pass" if mean and not under else "fail")
        add("seven-suite mean higher, no suite under chance", status,
            shown + (f"; under chance on {', '.join(under)}" if under else ""))
        suite = compare["suites"].get(CONSTANT_SUITE)
        if suite is None:
            add(f"no new constant field on {CONSTANT_SUITE}", "not measured", f"{CONSTANT_SUITE} not compared")
        else:
            fields = [{f["field"] if isinstance(f, dict) else f for f in suite["runs"][r]["constant_fields"]}
                      for r in (baseline, candidate)]
            new = sorted(fields[1] - fields[0])
            add(f"no new constant field on {CONSTANT_SUITE}", "fail" if new else "pass",
                ("new: " + ", ".join(new)) if new else f"candidate {sorted(fields[1]) or 'none'}, "
                                                        f"baseline {sorted(fields[0]) or 'none'}")
    selection = _by_name(_read(folder / "selection.json"), candidate_model, "candidate")
    if selection is None:
        add(f"yes AUC >= {MIN_YES_AUC} on every held-out yes/no kind", "not measured", f"no {folder / 'selection.json'}")
    else:
        aucs = {k: m["yes_auc"] for k, m in selection["kinds"].items() if m.get("yes_auc") is not None}
        low = {k: a for k, a in aucs.items() if a < MIN_YES_AUC}
        add(f"yes AUC >= {MIN_YES_AUC} on every held-out yes/no kind",
            "not measured" if not aucs else ("fail" if low else "pass"),
            ", ".join(f"{k} {a:.3f}" for k, a in sorted(aucs.items())) or "no yes/no kind scored")
    tickets = _by_name(_read(folder / "tickets.json"), candidate_model, "candidate")
    if tickets is None:
        add("README refund ticket right in both option orders", "not measured", f"no {folder / 'tickets.json'}")
    else:
        rows = [r for r in tickets["rows"] if r["ticket"] == REFUND_TICKET]
        ok = len(rows) == 2 and all(r["refund"] == r["refund_want"] for r in rows)
        add("README refund ticket right in both option orders", "pass" if ok else "fail",
            ", ".join(f"{r['order']} P(yes) {r['p_yes']:.2f}" for r in rows))
    folder_c = _model_dir(candidate_model)
    cal = _read(folder_c / "calibration.json") if folder_c is not None else None
    if cal is None:
        add(f"calibrated ECE <= {MAX_ECE} on validation selection rows", "not measured",
            f"no calibration.json in {candidate_model}")
    else:
        after = cal["metrics"]["selection"]["all"]["after"]
        add(f"calibrated ECE <= {MAX_ECE} on validation selection rows", "pass" if after["ece"] <= MAX_ECE else "fail",
            f"ECE(15) {after['ece']:.4f} on {after['n']} rows (accuracy {100 * after['accuracy']:.1f}%)")
    speed = _read(folder / "speed.json")
    if speed is None:
        add(f"speed unchanged (>= {MIN_SPEED_RATIO:.0%} of the baseline's decisions/s)", "not measured",
            f"no {folder / 'speed.json'}")
    else:
        if (speed["a"], speed["b"]) != (baseline_model, candidate_model):
            raise SystemExit(f"error: {folder / 'speed.json'} timed A={speed['a']!r}, B={speed['b']!r}; want "
                             f"A={baseline_model!r}, B={candidate_model!r}")
        ratios = {w: e["ratio_b_over_a"] for w, e in speed["workloads"].items()}
        add(f"speed unchanged (>= {MIN_SPEED_RATIO:.0%} of the baseline's decisions/s)",
            "pass" if all(r >= MIN_SPEED_RATIO for r in ratios.values()) else "fail",
            ", ".join(f"{w} {r:.3f}x" for w, r in ratios.items()))
    return out


def verdict(rows: list[dict]) -> str:
    """``adopt`` (every clause passes), ``keep the baseline`` (one fails) or ``undecided``."""
    if any(r["status"] == "fail" for r in rows):
        return "keep the baseline"
    return "undecided" if any(r["status"] == "not measured" for r in rows) else "adopt"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("runs/chain45"))
    ap.add_argument("--baseline", default="v2", help="the baseline's run name in compare.json")
    ap.add_argument("--candidate", default="v3", help="the candidate's run name in compare.json")
    ap.add_argument("--baseline-model", default="noul-smollm2-135m-v2")
    ap.add_argument("--candidate-model", default="runs/train-v6/model")
    args = ap.parse_args(argv)
    try:
        rows = clauses(args.dir, args.baseline, args.candidate, args.baseline_model, args.candidate_model)
    except (KeyError, TypeError, ValueError) as exc:  # a file of another shape than its writer's
        print(f"error: {args.dir}: unreadable evidence ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    decided = verdict(rows)
    lines = [f"# Adoption rule: {args.candidate} ({args.candidate_model}) against {args.baseline} "
             f"({args.baseline_model})", "", "| clause | status | evidence |", "|---|---|---|"]
    lines += [f"| {r['clause']} | {r['status']} | {r['evidence']} |" for r in rows]
    lines += ["", f"**Verdict: {decided}**"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "verdict.md").write_text(text, encoding="utf-8")
    (args.dir / "verdict.json").write_text(json.dumps({"verdict": decided, "clauses": rows}, indent=1) + "\n",
                                           encoding="utf-8")
    return {"adopt": 0, "keep the baseline": 1}.get(decided, 3)


if __name__ == "__main__":
    sys.exit(main())
