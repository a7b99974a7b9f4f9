"""Faults and friction in eval and compare (issue #57 items 2 and 3).

* A full disk while eval writes its reliability plot is one line and exit 74 (it was a traceback
  and exit 1). The disk-full error is the kernel's ENOSPC: the file is a symlink to ``/dev/full``.
* A run killed right after a batch landed, before run.json recorded it, is credited with that
  batch's time when resumed (its rows were counted with 0 s of inference, overstating the rate).
* ``noulengine compare``'s verdict sentence reads as English.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from noulengine import Engine
from noulengine.writes import EXIT_WRITE_ERROR
from tests.test_write_errors import _full, needs_dev_full, needs_jevbench  # the same /dev/full helpers


@pytest.fixture()
def tiny_eval(tiny_llama, tiny_tokenizer, monkeypatch):
    """``noulengine eval``'s main with the tiny Llama as its model."""
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    return main


@needs_dev_full
@needs_jevbench
def test_a_full_disk_while_eval_writes_its_reliability_plot_is_one_line_and_exit_74(tiny_eval, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run"
    # the plot is written through <name>.tmp and a rename (no half image); both names are full here,
    # so the write fails whichever the code opens
    plot = out / "reliability_jevbench_easy.png"
    _full(plot)
    _full(plot.with_name(plot.name + ".tmp"))
    code = tiny_eval(["--tasks", "jevbench_easy", "--limit", "2", "--no-progress", "--output", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == EXIT_WRITE_ERROR
    assert len([ln for ln in err if ln.startswith("error")]) == 1 and not any("Traceback" in ln for ln in err)
    line = next(ln for ln in err if ln.startswith("error"))
    assert f"cannot write {plot}: No space left on device (ENOSPC)" in line
    assert not plot.with_name(plot.name + ".tmp").exists()  # no temporary left behind
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and run["totals"]["requests"] == 2  # the predictions landed and count
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2
    plot.unlink()  # space again: the same command resumes and writes the plot
    assert tiny_eval(["--tasks", "jevbench_easy", "--limit", "2", "--no-progress", "--output", str(out)]) == 0
    assert plot.read_bytes().startswith(b"\x89PNG")


class Killed(BaseException):
    """A kill: nothing in the command catches it (as with SIGKILL, no cleanup code runs)."""


@needs_jevbench
def test_a_run_killed_right_after_a_batch_landed_counts_that_batch_time(tiny_eval, tmp_path, monkeypatch, capsys):
    """Issue #57: an eval killed right after a batch landed recorded those rows with 0 s of
    inference, so the resumed run's totals overstated its speed ("200 requests in 171.2 s")."""
    from noulengine.eval import run_state

    real_update = run_state.InvocationLog.update

    def killed_before_recording(self, results, *, force=False):
        if sum(r.new_predictions for r in results) >= 2:  # the first batch landed; the kill comes now
            raise Killed()
        return real_update(self, results, force=force)

    out = tmp_path / "run"
    argv = ["--tasks", "jevbench_easy", "--limit", "4", "--chunk", "2", "--no-plots", "--no-progress",
            "--output", str(out)]
    monkeypatch.setattr(run_state.InvocationLog, "update", killed_before_recording)
    with pytest.raises(Killed):
        tiny_eval(argv)
    run = json.loads((out / "run.json").read_text())
    assert run["invocations"][0]["throughput"] == {**run["invocations"][0]["throughput"], "requests": 0,
                                                   "inference_seconds": 0}
    rows = [json.loads(ln) for ln in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    monkeypatch.setattr(run_state.InvocationLog, "update", real_update)
    capsys.readouterr()
    assert tiny_eval(argv) == 0
    run = json.loads((out / "run.json").read_text())
    first, second = run["invocations"]
    assert first["throughput"]["requests"] == 2 and first["requests_counted_from_predictions"] == 2
    # at least as long as the longest request of the batch it wrote, never 0
    assert first["throughput"]["inference_seconds"] >= max(r["latency_s"] for r in rows) > 0
    assert first["inference_seconds_counted_from_predictions"] == first["throughput"]["inference_seconds"]
    assert run["totals"]["requests"] == 4
    assert run["totals"]["inference_seconds"] == pytest.approx(first["throughput"]["inference_seconds"]
                                                               + second["throughput"]["inference_seconds"])
    assert run["totals"]["requests_per_s"] == pytest.approx(4 / run["totals"]["inference_seconds"])


@needs_jevbench
def test_compare_says_its_verdict_in_a_sentence(tmp_path):
    """Issue #57 item 3: `noulengine compare` printed "mean higher (...): not decided these clauses."."""
    from noulengine.eval.compare import compare_runs, load_run, parse_run, render_markdown
    from noulengine.eval.suites import get_suite
    from tests.test_compare import _answers_for

    records = get_suite("jevbench_easy").load()
    first = _answers_for(records, lambda rec, q: q.labels[0])
    gold = _answers_for(records, lambda rec, q: rec.targets[q.field].label if q.field in rec.targets else q.labels[0])
    runs = []
    for name, rows in (("first", first), ("gold", gold)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(load_run(*parse_run(f"{name}={path}")))
    result = compare_runs(runs, n_resamples=500)
    v = result["verdicts"]["gold"]
    assert v["mean_higher"] is True and v["passes"] is None  # a mean over 1 of the collection's suites
    text = render_markdown(result)
    assert "not decided these clauses" not in text
    line = next(ln for ln in text.splitlines() if ln.startswith("- **gold**"))
    assert re.search(r"; mean higher \([^)]*\)\. These clauses are not decided: the mean lacks suites of its "
                     r"collection \([a-z_, ]+\)\.$", line), line
