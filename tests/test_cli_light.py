"""Command-line details (issue #25, item 14): --help without torch, names as typed, plain help
text, clear messages for a missing --questions, error rows named on stderr, refused training rows
in line order, short terminal summaries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

COMMANDS = ["", "decide", "eval", "score", "calibrate", "serve", "bench", "train"]

HELP_PROBE = """
import contextlib, io, json, sys
from noulengine.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        main(sys.argv[1:] + ["--help"])
    except SystemExit:
        pass
print(json.dumps({"help": buf.getvalue(), "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def _help(command: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", HELP_PROBE, *([command] if command else [])], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def helps():
    return {c: _help(c)["help"] for c in COMMANDS}


@pytest.mark.parametrize("command", COMMANDS)
def test_help_loads_no_torch(command):
    got = _help(command)
    assert got["help"].startswith("usage: noulengine")
    assert got["heavy"] == []  # `noulengine X --help` answers at once instead of after 4-5 s of imports


def test_help_names_each_command_as_typed_and_has_no_markup(helps):
    for command in COMMANDS[1:]:
        text = helps[command]
        assert text.startswith(f"usage: noulengine {command} "), text[:80]
        assert "``" not in text and "python -m" not in text, command


def test_light_engine_choices_match_the_modules_that_define_them():
    from noulengine.compile.compiler import DEBIAS_MODES
    from noulengine.compile.layout import READOUT_MODES
    from noulengine.engine.config import DEBIAS_CHOICES, DTYPE_CHOICES, READOUT_CHOICES
    from noulengine.engine.model_runner import DTYPE_NAMES

    assert READOUT_CHOICES == READOUT_MODES and DEBIAS_CHOICES == DEBIAS_MODES and DTYPE_CHOICES == DTYPE_NAMES
    from noulengine import EngineConfig
    from noulengine.engine.engine import EngineConfig as Same

    assert EngineConfig is Same
    from noulengine.train import TrainConfig
    from noulengine.train.trainer import TrainConfig as SameTrain

    assert TrainConfig is SameTrain


def test_decide_state_without_questions_names_the_missing_flag(monkeypatch, capsys):
    from noulengine import cli

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: pytest.fail("the model must not load"))
    assert cli.main(["decide", "--state", '{"ticket": "x"}']) == 2
    assert "error: --questions is missing" in capsys.readouterr().err
    assert cli.main(["decide"]) == 2
    assert "give either --input FILE or --state/--questions" in capsys.readouterr().err
    assert cli.main(["decide", "--input", "x.jsonl", "--state", '"s"']) == 2
    assert "not both" in capsys.readouterr().err


def test_decide_input_names_the_error_rows_on_stderr(tiny_llama, tiny_tokenizer, monkeypatch, tmp_path, capsys):
    from noulengine import Engine, cli

    q = {"q": {"type": "choice", "instructions": "?", "criteria": {"a": "A", "b": "B"}}}
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([json.dumps({"id": "fine", "state": "s", "questions": q}),
                              json.dumps({"id": "no-questions", "state": "s"}),
                              "{not json",
                              json.dumps({"id": "fine2", "state": "s", "questions": q})]) + "\n")
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    assert cli.main(["decide", "--no-progress", "--input", str(src), "--output", str(tmp_path / "o.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "2 answered, 2 error rows" in err
    listed = [line.strip() for line in err.splitlines() if line.startswith("  line ")]
    assert len(listed) == 2
    assert listed[0].startswith("line 2 (id 'no-questions'): ") and "questions" in listed[0]
    assert listed[1].startswith("line 3 (no id): ")


def test_train_lists_refused_rows_in_line_order(tmp_path):
    from noulengine.train.data import TrainingDataError, load_training_rows

    q = {"topic": {"type": "choice", "instructions": "?", "criteria": {"world": "W", "sports": "S"}}}
    rows = [{"id": "r1", "state": "s", "questions": q},  # no target: a rule error, found after parsing
            {"id": "r2", "state": "s", "questions": q, "targets": {"topic": {"label": "world"}}},
            {"id": "r3", "state": "s", "questions": q, "targets": {"topic": {"label": "nope"}}},  # a parse error
            {"id": "r4", "state": "s", "questions": q, "validation_role": "selection",
             "targets": {"topic": {"label": "world"}}},
            "{broken"]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TrainingDataError) as info:
        load_training_rows(path)
    assert [e.line for e in info.value.errors] == [1, 3, 4, 5]
    shown = [line for line in str(info.value).splitlines()[1:]]
    assert [int(s.split("train.jsonl:")[1].split()[0].rstrip(":,)")) for s in shown] == [1, 3, 4, 5]


def test_train_prints_a_summary_and_the_path():
    from noulengine.train.__main__ import summary_text

    from noulengine.models.loading import DEFAULT_ADAPTER_DIR

    training = json.loads((DEFAULT_ADAPTER_DIR / "training.json").read_text())
    text = summary_text(training, "runs/my-model", threads=2)
    lines = text.splitlines()
    assert len(lines) <= 6 and lines[-1] == "wrote runs/my-model/ (training.json: the full record)"
    assert lines[0].startswith(f"trained {training['name']}: ") and "(2 torch threads)" in lines[0]
    assert "epoch 1: train loss" in text and "selection accuracy" in text
    assert "tokenizer_probe" not in text and "loss_curve" not in text


def test_train_takes_no_progress_like_eval_and_calibrate():
    """`noulengine train --no-progress` = `--progress false` (the spelling eval and calibrate take)."""
    import argparse

    from noulengine.train.__main__ import add_train_args

    ap = argparse.ArgumentParser()
    add_train_args(ap)
    base = ["--data", "d.jsonl", "--output", "out"]
    assert ap.parse_args(base).progress is True
    assert ap.parse_args(base + ["--no-progress"]).progress is False
    assert ap.parse_args(base + ["--progress", "false"]).progress is False
