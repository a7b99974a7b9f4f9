"""``python -m noulengine.train`` / ``noulengine train`` / ``accelerate launch -m noulengine.train``.

Flags are generated from :class:`noulengine.train.trainer.TrainConfig` (``--batch-tokens`` for
``batch_tokens``); bad rows exit 2 listing every row with file, line, id, field and rule; a run
paused by ``--stop-after``, SIGTERM or SIGINT saves a checkpoint and exits 75 (resumable: rerun
the same command with ``--resume OUTPUT``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from noulengine.train.config import TrainConfig


def _parse_bool(s: str) -> bool:
    table = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
    if s.lower() not in table:
        raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")
    return table[s.lower()]


def add_train_args(ap: argparse.ArgumentParser) -> None:
    """One flag per :class:`TrainConfig` field, help text from its docstring."""
    from noulengine.cli import field_help

    doc = TrainConfig.__doc__ or ""
    types = {"int": int, "int | None": int, "float": float, "float | None": float, "bool": _parse_bool}
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        help_line = field_help(doc, f.name)
        required = f.default is dataclasses.MISSING
        kwargs = dict(type=types.get(f.type, str), help=help_line)
        if f.type == "bool":
            kwargs["metavar"] = "{true,false}"
        if required:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default
            if f.default is not None:
                shown = str(f.default).lower() if isinstance(f.default, bool) else f.default
                kwargs["help"] = f"{help_line} (default {shown})"
        if f.name == "method":
            kwargs["choices"] = ["lora", "full", "top-k"]
        if f.name == "loss":
            kwargs["choices"] = ["full", "candidates"]
        if f.name == "layout":
            kwargs["choices"] = ["state-first", "schema-first"]
        if f.name == "readout":
            kwargs["choices"] = ["auto", "symbols", "label-token", "label-sequence"]
        ap.add_argument(flag, **kwargs)
        if f.name == "progress":  # the spelling eval and calibrate take, for the same thing
            ap.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                            help="hide the progress bar (= --progress false)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="noulengine train", description="Fine-tune a causal LM into a decision model "
                                 "on canonical records with targets, through any readout.")
    add_train_args(ap)
    ap.add_argument("--numerics", choices=["native", "portable"], default="native",
                    help="CPU float32 kernels: native (the fastest this CPU has) or portable (ATen's generic "
                         "kernels, MKL's COMPATIBLE path, oneDNN at SSE4.1: the same adapter bytes on any x86-64 "
                         "CPU, 1.2x to 4.4x the update time, by CPU; noulengine/train/numerics.py) "
                         "(default native)")
    args = ap.parse_args(argv)
    from noulengine.train import numerics

    try:  # before torch is imported: the kernels are chosen from the environment at first use
        numerics.apply(args.numerics)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from noulengine.models.loading import ModelNotFoundError
    from noulengine.train.data import TrainingDataError
    from noulengine.train.trainer import train
    from noulengine.writes import OutputWriteError

    config = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    from noulengine.threads import cli_threads

    # NOULENGINE_THREADS, else the usable physical cores shared among the data-parallel processes here
    threads = cli_threads(int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    try:
        numerics.check(args.numerics)  # torch is imported now: what runs is what was asked for
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result = train(config)
    except (TrainingDataError, FileExistsError, FileNotFoundError, ModelNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OutputWriteError as exc:  # a write failed (a full disk): one line; checkpoints are whole or absent
        from noulengine.writes import EXIT_WRITE_ERROR

        print(f"error: {exc}; {config.output} holds no finished model until its training.json is written (last); "
              f"the last checkpoint, if any, is whole: free space and rerun with --resume {config.output}",
              file=sys.stderr)
        return EXIT_WRITE_ERROR
    if result.stopped:
        from noulengine.train.checkpoint import EXIT_RESUMABLE

        if result.checkpoint is not None:  # the main process: the one that saved it
            print(f"paused ({result.stopped}) after update {result.step} of {result.total}: checkpoint saved in "
                  f"{result.checkpoint}; resumable: run the same command with --resume {result.output}",
                  file=sys.stderr)
        return EXIT_RESUMABLE
    if result.training:
        print(summary_text(result.training, result.output, threads=threads["threads"]))
    return 0


def _metrics_text(m: dict) -> str:
    parts = [f"accuracy {100 * m['accuracy']:.1f}%" if m.get("accuracy") is not None else None,
             f"NLL {m['nll']:.3f}" if m.get("nll") is not None else None,
             f"ECE {m['ece']:.3f}" if m.get("ece") is not None else None,
             f"flip rate {m['flip_rate']:.3f}" if m.get("flip_rate") is not None else None]
    return ", ".join(p for p in parts if p)


def summary_text(t: dict, output, *, threads: int | None = None) -> str:
    """A few lines for the terminal from ``training.json`` (which holds everything), ending with its path."""
    lines = [f"trained {t.get('name')}: {t.get('method')}, readout {t.get('readout')}, {t.get('steps')} steps in "
             f"{t.get('train_s')} s" + (f" ({threads} torch threads)" if threads else "")]
    for e in t.get("epochs") or []:
        text = f"epoch {e.get('epoch')}: train loss {e['train_loss']:.4f}" if e.get("train_loss") is not None else \
            f"epoch {e.get('epoch')}"
        if e.get("selection"):
            text += f"; selection {_metrics_text(e['selection'])}"
        lines.append(text)
    if t.get("chosen_epoch"):
        lines.append(f"kept epoch {t['chosen_epoch']} ({t.get('chosen_by')})")
    for name, m in (t.get("final") or {}).items():
        if isinstance(m, dict):
            lines.append(f"{name}: {_metrics_text(m)} on {m.get('decisions')} decisions")
    lines.append(f"wrote {output}/ (training.json: the full record)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
