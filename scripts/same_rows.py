#!/usr/bin/env python
"""Compare models on exactly the rows every one of them answered: each model's prediction files
(``eval``'s ``predictions.jsonl``, one or several worker files) are cut to the (suite, row) pairs
present in all of them, then scored with ``noulengine score``'s own path
(:func:`noulengine.eval.score.score_file`) and, where the rows carry ``eval --probe reverse``
results, the share of choice answers that reversing the options changed
(:func:`noulengine.eval.probe.change_summary`, the number ``eval`` reports).

Use it when one run is partial (a paused or sharded evaluation) and the other full: the comparison
is then on the same rows, never a partial run against a full one.

Usage::

    python scripts/same_rows.py --suite accuracy-v1 \\
        --model v2=runs/gpu/runs/gpu-v2-accuracy-v1/predictions.jsonl \\
        --model v4=runs/v4-acc-probe/worker-0/predictions.jsonl,runs/v4-acc-probe/worker-1/predictions.jsonl \\
        --output runs/same-rows

Writes ``<output>/<name>.jsonl`` (the cut prediction files, which ``noulengine score`` reads as
well) and ``<output>/same_rows.json``; prints one table per suite.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def read_predictions(files: list[str]) -> dict[tuple[str, int], dict]:
    """Rows keyed by ``(suite, row)`` from one model's files, each read by eval's own reader
    (:func:`noulengine.eval.runner.read_predictions`, which drops a killed run's torn last line).

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: a corrupt line, or a row in two of the files.
    """
    from noulengine.eval.runner import read_predictions as read_run

    out: dict[tuple[str, int], dict] = {}
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"{f}: no such predictions file")
        rows = read_run(Path(f))
        twice = sorted(set(rows) & set(out))
        if twice:
            raise ValueError(f"{f}: {twice[0][0]} row {twice[0][1]} predicted twice (also in an earlier file)")
        out.update(rows)
    return out


def compare(suite: str, models: dict[str, list[str]], output: Path, source=None) -> dict:
    """Score every model on the (suite, row) pairs all of them predicted; see the module docstring.

    Returns:
        ``{"rows": {suite: n}, "models": {name: {suite: report}}}``; each report is
        :func:`~noulengine.eval.score.score_file`'s, plus ``order_probe`` (or None without probe
        results).
    """
    from noulengine.eval.probe import change_summary, record_items
    from noulengine.eval.score import score_file
    from noulengine.eval.suites import get_suite

    preds = {name: read_predictions(files) for name, files in models.items()}
    common = set.intersection(*(set(p) for p in preds.values()))
    if not common:
        raise ValueError("the models share no predicted (suite, row)")
    output.mkdir(parents=True, exist_ok=True)
    suites = sorted({s for s, _ in common})
    records = {s: dict(get_suite(s).load(source=source)) for s in suites}
    result = {"rows": {s: sum(1 for k in common if k[0] == s) for s in suites}, "models": {}}
    for name, rows in preds.items():
        path = output / f"{name}.jsonl"
        keep = sorted(common)
        path.write_text("".join(json.dumps(rows[k]) + "\n" for k in keep), encoding="utf-8")
        rep = score_file(suite, path, source=source)
        reports = rep["suites"] if "suites" in rep else {rep["suite"]: rep}
        for s, r in reports.items():
            if s not in records or "counts" not in r:
                continue
            pairs = [(records[s][i], rows[(s, i)]) for (t, i) in keep if t == s]
            has_probe = any((p.get("probe") or {}).get("reverse") for _, p in pairs)
            r["order_probe"] = change_summary(record_items(pairs), "reverse") if has_probe else None
        result["models"][name] = {s: r for s, r in reports.items() if "counts" in r}
    return result


def _fmt(x, pct=False) -> str:
    return "n/a" if x is None else (f"{100 * x:.1f}%" if pct else f"{x:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="accuracy-v1", help="a suite, group or collection (as noulengine score)")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=FILE[,FILE]",
                    help="a model's prediction files (repeat for each model, two or more)")
    ap.add_argument("--output", required=True, help="folder for the cut files and same_rows.json")
    ap.add_argument("--source", default=None, help="raw data root (default: $NOULENGINE_DATA, else ../shared/data)")
    args = ap.parse_args(argv)
    models = {}
    for spec in args.model:
        name, sep, files = spec.partition("=")
        if not sep or not name or not files:
            ap.error(f"--model {spec!r}: give NAME=FILE[,FILE]")
        models[name] = files.split(",")
    if len(models) < 2:
        ap.error("give two or more --model")
    res = compare(args.suite, models, Path(args.output), args.source)
    names = list(models)
    print("| suite | rows | " + " | ".join(f"{n}: accuracy / NLL / ECE / reversal changed / yes AUC" for n in names)
          + " | chance | majority |")
    print("|---|---:|" + "---|" * len(names) + "---:|---:|")
    for s, n in res["rows"].items():
        cells, base = [], {}
        for name in names:
            r = res["models"][name].get(s)
            if r is None:
                cells.append("not scored")
                continue
            base = r["baselines"]
            probe = r.get("order_probe") or {}
            cells.append(f"{_fmt(r['accuracy'], True)} / {_fmt(r['nll'])} / {_fmt(r['ece'])} / "
                         f"{_fmt(probe.get('change_share'))} / {_fmt((r.get('noul') or {}).get('yes_auc'))}")
        print(f"| {s} | {n} | " + " | ".join(cells) + f" | {_fmt(base.get('chance'), True)} | "
              f"{_fmt(base.get('majority'), True)} |")
    (Path(args.output) / "same_rows.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
