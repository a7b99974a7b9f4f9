"""``noulengine compare``: two or more evaluation runs on the records every one of them answered.

Usage::

    noulengine compare v2=runs/v2-acc v5=runs/v5-acc --output runs/compare-v5
    noulengine compare runs/a/predictions.jsonl runs/b/worker-0/predictions.jsonl,runs/b/worker-1/predictions.jsonl

A run is ``[NAME=]PATH[,PATH...]``: an ``eval`` run folder (its ``predictions.jsonl``, or a sharded
run's ``worker-*/predictions.jsonl``) or prediction files (``eval``'s rows, ``{"suite", "row",
"answers", ...}``). The first run is the **baseline**; every other run is compared with it.

For each suite, on the (suite, row) pairs that every run answered, and scored by the scorer that
``eval`` and ``noulengine score`` use (:class:`noulengine.metrics.Scorer`):

* each run's accuracy (per decision, errors counted wrong) with a 95% bootstrap interval;
* each run's accuracy minus chance with its interval (a run whose interval includes zero shows no
  skill on that suite);
* each run's difference from the baseline with a **paired** 95% interval: 10,000 replicates, each
  drawing the suite's records with replacement (a record's decisions stay together) and scoring
  both runs on the same draw (:mod:`noulengine.metrics.bootstrap`; fixed seed, so a rerun prints
  the same interval);
* NLL, ECE, yes AUC, the ``--probe reverse`` change share where the rows carry it, and every field
  answered with one constant label (:func:`noulengine.metrics.scorer.answer_concentration`);
* the mean over a collection's suites (``--mean-of``, accuracy-v1's seven by default) with the same
  intervals (each suite resampled on its own, the mean taken per replicate);
* for each run against the baseline, the suite clauses of the adoption rule (docs/results.md,
  applied to every suite compared; a mean missing some of its suites decides nothing): the
  suites worse with the interval entirely below zero (excused where the baseline's own interval
  against chance includes zero: no skill there to lose), the suites under chance with the interval
  entirely below, and whether the mean is higher.

Writes ``compare.json`` and ``compare.md`` into ``--output`` and prints the markdown tables. Exit
status: 0 compared, 2 bad arguments or inputs (a missing file, a corrupt line, a suite without its
data, runs that share no record), 74 an output that cannot be written; each named in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MEAN_OF = "accuracy-v1"


class CompareError(ValueError):
    """A run or suite that cannot be compared; the message names the file, suite or row."""


@dataclass
class Run:
    """One run's predictions: ``rows`` keyed by ``(suite, row)``, read from ``files``."""

    name: str
    files: list[Path]
    rows: dict[tuple[str, int], dict] = field(default_factory=dict)


def prediction_files(path: Path) -> list[Path]:
    """The prediction files of a run folder or file.

    Raises:
        CompareError: the path does not exist, or a folder holds neither ``predictions.jsonl`` nor
            ``worker-*/predictions.jsonl``.
    """
    if path.is_file():
        return [path]
    if path.is_dir():
        if (path / "predictions.jsonl").is_file():
            return [path / "predictions.jsonl"]
        workers = sorted(path.glob("worker-*/predictions.jsonl"))
        if workers:
            return workers
        raise CompareError(f"{path}: a folder without predictions.jsonl or worker-*/predictions.jsonl")
    raise CompareError(f"{path}: no such file or folder")


def parse_run(spec: str) -> tuple[str, list[Path]]:
    """``[NAME=]PATH[,PATH...]`` -> ``(name, prediction files)``; the name defaults to the first
    path's folder name (a ``predictions.jsonl``'s parent) or file stem.

    Raises:
        CompareError: an empty name or path, or a path as in :func:`prediction_files`.
    """
    name, sep, paths = spec.partition("=")
    if not sep:
        name, paths = "", spec
    parts = [p for p in paths.split(",") if p]
    if not parts or (sep and not name):
        raise CompareError(f"run {spec!r}: give [NAME=]PATH[,PATH...]")
    files = [f for p in parts for f in prediction_files(Path(p))]
    if not name:
        first = Path(parts[0])
        name = first.parent.name if first.name == "predictions.jsonl" else (first.name if first.is_dir() else first.stem)
    return name, files


def load_run(name: str, files: list[Path]) -> Run:
    """Read a run's files with ``eval``'s reader (a killed run's torn last line is left out, the
    file untouched).

    Raises:
        CompareError: a corrupt line, or a (suite, row) in two of the files.
    """
    from noulengine.eval.runner import read_predictions

    run = Run(name, list(files))
    for f in files:
        try:
            rows = read_predictions(f, repair=False)
        except (ValueError, KeyError, TypeError) as exc:
            raise CompareError(f"run {name!r}: {f}: {exc}") from None
        except OSError as exc:  # unreadable: permissions, a folder, a vanished file
            raise CompareError(f"run {name!r}: cannot read {f}: {exc.strerror or exc}") from None
        twice = sorted(set(rows) & set(run.rows))
        if twice:
            raise CompareError(f"run {name!r}: {f}: {twice[0][0]} row {twice[0][1]} predicted twice (also in an "
                               "earlier file)")
        run.rows.update(rows)
    return run


def _suite_seed(seed: int, suite: str) -> list[int]:
    """A suite's own generator seed: suites are resampled independently of each other."""
    return [seed, zlib.crc32(suite.encode("utf-8"))]


def _score_suite(suite_name: str, records: dict, rows: list[int], runs: list[Run]) -> tuple[list[dict], dict]:
    """Score every run on ``rows`` of one suite: ``(reports, per-record arrays)``.

    The arrays: ``correct`` (R, M) correct decisions per record and run, ``decisions`` (R,) hard
    decisions per record, ``chance`` (R,) the summed ``1/K`` of those decisions.
    """
    import numpy as np

    from noulengine.eval.probe import change_summary, record_items
    from noulengine.eval.score import to_answer_map
    from noulengine.eval.suites import get_suite
    from noulengine.metrics import Scorer

    slices = get_suite(suite_name).slices
    reports, correct = [], np.zeros((len(rows), len(runs)))
    decisions = chance = None
    for m, run in enumerate(runs):
        scorer = Scorer(metadata_slices=slices)
        pairs = []
        for i in rows:
            rec, pred = records[i], run.rows[(suite_name, i)]
            rec.metadata["suite"] = suite_name
            try:
                amap = to_answer_map(pred, rec)
            except ValueError as exc:
                raise CompareError(f"run {run.name!r}: {suite_name} row {i} (id {rec.id!r}): {exc}") from None
            scorer.update(rec, amap)
            pairs.append((rec, pred))
        report = scorer.compute()
        has_probe = any((p.get("probe") or {}).get("reverse") for _, p in pairs)
        report["order_probe"] = change_summary(record_items(pairs), "reverse") if has_probe else None
        reports.append(report)
        n, ch = np.zeros(len(rows)), np.zeros(len(rows))
        for d in scorer.decisions:
            if d.gold is None:
                continue
            n[d.row] += 1
            ch[d.row] += 1.0 / d.num_candidates
            correct[d.row, m] += d.correct
        if decisions is None:
            decisions, chance = n, ch
    return reports, {"correct": correct, "decisions": decisions, "chance": chance}


def _intervals(arrays: dict, n_resamples: int, seed) -> dict:
    """Replicates of each run's accuracy and of chance on the same draws: ``{"acc": (B, M),
    "chance": (B,)}``."""
    from noulengine.metrics.bootstrap import replicate_accuracies

    acc = replicate_accuracies(arrays["correct"], arrays["decisions"], n_resamples=n_resamples, seed=seed)
    chance = replicate_accuracies(arrays["chance"], arrays["decisions"], n_resamples=n_resamples, seed=seed)[:, 0]
    return {"acc": acc, "chance": chance}


def compare_runs(runs: list[Run], *, suite: str | None = None, source=None, n_resamples: int | None = None,
                 seed: int | None = None, mean_of: str | None = DEFAULT_MEAN_OF, level: float = 0.95) -> dict:
    """Compare runs on the records all of them answered (module docstring).

    Args:
        runs: two or more runs; ``runs[0]`` is the baseline.
        suite: a suite, group or collection to restrict to (default: every suite the runs share).
        source: raw data folder for loading the suites (default as ``eval``).
        n_resamples: bootstrap replicates (default 10,000).
        seed: the bootstrap seed (default 0).
        mean_of: the collection whose default suites make the mean (None: no mean).
        level: the intervals' coverage.

    Returns:
        A JSON-able dict: ``runs`` (names, files), ``baseline``, ``bootstrap`` (resamples, seed,
        level, unit), ``suites`` ({suite: {records, decisions, rows_per_run, chance, majority, runs:
        {name: {accuracy, interval, above_chance, nll, ece, yes_auc, reversal_change_share,
        constant_fields, diff (not for the baseline)}}}}), ``mean`` (or None), ``verdicts``
        ({candidate: the adoption rule's suite clauses}) and ``notes``.

    Raises:
        CompareError: fewer than two runs, two runs with one name, no shared record, or a bad row.
        SuiteError: a suite unknown or without its data.
    """
    import numpy as np

    from noulengine.eval.suites import default_tasks, get_suite, resolve_suites
    from noulengine.metrics.bootstrap import N_RESAMPLES, SEED, percentile_interval

    n_resamples = N_RESAMPLES if n_resamples is None else n_resamples
    seed = SEED if seed is None else seed
    if len(runs) < 2:
        raise CompareError("give two or more runs to compare")
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise CompareError(f"two runs are named alike ({names}); name them NAME=PATH")
    wanted = set(resolve_suites(suite)[1]) if suite else None
    suites_all = sorted({s for r in runs for s, _ in r.rows if wanted is None or s in wanted})
    notes, out_suites, reps = [], {}, {}
    for s in suites_all:
        per_run = {r.name: sum(1 for t, _ in r.rows if t == s) for r in runs}
        common = sorted(set.intersection(*({i for t, i in r.rows if t == s} for r in runs)))
        if not common:
            notes.append(f"{s}: not compared: no record answered by every run ({per_run})")
            continue
        if len(set(per_run.values())) > 1:
            notes.append(f"{s}: compared on the {len(common):,} records every run answered ({per_run})")
        records = dict(get_suite(s).load(source=source))
        missing = [i for i in common if i not in records]
        if missing:
            raise CompareError(f"{s}: the runs answer row {missing[0]}, which the suite's prepared file does not have")
        reports, arrays = _score_suite(s, records, common, runs)
        if not arrays["decisions"].sum():
            notes.append(f"{s}: not compared: its records have no gold label")
            continue
        rep = _intervals(arrays, n_resamples, _suite_seed(seed, s))
        reps[s] = rep
        acc = arrays["correct"].sum(axis=0) / arrays["decisions"].sum()
        chance = arrays["chance"].sum() / arrays["decisions"].sum()
        entry = {"records": len(common), "decisions": int(arrays["decisions"].sum()), "rows_per_run": per_run,
                 "chance": float(chance), "majority": reports[0]["baselines"]["majority"], "runs": {}}
        for m, (run, report) in enumerate(zip(runs, reports)):
            probe = report.get("order_probe") or {}
            item = {
                "accuracy": float(acc[m]),
                "interval": percentile_interval(acc[m], rep["acc"][:, m], level).to_dict(),
                "above_chance": percentile_interval(acc[m] - chance, rep["acc"][:, m] - rep["chance"], level).to_dict(),
                "nll": report["nll"], "ece": report["ece"], "yes_auc": (report.get("noul") or {}).get("yes_auc"),
                "reversal_change_share": probe.get("change_share"),
                "constant_fields": [c for c in report["answer_concentration"] if c["constant"]],
                "coverage": report["counts"]["coverage"],
            }
            if m:
                item["diff"] = percentile_interval(acc[m] - acc[0], rep["acc"][:, m] - rep["acc"][:, 0], level).to_dict()
            entry["runs"][run.name] = item
        out_suites[s] = entry
    if not out_suites:
        raise CompareError("the runs share no answered record" + (f" of {suite!r}" if suite else "")
                           + (f" ({'; '.join(notes)})" if notes else ""))

    mean = None
    if mean_of:
        members = default_tasks(mean_of) if mean_of in _collections() else resolve_suites(mean_of)[1]
        present = [s for s in members if s in out_suites]
        if present:
            accs = np.array([[out_suites[s]["runs"][n]["accuracy"] for n in names] for s in present]).mean(axis=0)
            rep_acc = np.stack([reps[s]["acc"] for s in present]).mean(axis=0)  # (B, M): per replicate
            rep_chance = np.stack([reps[s]["chance"] for s in present]).mean(axis=0)
            chance = float(np.mean([out_suites[s]["chance"] for s in present]))
            mean = {"of": mean_of, "suites": present, "missing": [s for s in members if s not in out_suites],
                    "chance": chance, "runs": {}}
            for m, n in enumerate(names):
                item = {"accuracy": float(accs[m]),
                        "interval": percentile_interval(accs[m], rep_acc[:, m], level).to_dict(),
                        "above_chance": percentile_interval(accs[m] - chance, rep_acc[:, m] - rep_chance,
                                                            level).to_dict()}
                if m:
                    item["diff"] = percentile_interval(accs[m] - accs[0], rep_acc[:, m] - rep_acc[:, 0],
                                                       level).to_dict()
                mean["runs"][n] = item
            if mean["missing"]:
                notes.append(f"the mean is over {len(present)} of {mean_of}'s {len(members)} suites "
                             f"(not compared: {', '.join(mean['missing'])})")
    verdicts = {n: verdict(out_suites, mean, names[0], n) for n in names[1:]}
    return {"runs": [{"name": r.name, "files": [str(f) for f in r.files]} for r in runs], "baseline": names[0],
            "bootstrap": {"resamples": n_resamples, "seed": seed, "level": level, "unit": "record",
                          "method": "percentile; paired (every run scored on the same replicate)"},
            "suites": out_suites, "mean": mean, "verdicts": verdicts, "notes": notes}


def _collections() -> set[str]:
    from noulengine.eval.suites.registry import _collections as table

    return set(table())


def verdict(suites: dict, mean: dict | None, baseline: str, candidate: str) -> dict:
    """The adoption rule's suite clauses for ``candidate`` against ``baseline`` (docs/results.md):

    * ``worse``: suites where the paired difference's interval lies entirely below zero and the
      baseline is above chance there (its interval against chance excludes zero);
      ``worse_excused``: the same where the baseline shows no skill (interval includes zero);
    * ``better``: the interval entirely above zero;
    * ``below_chance``: suites where the candidate's interval against chance lies entirely below
      zero;
    * ``mean_higher``: the candidate's mean is higher than the baseline's (None without a mean);
    * ``passes``: no ``worse``, no ``below_chance`` and ``mean_higher``; False as soon as one suite
      is worse or under chance (whatever the mean); otherwise None (not decided) without a mean, or
      when the mean lacks some of its collection's suites.

    The clauses cover every suite compared: give ``--suite`` (or runs of only those suites) to
    apply them to the rule's suites alone.
    """
    worse, excused, better, below = [], [], [], []
    for s, e in suites.items():
        diff = e["runs"][candidate]["diff"]
        if diff["high"] < 0:
            (worse if e["runs"][baseline]["above_chance"]["low"] > 0 else excused).append(s)
        elif diff["low"] > 0:
            better.append(s)
        if e["runs"][candidate]["above_chance"]["high"] < 0:
            below.append(s)
    higher = None if mean is None else mean["runs"][candidate]["accuracy"] > mean["runs"][baseline]["accuracy"]
    # a mean over only some of the collection's suites decides nothing (the rule names the seven)
    decided = higher is not None and not mean.get("missing")
    passes = False if (worse or below) else (bool(higher) if decided else None)
    return {"worse": worse, "worse_excused": excused, "better": better, "below_chance": below,
            "mean_higher": higher, "passes": passes}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _pts(iv: dict) -> str:
    """An interval in percentage points: ``+1.2 [-0.3, +2.6]``."""
    return f"{100 * iv['value']:+.1f} [{100 * iv['low']:+.1f}, {100 * iv['high']:+.1f}]"


def _acc_cell(r: dict) -> str:
    """An accuracy with its interval: ``87.9% (87.2–88.6)``."""
    return f"{_pct(r['accuracy'])} ({100 * r['interval']['low']:.1f}–{100 * r['interval']['high']:.1f})"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def render_markdown(result: dict) -> str:
    """``compare.md``: the accuracy table with intervals, the per-run details, the verdicts."""
    names = [r["name"] for r in result["runs"]]
    base = result["baseline"]
    b = result["bootstrap"]
    lines = [f"# Comparison: {', '.join(names)} (baseline {base})", "",
             f"Accuracy per decision on the records every run answered, with its {100 * b['level']:.0f}% bootstrap "
             f"interval ({b['resamples']:,} resamples of records, seed {b['seed']}); Δ: the run minus {base} on the "
             "same resamples, in points; **bold** where the interval excludes zero. decisions: those with a gold "
             "label, accuracy's denominator (a question whose reference is only a distribution, such as 50/50, has "
             "no accuracy, so an eval report, which counts every decision, may show a few more).", ""]
    head = ["suite", "records", "decisions", "chance", "majority", *names, *[f"Δ {n} − {base}" for n in names[1:]]]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]

    def diff_cell(iv: dict) -> str:
        text = _pts(iv)
        return f"**{text}**" if iv["low"] > 0 or iv["high"] < 0 else text

    for s, e in result["suites"].items():
        cells = [s, f"{e['records']:,}", f"{e['decisions']:,}", _pct(e["chance"]), _pct(e["majority"])]
        cells += [_acc_cell(e["runs"][n]) for n in names]
        cells += [diff_cell(e["runs"][n]["diff"]) for n in names[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    mean = result.get("mean")
    if mean:
        cells = [f"mean of {len(mean['suites'])} {mean['of']} suites", "", "", _pct(mean["chance"]), ""]
        cells += [_acc_cell(mean["runs"][n]) for n in names]
        cells += [diff_cell(mean["runs"][n]["diff"]) for n in names[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| suite | run | above chance, points | NLL | ECE | yes AUC | reversal changed | constant fields |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    for s, e in result["suites"].items():
        for n in names:
            r = e["runs"][n]
            const = ", ".join(f"{c['field']} = {c['answer_label']} ({100 * c['answer_share']:.0f}%)"
                              for c in r["constant_fields"]) or "–"
            above = _pts(r["above_chance"])
            if r["above_chance"]["high"] < 0:
                above = f"**{above}** under chance"
            elif r["above_chance"]["low"] <= 0:
                above += " (no skill shown)"
            lines.append(f"| {s} | {n} | {above} | {_num(r['nll'])} | {_num(r['ece'])} | {_num(r['yes_auc'])} | "
                         f"{_num(r['reversal_change_share'])} | {const} |")
    lines += ["", "## Against the baseline (the adoption rule's suite clauses)", ""]
    for n, v in result["verdicts"].items():
        mean_text = ("no mean" if v["mean_higher"] is None else
                     f"mean {'higher' if v['mean_higher'] else 'not higher'} ({_pts(mean['runs'][n]['diff'])})")
        lines.append(f"- **{n}**: worse (interval below zero) on {', '.join(v['worse']) or 'none'}"
                     + (f"; worse where {base} shows no skill (excused): {', '.join(v['worse_excused'])}"
                        if v["worse_excused"] else "")
                     + f"; better on {', '.join(v['better']) or 'none'}; under chance on "
                     f"{', '.join(v['below_chance']) or 'none'}; {mean_text}. "
                     + ("It **passes** these clauses." if v["passes"] else
                        "It does not pass these clauses." if v["passes"] is False else
                        "These clauses are not decided: " + ("there is no mean." if v["mean_higher"] is None else
                                                             f"the mean lacks suites of its collection "
                                                             f"({', '.join(mean.get('missing') or [])}).")))
    if result["notes"]:
        lines += ["", "## Notes", "", *[f"- {x}" for x in result["notes"]]]
    return "\n".join(lines) + "\n"


def build_parser(prog: str = "noulengine compare") -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(prog=prog, description=doc[0].replace("``", ""),
                                epilog=doc[1].replace("``", "`"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="[NAME=]PATH[,PATH]",
                   help="two or more runs (eval run folders or prediction files); the first is the baseline")
    p.add_argument("--suite", help="compare only this suite, group or collection (default: every suite shared)")
    p.add_argument("--source", help="raw data folder (default: $NOULENGINE_DATA, else ../shared/data)")
    p.add_argument("--output", help="folder for compare.json and compare.md (default: print only)")
    p.add_argument("--resamples", type=int, default=None, help="bootstrap replicates (default 10000)")
    p.add_argument("--seed", type=int, default=None, help="bootstrap seed (default 0)")
    p.add_argument("--mean-of", default=DEFAULT_MEAN_OF,
                   help="the collection (or group) whose suites make the mean (default accuracy-v1; 'none': no mean)")
    p.add_argument("--json", action="store_true", help="print compare.json instead of the tables")
    return p


def main(argv: list[str] | None = None, prog: str = "noulengine compare") -> int:
    from noulengine.eval.suites.errors import SuiteError
    from noulengine.eval.suites.paths import refuse_missing_data_folder
    from noulengine.records.errors import RecordError

    args = build_parser(prog).parse_args(argv)
    if args.resamples is not None and args.resamples < 100:
        print("error: --resamples must be at least 100", file=sys.stderr)
        return 2
    if args.seed is not None and args.seed < 0:
        print("error: --seed must be 0 or more", file=sys.stderr)
        return 2
    if refuse_missing_data_folder(args.source):
        return 2
    try:
        runs = [load_run(*parse_run(spec)) for spec in args.runs]
        result = compare_runs(runs, suite=args.suite, source=args.source, n_resamples=args.resamples,
                              seed=args.seed, mean_of=None if args.mean_of == "none" else args.mean_of)
    except (CompareError, SuiteError, RecordError) as exc:  # RecordError: a suite file that does not parse
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = render_markdown(result)
    if args.output:
        from noulengine.writes import EXIT_WRITE_ERROR, OutputWriteError, write_error_from, write_text_atomic

        out = Path(args.output)
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out / "compare.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
            write_text_atomic(out / "compare.md", text)
        except (OutputWriteError, OSError) as exc:
            print(f"error: {write_error_from(exc, out)}", file=sys.stderr)
            return EXIT_WRITE_ERROR
    print(json.dumps(result, indent=1, allow_nan=False) if args.json else text, end="")
    if args.output and not args.json:
        print(f"wrote {args.output}/compare.json and compare.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
