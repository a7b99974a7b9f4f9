"""Issue #45's chain, from the committed training checkpoint to the adoption rule's evidence, as one
resumable background job.

Usage::

    nohup python scripts/candidate_chain.py >> runs/chain45.log 2>&1 &   # start, or continue
    kill -TERM <its pid>        # pause: the running step saves (a checkpoint, the predictions so far)
    python scripts/candidate_chain.py --plan                             # what is done, what is next

The evaluations take hours across sessions, and a sharded evaluation's rows must all come from one
code revision (``--merge`` refuses a worker resumed under other code). While commits go on, run
the chain from a checkout pinned at one revision, with ``runs/`` shared::

    git worktree add --detach ../chain45 HEAD && ln -s "$PWD/runs" ../chain45/runs
    cp -r benchmarks ../chain45/   # the prepared suites (git-ignored; else prepared again there)
    cd ../chain45 && PYTHONPATH=$PWD nohup python scripts/candidate_chain.py >> runs/chain45.log 2>&1 &

Training, data and calibration steps are skipped when their output is whole (an evaluation rerun on
a finished folder only rescores it; compare, the clause checks and the timing rerun, minutes), so
the same command continues the chain where it stopped (on this machine: ``runs/`` is git-ignored; on a fresh clone the long part, training,
resumes from ``training-checkpoints/`` and the evaluations start again). SIGTERM reaches the step
that runs (``scripts/train_default.py`` passes it on to ``noulengine train``, which saves a
checkpoint; ``noulengine eval`` keeps the rows it answered) and no later step starts; exit status
75 (EX_TEMPFAIL) then, 0 when every step is done.

Steps (docs/training.md, "Five epochs of mix v4"; docs/results.md, "The adoption rule"):

1. ``v4``: mix v4 for five epochs (4,930 updates, native CPU kernels).
2. ``v6``: the v6 continuation of that model (``--init-adapter``; balanced yes/no scenario fields),
   trained under the name it would ship as, ``noul-smollm2-135m-v3``; then ``calibrate``.

   Each run's committed state (``training-checkpoints/v4x5n``, ``training-checkpoints/v6``: a
   checkpoint, or the finished model a later run starts from) is copied into ``runs/`` when that
   run's model folder holds nothing yet. Once v6 has begun, v4 is never trained again: its finished
   adapter is all v6 needs (the trainer checks it by content on ``--resume``).
3. ``eval``: the baseline (``noul-smollm2-135m-v2``, loaded by name so the runs stay valid when the
   default moves) and the candidate on the full suites: accuracy-v1 (typed_decisions, the three
   Jevbench suites and toolace with ``--probe reverse``; AG News and WildJailbreak without it, as
   v2's earlier full runs), procedural-v1 with ``--probe reverse``, zh-decision-bench.
4. ``compare``: ``noulengine compare v2=... v3=...`` into ``runs/chain45/compare`` (the suite
   clauses of the adoption rule, the seven-suite mean, constant fields); the speed of both
   (``experiments/compare_models_speed.py``); then the verdict, clause by clause
   (``scripts/adoption_verdict.py``: ``runs/chain45/verdict.md``).

The cheap clauses run between calibration and the suites: the held-out yes/no rows per kind
(``experiments/selection_by_kind.py``, yes AUC) and the README's tickets in both option orders
(``experiments/readme_tickets.py``) for both models, each skipped once its file exists, then a
first verdict: "undecided" until the suites are in, but a clause that already fails says so hours
earlier.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from noulengine.train.checkpoint import EXIT_RESUMABLE  # noqa: E402

PY = sys.executable
RECIPE = [PY, "scripts/train_default.py"]
V4_WORK, V6_WORK, OUT = Path("runs/train-v4x5n"), Path("runs/train-v6"), Path("runs/chain45")
# where a session that ends mid-chain commits each run's state (training-checkpoints/README.md)
COMMITTED = {V4_WORK: Path("training-checkpoints/v4x5n"), V6_WORK: Path("training-checkpoints/v6")}
V4_TRAIN = ["--mix", "v4", "--work", str(V4_WORK), "--numerics", "native", "--epochs", "5", "--max-updates", "4930",
            "--eval-every", "500", "--checkpoint-every", "50"]
CANDIDATE = "noul-smollm2-135m-v3"
V6_TRAIN = ["--mix", "v6", "--work", str(V6_WORK), "--numerics", "native", "--name", CANDIDATE,
            "--init-adapter", str(V4_WORK / "model"), "--eval-every", "200", "--checkpoint-every", "50"]
BASELINE = "noul-smollm2-135m-v2"
MODELS = {"v2": BASELINE, "v3": str(V6_WORK / "model")}
# (run folder suffix, eval flags): what each model is evaluated on
EVALS = [
    ("acc-probe", ["--suite", "accuracy-v1", "--tasks", "typed_decisions,jevbench_original,jevbench_easy,"
                   "jevbench_hard,toolace", "--probe", "reverse"]),
    ("acc-big", ["--suite", "accuracy-v1", "--tasks", "agnews,wildjailbreak"]),
    ("procedural", ["--suite", "procedural-v1", "--probe", "reverse"]),
    ("zh", ["--suite", "zh-decision-bench"]),
]


EVAL_WORKERS = 2


def evaluate(chain: "Chain", flags: list[str], model: str, out: Path) -> None:
    """One evaluation as ``EVAL_WORKERS`` shard workers side by side, then the checked merge: two
    workers of one thread each answer 1.28x the requests per second of one process of two threads
    on this 2-core CPU (AG News, 400 rows, session 24); a rerun on finished worker folders only
    rescores them, and the merge is checked and idempotent."""
    workers = [[PY, "-m", "noulengine.eval", *flags, "--model", model, "--no-plots", "--no-progress",
                "--output", str(out), "--workers", str(EVAL_WORKERS), "--worker", str(r)] for r in range(EVAL_WORKERS)]
    chain.run_together(workers, env={"NOULENGINE_THREADS": "1"})
    chain.run([PY, "-m", "noulengine.eval", "--output", str(out), "--merge", "--workers", str(EVAL_WORKERS),
               "--no-plots"])


class Paused(Exception):
    """A step stopped early on SIGTERM with what it had saved; the same command continues it."""


class Chain:
    """Runs the steps in order, one child process at a time, passing SIGTERM on to the child."""

    def __init__(self, dry: bool = False):
        self.dry, self.stop, self.children = dry, False, []
        self.switches: dict[str, bool] = {}  # a chain's own on/off flags (run_main's ``switches``)
        self.restored: dict[Path, str] = {}  # run folder -> "checkpoint" | "finished" (what --plan would copy)
        self.built: set[Path] = set()  # run folders whose data step ran (or, under --plan, would run)

    def on_sigterm(self, signum, frame):
        self.stop = True
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signum)

    def run(self, cmd: list[str], ok=(0,), env: dict | None = None) -> int:
        """Run one command; returns its exit status (raising unless in ``ok``; :class:`Paused` on SIGTERM)."""
        return self.run_together([cmd], ok=ok, env=env)[0]

    def run_together(self, cmds: list[list[str]], ok=(0,), env: dict | None = None) -> list[int]:
        """Run commands side by side (an evaluation's workers) and wait for all of them."""
        for cmd in cmds:
            print("+", *cmd, *(["&"] if len(cmds) > 1 else []), flush=True)
        if self.dry:
            return [0] * len(cmds)
        if self.stop:
            raise Paused
        for cmd in cmds:
            self.children.append(subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})}))
            if self.stop:  # the signal came while a child was starting: it has not seen it
                self.on_sigterm(signal.SIGTERM, None)
        rcs = [child.wait() for child in self.children]
        self.children = []
        if self.stop:
            raise Paused
        for cmd, rc in zip(cmds, rcs):
            if rc not in ok:
                raise subprocess.CalledProcessError(rc, cmd)
        return rcs


def trained(chain: Chain, work: Path, name: str | None = None) -> bool:
    """A finished ``noulengine train`` folder: ``training.json`` written, no checkpoint left.

    Raises:
        SystemExit: the finished folder is another run's (``name`` differs): evaluating it would
            compare the wrong model; it is never overwritten either.
    """
    if chain.restored.get(work) == "finished":  # --plan: the copy it would make
        return True
    model = REPO / work / "model"
    if not (model / "training.json").is_file() or (model / "checkpoint").exists():
        return False
    got = json.loads((model / "training.json").read_text(encoding="utf-8")).get("name")
    if name is not None and got != name:
        raise SystemExit(f"{work / 'model'} holds a finished run named {got!r}, not this chain's {name!r}: move it "
                         "aside and rerun")
    return True


def paused(chain: Chain, work: Path) -> bool:
    """A run with a checkpoint to resume (or, under ``--plan``, one it would copy in)."""
    return chain.restored.get(work) == "checkpoint" or (REPO / work / "model" / "checkpoint").is_dir()


def restore(chain: Chain, work: Path) -> None:
    """On a fresh clone, copy the run's committed state into ``runs/``: a checkpoint (``state.pt``)
    to ``model/checkpoint``, a finished model (``training.json``) to ``model``. Nothing when the
    model folder exists: what this machine has is newer than any commit of it."""
    src, model = REPO / COMMITTED[work], REPO / work / "model"
    if model.exists():
        return
    kind = "checkpoint" if (src / "state.pt").is_file() else "finished" if (src / "training.json").is_file() else None
    if kind is None:
        return
    dest = model / "checkpoint" if kind == "checkpoint" else model
    print(f"+ cp -r {COMMITTED[work]} {dest.relative_to(REPO)}", flush=True)
    chain.restored[work] = kind
    if not chain.dry:
        model.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest)


def data_step(chain: Chain, work: Path, flags: list[str]) -> None:
    """Build the run's data (``--steps data``, byte for byte from ``../shared/data``) if missing."""
    if not (REPO / work / "data" / "data.json").is_file() and work not in chain.built:  # data.json: written last
        chain.run([*RECIPE, "--steps", "data", *flags[:4]])
        chain.built.add(work)  # --plan: once


def train_step(chain: Chain, work: Path, flags: list[str], env: dict) -> None:
    """Build the data if missing, then train (resuming a checkpoint where there is one)."""
    data_step(chain, work, flags)
    resume = ["--resume"] if paused(chain, work) else []
    chain.run([*RECIPE, "--steps", "train", *flags, *resume], env=env)
    if not chain.dry and not trained(chain, work):
        raise Paused  # paused inside (SIGTERM to the trainer) with a checkpoint


def steps(chain: Chain) -> None:
    env = {"NOULENGINE_THREADS": "2"}  # native numerics: the checkpoint pins the thread count
    for work in (V4_WORK, V6_WORK):
        restore(chain, work)
    # v6 started (a checkpoint) or done: v4's finished adapter is its starting point, never retrained
    if not (paused(chain, V6_WORK) or trained(chain, V6_WORK, CANDIDATE) or trained(chain, V4_WORK)):
        train_step(chain, V4_WORK, V4_TRAIN, env)
    if not trained(chain, V6_WORK, CANDIDATE):
        train_step(chain, V6_WORK, V6_TRAIN, env)
    data_step(chain, V6_WORK, V6_TRAIN)  # a restored finished model: calibration and selection rows still needed
    calibrated = REPO / (COMMITTED[V6_WORK] if chain.restored.get(V6_WORK) == "finished" else V6_WORK / "model")
    if not (calibrated / "calibration.json").is_file():
        chain.run([*RECIPE, "--steps", "calibrate", *V6_TRAIN[:6]], env=env)
    clause_checks(chain, env)
    runs = {label: [] for label in MODELS}
    for suffix, flags in EVALS:
        for label, model in MODELS.items():
            out = OUT / f"{label}-{suffix}"
            runs[label].append(str(out))
            evaluate(chain, flags, model, out)
    chain.run([PY, "-m", "noulengine", "compare", *(f"{label}={','.join(r)}" for label, r in runs.items()),
               "--output", str(OUT / "compare")])
    # a timing: nothing else of the chain runs beside it
    chain.run([PY, "experiments/compare_models_speed.py", "--a", MODELS["v2"], "--b", MODELS["v3"], "--threads", "2",
               "--output", str(OUT / "speed.json")], env=env)
    verdict(chain)


def once(chain: Chain, output: Path, cmd: list[str], env: dict) -> None:
    """Run a clause check unless its output file is there (the chain's models are fixed, and the
    verdict refuses a file about other models)."""
    if (REPO / output).is_file():
        print(f"# done: {output}", flush=True)
        return
    chain.run(cmd, env=env)


def clause_checks(chain: Chain, env: dict) -> None:
    """The cheap clauses (minutes, against hours of suites): the held-out yes/no rows per kind and
    the README's tickets in both option orders, then a verdict on what is known so far, so that a
    clause which fails already says so before the suites run."""
    both = [f for model in MODELS.values() for f in ("--model", model)]
    once(chain, OUT / "selection.json", [PY, "experiments/selection_by_kind.py", "--selection",
                                        str(V6_WORK / "data" / "selection.jsonl"), *both, "--kinds",
                                        "noul:,tool:,scenario:", "--output", str(OUT / "selection.json")], env)
    once(chain, OUT / "tickets.json", [PY, "experiments/readme_tickets.py", *both, "--output",
                                      str(OUT / "tickets.json")], env)
    verdict(chain)


def verdict(chain: Chain) -> None:
    """``scripts/adoption_verdict.py``: adopt (0), keep the baseline (1) and undecided (3) are all answers."""
    chain.run([PY, "scripts/adoption_verdict.py", "--dir", str(OUT), "--baseline-model", MODELS["v2"],
               "--candidate-model", MODELS["v3"]], ok=(0, 1, 3))

def run_main(argv: list[str] | None, doc: str, steps_fn, script: str, done: str,
             switches: dict[str, str] | None = None) -> int:
    """A chain's command line: ``--plan`` prints the commands still to run; otherwise run
    ``steps_fn(chain)`` with SIGTERM passed on to the running step (exit 75 when paused, 0 done).
    ``switches`` maps a chain's own on/off flags (``--record``) to their help; each is set on
    ``chain.switches`` by its name without dashes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", action="store_true", help="print the commands still to run, run nothing")
    for flag, text in (switches or {}).items():
        ap.add_argument(flag, action="store_true", help=text)
    args = ap.parse_args(argv)
    chain = Chain(dry=args.plan)
    chain.switches = {flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_"))
                      for flag in (switches or {})}
    previous = signal.signal(signal.SIGTERM, chain.on_sigterm)
    try:
        steps_fn(chain)
    except Paused:
        print(f"paused: rerun `python {script}` to continue (exit {EXIT_RESUMABLE})", flush=True)
        return EXIT_RESUMABLE
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"chain done: {done}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(argv, __doc__, steps, "scripts/candidate_chain.py",
                    "runs/chain45/verdict.md (clause by clause), runs/chain45/compare/compare.md")


if __name__ == "__main__":
    sys.exit(main())
