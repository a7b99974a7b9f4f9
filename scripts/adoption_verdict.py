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

A clause whose evidence is missing or partial (a file absent; a suite of the rule's set not
compared, so the mean covers fewer suites; an unfinished eval run; a yes/no kind without an AUC; no
timed workload) is ``not measured``, and the verdict is then ``undecided``, never a pass. Evidence
about other models than the two named (a run folder's ``run.json``, the speed file's A and B) is
refused. Writes ``verdict.json`` and ``verdict.md`` into ``--dir`` (an earlier verdict there is
removed first) and prints the markdown. Exit status: 0 the candidate passes every clause, 1 a
clause failed, 3 undecided, 2 bad arguments, unreadable inputs or evidence about other models.
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
# the clauses' names, as verdict.md and verdict.json print them
AUC_CLAUSE = f"yes AUC >= {MIN_YES_AUC} on every held-out yes/no kind"
SPEED_CLAUSE = f"speed unchanged (>= {MIN_SPEED_RATIO:.0%} of the baseline's decisions/s)"
ECE_CLAUSE = f"calibrated ECE <= {MAX_ECE} on validation selection rows"
TICKET_CLAUSE = "README refund ticket right in both option orders"


class EvidenceError(ValueError):
    """A file that is about other models than the two compared, or not of its writer's shape."""


def rule_suites() -> list[str]:
    """The suites the rule is decided on: accuracy-v1's seven, procedural-v1's, zh-decision-bench."""
    from noulengine.eval.suites.registry import default_tasks, resolve_suites

    return default_tasks("accuracy-v1") + default_tasks("procedural-v1") + resolve_suites("zh-decision-bench")[1]


def _model_name(spec: str) -> str | None:
    """The name an engine reports for ``spec`` (its ``training.json`` name), or None."""
    folder = _model_dir(spec)
    training = _read(folder / "training.json") if folder is not None else None
    return (training or {}).get("name")


def check_runs(compare: dict, names: dict[str, str]) -> list[str]:
    """Each compared run's folders were made by the model named for it (``run.json``'s engine model
    name); returns the folders whose run did not finish.

    Raises:
        EvidenceError: a run folder made with another model, or without a ``run.json``.
    """
    unfinished = []
    for run in compare["runs"]:
        want = names.get(run["name"])
        for folder in sorted({Path(f).parent for f in run["files"]}):
            record = _read(folder / "run.json") or _read(folder.parent / "run.json")
            if record is None:
                raise EvidenceError(f"{folder}: no run.json, so no record of the model that made it")
            got = record["engine"]["model"]["name"]
            if want is not None and got != want:
                raise EvidenceError(f"{folder}: made by model {got!r}, but {run['name']!r} stands for {want!r}")
            if record.get("status") != "finished":
                unfinished.append(str(folder))
    return unfinished


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
    raise EvidenceError(f"no entry for the {label} model {spec!r} (has {', '.join(results)})")


def _interval(d: dict) -> str:
    """A difference ``{"value", "low", "high"}`` (fractions) as ``-3.8 points [-6.3, -1.2]``."""
    return f"{100 * d['value']:+.1f} points [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def clauses(folder: Path, baseline: str, candidate: str, baseline_model: str, candidate_model: str) -> list[dict]:
    """Every clause as ``{"clause", "status": "pass"|"fail"|"not measured", "evidence"}``."""
    out = []

    def add(clause, status, evidence):
        out.append({"clause": clause, "status": status, "evidence": evidence})

    compare = _read(folder / "compare" / "compare.json")
    suites_clause, mean_clause = ("no suite worse (paired 95% interval below zero)",
                                  "seven-suite mean higher, no suite under chance")
    const_clause = f"no new constant field on {CONSTANT_SUITE}"
    if compare is None:
        for c in (suites_clause, mean_clause, const_clause):
            add(c, "not measured", f"no {folder / 'compare' / 'compare.json'}")
    else:
        if compare.get("baseline") != baseline or candidate not in compare.get("verdicts", {}):
            raise EvidenceError(f"{folder / 'compare' / 'compare.json'} compares baseline {compare.get('baseline')!r} "
                                f"with {', '.join(compare.get('verdicts', {}))}; want {baseline!r} and {candidate!r}")
        unfinished = check_runs(compare, {baseline: _model_name(baseline_model),
                                          candidate: _model_name(candidate_model)})
        missing = [x for x in rule_suites() if x not in compare["suites"]]
        partial = (f"not compared: {', '.join(missing)}" if missing else "") + \
                  ("; " if missing and unfinished else "") + \
                  (f"unfinished runs: {', '.join(unfinished)}" if unfinished else "")
        v = compare["verdicts"][candidate]
        worse, under = v["worse"], v["below_chance"]
        excused = (f" (excused, the baseline at chance there: {', '.join(v['worse_excused'])})"
                   if v["worse_excused"] else "")
        if worse:  # each with its paired interval, and the baseline's skill there (why it is not excused)
            add(suites_clause, "fail", "worse on " + "; ".join(
                f"{x} {_interval(compare['suites'][x]['runs'][candidate]['diff'])} (the baseline above chance "
                f"there: {_interval(compare['suites'][x]['runs'][baseline]['above_chance'])})" for x in worse) + excused)
        else:
            add(suites_clause, "not measured" if partial else "pass", (partial or "none worse") + excused)
        m = compare.get("mean") or {}
        diff = ((m.get("runs") or {}).get(candidate) or {}).get("diff")
        shown = f"mean difference {_interval(diff)}" if diff else "no mean"
        if m.get("missing"):
            shown += f" (over {len(m.get('suites', []))} suites; missing {', '.join(m['missing'])})"
        if under:  # a suite under chance fails whatever the mean says
            add(mean_clause, "fail", shown + "; under chance on " + "; ".join(
                f"{x} {_interval(compare['suites'][x]['runs'][candidate]['above_chance'])}" for x in under))
        elif v["mean_higher"] is None or m.get("missing") or partial:
            add(mean_clause, "not measured", shown + (f"; {partial}" if partial else ""))
        else:
            add(mean_clause, "pass" if v["mean_higher"] else "fail", shown)
        suite = compare["suites"].get(CONSTANT_SUITE)
        if suite is None:
            add(const_clause, "not measured", f"{CONSTANT_SUITE} not compared")
        else:
            fields = [{f["field"] for f in suite["runs"][r]["constant_fields"]} for r in (baseline, candidate)]
            new = sorted(fields[1] - fields[0])
            shares = {f["field"]: f for f in suite["runs"][candidate]["constant_fields"]}
            add(const_clause, "fail" if new else "pass",
                ("new: " + "; ".join(f"{x} = {shares[x]['answer_label']} on {shares[x]['answer_share']:.0%} of "
                                     f"{shares[x]['n']} (gold's most common {shares[x]['gold_share']:.0%})"
                                     for x in new)) if new
                else f"candidate {sorted(fields[1]) or 'none'}, baseline {sorted(fields[0]) or 'none'}")
    selection = _by_name(_read(folder / "selection.json"), candidate_model, "candidate")
    if selection is None:
        add(AUC_CLAUSE, "not measured", f"no {folder / 'selection.json'}")
    else:
        aucs = {k: m.get("yes_auc") for k, m in selection["kinds"].items() if k.startswith("noul:")}
        low = {k: a for k, a in aucs.items() if a is not None and a < MIN_YES_AUC}
        absent = [k for k, a in aucs.items() if a is None]  # one gold side only: no AUC, not a pass
        add(AUC_CLAUSE,
            "fail" if low else ("not measured" if absent or not aucs else "pass"),
            ", ".join(f"{k} {'no AUC' if a is None else f'{a:.3f}'}" for k, a in sorted(aucs.items()))
            or "no yes/no kind scored")
    tickets = _by_name(_read(folder / "tickets.json"), candidate_model, "candidate")
    if tickets is None:
        add(TICKET_CLAUSE, "not measured", f"no {folder / 'tickets.json'}")
    else:
        rows = [r for r in tickets["rows"] if r["ticket"] == REFUND_TICKET]
        # right = both of its answers: the refund (yes) and the route (billing), in each order
        ok = len(rows) == 2 and all(r["refund"] == r["refund_want"] and r["route"] == r["route_want"] for r in rows)
        add(TICKET_CLAUSE,
            "pass" if ok else ("not measured" if len(rows) != 2 else "fail"),
            ", ".join(f"{r['order']}: route {r['route']}, P(yes) {r['p_yes']:.2f}" for r in rows)
            or "the ticket was not asked")
    folder_c = _model_dir(candidate_model)
    cal = _read(folder_c / "calibration.json") if folder_c is not None else None
    if cal is None:
        add(ECE_CLAUSE, "not measured",
            f"no calibration.json in {candidate_model}")
    else:
        after = cal["metrics"]["selection"]["all"]["after"]
        add(ECE_CLAUSE, "pass" if after["ece"] <= MAX_ECE else "fail",
            f"ECE(15) {after['ece']:.4f} on {after['n']} rows (accuracy {100 * after['accuracy']:.1f}%)")
    speed = _read(folder / "speed.json")
    if speed is None:
        add(SPEED_CLAUSE, "not measured",
            f"no {folder / 'speed.json'}")
    else:
        if (speed["a"], speed["b"]) != (baseline_model, candidate_model):
            raise EvidenceError(f"{folder / 'speed.json'} timed A={speed['a']!r}, B={speed['b']!r}; want "
                                f"A={baseline_model!r}, B={candidate_model!r}")
        ratios = {w: e["ratio_b_over_a"] for w, e in speed["workloads"].items()}
        add(SPEED_CLAUSE,
            "not measured" if not ratios else ("pass" if all(r >= MIN_SPEED_RATIO for r in ratios.values()) else "fail"),
            ", ".join(f"{w} {r:.3f}x" for w, r in ratios.items()) or "no workload timed")
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
    for stale in ("verdict.md", "verdict.json"):  # never left to be read as this run's
        (args.dir / stale).unlink(missing_ok=True)
    try:
        rows = clauses(args.dir, args.baseline, args.candidate, args.baseline_model, args.candidate_model)
    except EvidenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
