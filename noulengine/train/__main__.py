"""``python -m noulengine.train`` / ``noulengine train`` / ``accelerate launch -m noulengine.train``.

Flags are generated from :class:`noulengine.train.trainer.TrainConfig` (``--batch-tokens`` for
``batch_tokens``); bad rows exit 2 listing every row with file, line, id, field and rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from noulengine.train.trainer import TrainConfig


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
        if f.name == "readout":
            kwargs["choices"] = ["auto", "symbols", "label-token", "label-sequence"]
        ap.add_argument(flag, **kwargs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="noulengine train", description="Fine-tune a causal LM into a decision model "
                                 "on canonical records with targets, through any readout.")
    add_train_args(ap)
    args = ap.parse_args(argv)
    from noulengine.models.loading import ModelNotFoundError
    from noulengine.train.data import TrainingDataError
    from noulengine.train.trainer import train

    config = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    try:
        result = train(config)
    except (TrainingDataError, FileExistsError, FileNotFoundError, ModelNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if result.training:
        t = result.training
        summary = {"output": str(result.output), "steps": t["steps"], "train_s": t["train_s"],
                   "chosen_epoch": t["chosen_epoch"], "epochs": t["epochs"], "final": t["final"]}
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
