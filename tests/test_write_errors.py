"""A full disk (or any write error) during eval, score, calibrate, compare and train (issue #46 item 2):
one line naming the path and the error, exit 74, nothing half-written left that looks whole, and
after a resume the run's request count equals the rows written across its invocations.

The disk-full errors are real ENOSPC errors from the kernel: the file written is a symlink to
``/dev/full``, which accepts an open and refuses every byte."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from noulengine import Engine
from noulengine.writes import EXIT_WRITE_ERROR, OutputWriteError, write_text_atomic
from tests.conftest import SHARED_DATA

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.is_char_device(), reason="no /dev/full device on this system")
needs_jevbench = pytest.mark.skipif(not (SHARED_DATA / "jevbench" / "easy.jsonl").is_file(),
                                    reason="shared jevbench data not present")


def _full(path: Path) -> Path:
    """Make ``path`` a symlink to /dev/full: writing it fails with ENOSPC."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(FULL)
    return path


@needs_dev_full
def test_an_atomic_write_on_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text("old\n")
    _full(tmp_path / "metrics.json.tmp")
    with pytest.raises(OutputWriteError) as info:
        write_text_atomic(target, "new\n")
    assert info.value.cause.errno == errno.ENOSPC and str(target) in str(info.value) and "ENOSPC" in str(info.value)
    assert target.read_text() == "old\n" and not (tmp_path / "metrics.json.tmp").exists()


class _TearingFile:
    """A real append-mode file whose write lands half its bytes, then fails as a full disk does."""

    def __init__(self, path: Path):
        self.fh = open(path, "ab", buffering=0)

    def write(self, data) -> int:
        self.fh.write(bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.fh, name)


def test_a_batch_that_fails_halfway_is_cut_back_to_the_last_whole_batch(tmp_path):
    from noulengine.eval.runner import _append_batch, read_predictions

    path = tmp_path / "predictions.jsonl"
    with path.open("ab", buffering=0) as sink:
        _append_batch(sink, path, [{"suite": "s", "row": 0, "answers": {}}])
    sink = _TearingFile(path)
    with pytest.raises(OutputWriteError, match="rows of earlier batches are kept"):
        _append_batch(sink, path, [{"suite": "s", "row": i, "answers": {}} for i in (1, 2, 3)])
    sink.fh.close()
    assert path.read_text() == '{"suite": "s", "row": 0, "answers": {}}\n'  # no torn line left
    assert list(read_predictions(path)) == [("s", 0)]


def _tiny_engine(tiny_llama, tiny_tokenizer):
    return lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer)


@needs_dev_full
@needs_jevbench
def test_eval_on_a_full_disk_says_one_line_and_exits_74(tmp_path, tiny_llama, tiny_tokenizer, monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", _tiny_engine(tiny_llama, tiny_tokenizer))
    out = tmp_path / "run"
    _full(out / "predictions.jsonl")
    code = main(["--tasks", "jevbench_easy", "--limit", "2", "--no-plots", "--no-progress", "--output", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert code == EXIT_WRITE_ERROR
    assert len(err) == 1 and f"cannot write {out / 'predictions.jsonl'}: No space left on device (ENOSPC)" in err[0]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and run["totals"]["requests"] == 0


@needs_jevbench
def test_after_a_write_error_and_a_resume_the_totals_count_the_rows_written(tmp_path, tiny_llama, tiny_tokenizer,
                                                                            monkeypatch, capsys):
    """The disk fills after the second batch landed, so neither the third batch nor run.json's update
    for the second can be written: the first invocation's record says 1 request, the file holds 2
    rows. The resumed invocation counts the difference from predictions.jsonl: totals 5 = 5 rows."""
    from noulengine import cli
    from noulengine.eval import run_state, runner
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", _tiny_engine(tiny_llama, tiny_tokenizer))
    real_append, real_write = runner._append_batch, run_state.write_json_atomic
    state = {"batches": 0}
    enospc = OSError(errno.ENOSPC, "No space left on device")

    def append(sink, path, rows):
        if state["batches"] == 2:
            raise OutputWriteError(path, enospc)
        real_append(sink, path, rows)
        state["batches"] += 1

    def write(path, obj):
        if state["batches"] >= 2:
            raise OutputWriteError(path, enospc)
        real_write(path, obj)

    monkeypatch.setattr(runner, "_append_batch", append)
    monkeypatch.setattr(run_state, "write_json_atomic", write)
    out = tmp_path / "run"
    args = ["--tasks", "jevbench_easy", "--limit", "5", "--chunk", "1", "--no-plots", "--no-progress", "--output",
            str(out)]
    assert main(args) == EXIT_WRITE_ERROR
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "run.json").read_text())["totals"]["requests"] == 1  # the stale record
    monkeypatch.setattr(runner, "_append_batch", real_append)
    monkeypatch.setattr(run_state, "write_json_atomic", real_write)
    capsys.readouterr()
    assert main(args) == 0
    run = json.loads((out / "run.json").read_text())
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 5
    assert run["totals"]["requests"] == 5 and [i["throughput"]["requests"] for i in run["invocations"]] == [2, 3]
    assert run["invocations"][0]["requests_counted_from_predictions"] == 1
    assert "all 2 invocations: 5 requests" in capsys.readouterr().out


@needs_dev_full
@needs_jevbench
def test_score_and_compare_on_a_full_disk(tmp_path, capsys):
    from noulengine.eval.compare import main as compare_main
    from noulengine.eval.score import main as score_main
    from noulengine.eval.suites import get_suite

    rows = [{"suite": "jevbench_easy", "row": i, "answers": {q.field: {"probabilities": {lab: 1 / len(q.labels)
                                                                                         for lab in q.labels}}
                                                             for q in rec.request.questions}}
            for i, rec in get_suite("jevbench_easy").load()]
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _full(tmp_path / "scores.json.tmp")
    assert score_main(["--suite", "jevbench_easy", "--predictions", str(preds), "--output",
                       str(tmp_path / "scores.json")]) == EXIT_WRITE_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0] and "scores.json: No space left on device" in err[0]
    assert not (tmp_path / "scores.json").exists()
    _full(tmp_path / "cmp" / "compare.json.tmp")
    assert compare_main([f"a={preds}", f"b={preds}", "--resamples", "100", "--output",
                         str(tmp_path / "cmp")]) == EXIT_WRITE_ERROR
    assert "compare.json: No space left on device" in capsys.readouterr().err


def test_calibrate_and_train_on_a_full_disk_exit_74_with_one_line(tmp_path, monkeypatch, capsys):
    import noulengine.cli
    from noulengine.calibrate.__main__ import main as calibrate_main
    from noulengine.train import trainer
    from noulengine.train.__main__ import main as train_main
    from tests.test_calibrate_engine import _FakeEngine

    rows = [{"id": f"c{i}", "state": {"logits": [1.0, 0.0], "i": i}, "validation_role": "calibration",
             "questions": {"decision": {"type": "choice", "instructions": "?", "criteria": {"a": None, "b": None}}},
             "targets": {"decision": {"label": "a" if i % 4 else "b"}}} for i in range(60)]
    vfile = tmp_path / "v.jsonl"
    vfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(noulengine.cli, "engine_from_args", lambda args, **_: _FakeEngine())
    if FULL.is_char_device():
        _full(tmp_path / "cal.json.tmp")
        assert calibrate_main(["--validation", str(vfile), "--output", str(tmp_path / "cal.json"), "--no-progress",
                               "--no-plots"]) == EXIT_WRITE_ERROR
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
        assert len(err) == 1 and "cal.json: No space left on device" in err[0]
        assert not (tmp_path / "cal.json").exists()

    def full_disk(config):  # what torch.save raises when the disk fills under a checkpoint
        from noulengine.writes import saving

        with saving(Path(config.output) / "checkpoint", "the previous checkpoint, if any, is kept"):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                               "data/0: file write failed")

    monkeypatch.setattr(trainer, "train", full_disk)
    data = tmp_path / "t.jsonl"
    data.write_text("")
    assert train_main(["--data", str(data), "--output", str(tmp_path / "m")]) == EXIT_WRITE_ERROR
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(err) == 1 and "checkpoint: RuntimeError: [enforce fail" in err[0] and "--resume" in err[0]
