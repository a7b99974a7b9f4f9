"""Issue #54's chain: from the merge selection to the adoption rule's verdict on each merged candidate,
as one resumable background job.

Usage::

    nohup python scripts/merge_chain.py >> runs/chain54.log 2>&1 &   # start, or continue
    kill -TERM <its pid>        # pause: the running step keeps what it saved (eval rows so far)
    python scripts/merge_chain.py --plan                             # what is done, what is next

Steps (docs/results.md, "Merging v2 with the later adapters (issue #54)"):

1. ``select``: ``scripts/merge_selection.py`` (the merges, scored on the recipe's selection rows
   only; its rule names at most three candidates) unless ``runs/merge54/selection.json`` exists.
2. ``calibrate``: each candidate copied to ``runs/chain54/models/<name>`` and calibrated there
   (``noulengine calibrate`` on validation-v1's and the v6 recipe's procedural calibration rows, as
   the recipe calibrates: a source's temperatures do not carry over to a merge).
3. ``clauses``: the held-out yes/no, tool and scenario rows (``experiments/selection_by_kind.py``,
   calibrated) and the README's tickets in both option orders, for v2 and every candidate.
4. ``eval``: the full suites, v2 (by name) and each candidate, in the order that decides soonest:
   typed_decisions (the suite the last candidate lost), then toolace and the Jevbench suites, then
   zh-decision-bench, procedural-v1, and AG News and WildJailbreak last (the largest, where every
   model so far is within two points). After each group: ``noulengine compare`` of v2 and each
   candidate over every group done so far (``runs/chain54/<name>/compare``) and its verdict; a candidate whose verdict is already "keep the
   baseline" (a clause failed, with its interval) is evaluated no further: the rule needs one
   failed clause, and the CPU hours go to the candidates still standing.
   With ``--record`` a candidate that failed a clause is evaluated on every group all the same, so
   that its comparisons against v2 exist for the record (the issue's "v2 stays with the
   comparisons"); its verdict is unchanged by them.
5. ``speed``: ``experiments/compare_models_speed.py`` for each candidate still standing (nothing
   else of the chain runs beside it), then the final verdicts: ``runs/chain54/<name>/verdict.md``.

6. ``continuation`` (item 4 of the issue, when every chosen merge failed a clause): the short
   continuation of the chosen v2+v6 merge on a replay of v2's mix (``scripts/train_default.py --mix
   v7``, trained outside the chain: ``CONTINUATION``'s command), once its model folder is finished,
   is copied to ``runs/chain54/models/<label>``, calibrated the same way, and checked and evaluated
   like the others (its clause files ``selection.json`` and ``tickets.json`` are its own, in
   ``runs/chain54/<label>/``: the shared ones were measured before it existed). The v2 runs are
   shared: they come from the same pinned code.

Evaluations span sessions; their rows must all come from one code revision (``--merge`` refuses a
worker resumed under other code), so run the chain from a pinned worktree while commits go on
(``scripts/candidate_chain.py``'s docstring shows the commands). SIGTERM reaches the running step;
exit 75 then, 0 when every step is done.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

from candidate_chain import PY, Chain, evaluate, run_main  # noqa: E402

OUT = Path("runs/chain54")
SELECTION = Path("runs/merge54/selection.json")
# where a session commits the chain's small, slow-to-remake state for a fresh clone: the selection
# (an hour of CPU) and each candidate's calibration.json (minutes each); the merges are rebuilt
COMMITTED = Path("training-checkpoints/merge54")
V6_DATA = Path("runs/train-v6/data")
BASELINE_LABEL, BASELINE = "v2", "noul-smollm2-135m-v2"
# item 4's next candidate: (label, the finished `noulengine train` folder) and how it is trained
# (from /work/main, not the pinned worktree: scripts/train_default.py's mix v7 came later)
CONTINUATION = ("v7", Path("runs/train-v7/model"))
CONTINUATION_COMMAND = ("NOULENGINE_THREADS=2 python scripts/train_default.py --steps data,train --mix v7 --work "
                        "runs/train-v7 --numerics native --name noul-smollm2-135m-v3 --init-adapter "
                        "runs/chain54/models/v2v6-lin30 --eval-every 100 --checkpoint-every 25")
# (group, eval flags), in the order that decides soonest
EVALS = [
    ("typed", ["--suite", "accuracy-v1", "--tasks", "typed_decisions", "--probe", "reverse"]),
    ("small", ["--suite", "accuracy-v1", "--tasks", "toolace,jevbench_original,jevbench_easy,jevbench_hard",
               "--probe", "reverse"]),
    ("zh", ["--suite", "zh-decision-bench"]),
    ("procedural", ["--suite", "procedural-v1", "--probe", "reverse"]),
    ("acc-big", ["--suite", "accuracy-v1", "--tasks", "agnews,wildjailbreak"]),
]


def candidates(chain: Chain) -> dict[str, str]:
    """label -> model folder (``runs/chain54/models/<label>``) of the candidates the selection chose."""
    if not (REPO / SELECTION).is_file():
        if chain.dry:
            return {"<chosen>": str(OUT / "models" / "<chosen>")}
        raise SystemExit(f"{SELECTION} missing after the select step")
    chosen = json.loads((REPO / SELECTION).read_text())["chosen"]
    return {name: str(OUT / "models" / name) for name in chosen.values() if name is not None}


def continuation(chain: Chain) -> dict[str, str]:
    """label -> model folder of the continuation candidate, copied in from its finished training
    folder (adapter, config, training.json; its temperatures fitted by :func:`calibrate`), or {}
    while it is not trained (``CONTINUATION_COMMAND`` trains it)."""
    label, trained = CONTINUATION
    folder = OUT / "models" / label
    done = (REPO / trained / "training.json").is_file() and not (REPO / trained / "checkpoint").exists()
    if not (REPO / folder / "adapter_model.safetensors").is_file():
        if not done:
            print(f"# {label}: not trained yet ({trained}): {CONTINUATION_COMMAND}", flush=True)
            return {}
        print(f"+ cp {trained}/{{adapter_config.json,adapter_model.safetensors,training.json}} {folder}/", flush=True)
        if not chain.dry:
            (REPO / folder).mkdir(parents=True, exist_ok=True)
            for f in ("adapter_config.json", "adapter_model.safetensors", "training.json"):
                shutil.copy2(REPO / trained / f, REPO / folder / f)
    return {label: str(folder)}


def source_folder(label: str) -> Path:
    """Where grid entry ``label`` was written (a merge) or is committed (a source as it is)."""
    import merge_selection

    return REPO / merge_selection.model_path(label)


def restore(chain: Chain) -> None:
    """On a fresh clone, copy the committed selection (``COMMITTED/selection.json`` and its scores)
    into ``runs/merge54/``; nothing when the selection is there already."""
    src = REPO / COMMITTED / "selection.json"
    if (REPO / SELECTION).is_file() or not src.is_file():
        return
    print(f"+ cp {COMMITTED}/selection.json {COMMITTED}/scores {SELECTION.parent}/", flush=True)
    if not chain.dry:
        (REPO / SELECTION).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, REPO / SELECTION)
        if (REPO / COMMITTED / "scores").is_dir():
            shutil.copytree(REPO / COMMITTED / "scores", REPO / SELECTION.parent / "scores", dirs_exist_ok=True)


def calibrate(chain: Chain, label: str, folder: str) -> None:
    """Copy the candidate in (adapter, config, training.json; a merge rebuilt first when missing,
    deterministically) and fit its temperatures there, or take the committed ones (checked
    against the adapter's bytes when the model loads)."""
    import merge_selection

    dest = REPO / folder
    if (dest / "calibration.json").is_file():
        return
    committed = REPO / COMMITTED / label / "calibration.json"
    if not chain.dry and label != CONTINUATION[0]:  # the continuation was copied in by continuation()
        merge_selection.build(label)
        src = source_folder(label)
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("adapter_config.json", "adapter_model.safetensors", "training.json"):
            shutil.copy2(src / f, dest / f)
        if committed.is_file():
            shutil.copy2(committed, dest / "calibration.json")
            return
    from make_validation import DEFAULT_OUT

    chain.run([PY, "-m", "noulengine", "calibrate", "--validation", str(DEFAULT_OUT / "agnews.jsonl"),
               "--validation", str(DEFAULT_OUT / "wildjailbreak.jsonl"),
               "--validation", str(V6_DATA / "calibration_procedural.jsonl"), "--model", folder,
               "--output", f"{folder}/calibration.json", "--no-progress"], env={"NOULENGINE_THREADS": "2"})


def once(chain: Chain, output: Path, cmd: list[str]) -> None:
    if (REPO / output).is_file():
        print(f"# done: {output}", flush=True)
        return
    chain.run(cmd, env={"NOULENGINE_THREADS": "2"})


def clause_files(chain: Chain, where: Path, folders: list[str]) -> None:
    """The cheap clauses' files in ``where`` for v2 and the candidates in ``folders``: the held-out
    yes/no, tool and scenario rows (``selection.json``) and the README's tickets (``tickets.json``),
    each skipped once it exists."""
    models = [f for m in (BASELINE, *folders) for f in ("--model", m)]
    once(chain, where / "selection.json", [PY, "experiments/selection_by_kind.py", "--selection",
                                          str(V6_DATA / "selection.jsonl"), *models, "--kinds", "noul:,tool:,scenario:",
                                          "--output", str(where / "selection.json")])
    once(chain, where / "tickets.json", [PY, "experiments/readme_tickets.py", *models, "--output",
                                        str(where / "tickets.json")])


def verdict_dir(label: str, speed: bool = False) -> Path:
    """``runs/chain54/<label>/``: the files ``adoption_verdict.py`` reads, linked to the shared ones
    (the continuation's are its own)."""
    d = REPO / OUT / label
    d.mkdir(parents=True, exist_ok=True)
    for name in ("selection.json", "tickets.json") if label != CONTINUATION[0] else ():
        link = d / name
        if not link.is_symlink() and not link.exists():
            link.symlink_to(Path("..") / name)
    return d


def verdicts(chain: Chain, models: dict[str, str]) -> dict[str, str]:
    """Run the adoption verdict for each candidate; returns label -> verdict (``undecided`` under --plan)."""
    out = {}
    for label, folder in models.items():
        d = verdict_dir(label) if not chain.dry else OUT / label
        chain.run([PY, "scripts/adoption_verdict.py", "--dir", str(d), "--baseline", BASELINE_LABEL, "--baseline-model",
                   BASELINE, "--candidate", label, "--candidate-model", folder], ok=(0, 1, 3))
        got = json.loads((REPO / d / "verdict.json").read_text())["verdict"] if not chain.dry else "undecided"
        out[label] = got
    return out


def steps(chain: Chain) -> None:
    restore(chain)
    if not (REPO / SELECTION).is_file():
        if not (REPO / V6_DATA / "data.json").is_file():
            chain.run([PY, "scripts/train_default.py", "--steps", "data", "--mix", "v6", "--work", str(V6_DATA.parent)])
        chain.run([PY, "scripts/merge_selection.py"], env={"NOULENGINE_THREADS": "2"})
    models = candidates(chain)
    for label, folder in models.items():
        calibrate(chain, label, folder)
    clause_files(chain, OUT, list(models.values()))
    for label, folder in continuation(chain).items():  # its own clause files: the shared ones predate it
        calibrate(chain, label, folder)
        if not chain.dry:
            (REPO / OUT / label).mkdir(parents=True, exist_ok=True)
        clause_files(chain, OUT / label, [folder])
        models[label] = folder
    standing = {label: folder for label, folder, v in
                ((lab, f, v) for (lab, f), v in zip(models.items(), verdicts(chain, models).values()))
                if v != "keep the baseline" or chain.switches.get("record")}
    runs: dict[str, list[str]] = {label: [] for label in (BASELINE_LABEL, *models)}
    failed: set[str] = set()  # candidates kept out by a clause (still evaluated under --record)
    for group, flags in EVALS:
        if not standing:
            break
        for label, model in ((BASELINE_LABEL, BASELINE), *standing.items()):
            out = OUT / "evals" / f"{label}-{group}"
            runs[label].append(str(out))
            evaluate(chain, flags, model, out)
        for label in standing:  # one comparison per candidate: compare keeps the suites its runs share
            chain.run([PY, "-m", "noulengine", "compare", f"{BASELINE_LABEL}={','.join(runs[BASELINE_LABEL])}",
                       f"{label}={','.join(runs[label])}", "--output", str(OUT / label / "compare")])
        decided = verdicts(chain, standing)
        failed = {label for label, v in decided.items() if v == "keep the baseline"}
        for label, v in decided.items():
            if v == "keep the baseline" and not chain.switches.get("record"):
                print(f"# {label}: a clause failed after {group}; evaluated no further (runs/chain54/{label}/"
                      "verdict.md)", flush=True)
                del standing[label]
    for label, folder in standing.items():  # a timing: nothing else of the chain runs beside it
        if label in failed:  # --record: a candidate already kept out needs no timing
            continue
        once(chain, OUT / label / "speed.json", [PY, "experiments/compare_models_speed.py", "--a", BASELINE,
                                                "--b", folder, "--threads", "2", "--output",
                                                str(OUT / label / "speed.json")])
    verdicts(chain, models)


def main(argv: list[str] | None = None) -> int:
    return run_main(argv, __doc__, steps, "scripts/merge_chain.py",
                    "runs/chain54/<candidate>/verdict.md and compare/compare.md",
                    {"--record": "evaluate every candidate on every suite group even after a clause failed, "
                                 "for the record (its verdict does not change)"})


if __name__ == "__main__":
    sys.exit(main())
