"""Sharded evaluation (issue #12): stable shares, and a merge that checks before it writes."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from noulengine import Engine
from noulengine.eval.shards import shard_of
from tests.conftest import SHARED_DATA

needs_data = pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.csv").is_file(), reason="shared data not present")
TASKS = "agnews,typed_decisions,jevbench_easy,toolace"


def test_shares_are_stable_balanced_and_keyed_by_id_not_position():
    # pinned: a change to the share function would silently re-deal every resumed worker run
    assert [shard_of("agnews", f"id-{i}", i, 4) for i in range(8)] == [
        shard_of("agnews", f"id-{i}", 999, 4) for i in range(8)]  # the position does not matter
    assert shard_of("agnews", None, 5, 3) == shard_of("agnews", None, 5, 3)
    assert shard_of("agnews", None, 5, 3) == int(__import__("hashlib").sha256(b"agnews\n#5").hexdigest()[:16], 16) % 3
    counts = [0, 0, 0]
    for i in range(3000):
        counts[shard_of("agnews", f"row-{i}", i, 3)] += 1
    assert all(900 <= c <= 1100 for c in counts), counts
    assert all(shard_of("s", f"x{i}", i, 1) == 0 for i in range(50))


@pytest.fixture()
def run_main(tiny_llama, tiny_tokenizer, monkeypatch):
    """``python -m noulengine.eval`` with the tiny model; one request per forward pass so a row's
    logits do not depend on which rows share its batch (the merged and single runs then hold
    identical predictions, and the metrics must agree exactly)."""
    from noulengine import cli
    from noulengine.eval.__main__ import main

    engine = Engine.from_model(tiny_llama, tiny_tokenizer, max_batch_size=1)
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: engine)
    # One torch thread for single and worker runs alike: the commands otherwise give a single run
    # the cores and each of N workers its share, and a different thread count changes the float
    # reduction order (measured: up to 4.8e-7 in a candidate log-probability), not the answers' meaning.
    monkeypatch.setenv("NOULENGINE_THREADS", "1")
    return lambda argv: main(argv + ["--no-progress", "--no-plots"])


def _close(a, b, path=""):
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
            assert a == b, path
        else:
            assert abs(a - b) <= 1e-9, (path, a, b)
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


@needs_data
def test_merged_run_equals_the_single_run(run_main, tmp_path, capsys):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert run_main(["--tasks", TASKS, "--limit", "7", "--output", str(single)]) == 0
    for r in range(3):
        assert run_main(["--tasks", TASKS, "--limit", "7", "--output", str(sharded), "--worker", str(r),
                         "--workers", "3"]) == 0
    sizes = [len((sharded / f"worker-{r}" / "predictions.jsonl").read_text().splitlines()) for r in range(3)]
    assert sum(sizes) == 28 and all(sizes)  # 4 suites x 7 rows, split three ways
    capsys.readouterr()
    assert run_main(["--merge", "--workers", "3", "--output", str(sharded)]) == 0
    assert "merged 3 worker runs" in capsys.readouterr().out
    a = json.loads((single / "metrics.json").read_text())
    b = json.loads((sharded / "metrics.json").read_text())
    _close(a, b)
    rows_a = [json.loads(x) for x in (single / "predictions.jsonl").read_text().splitlines()]
    rows_b = [json.loads(x) for x in (sharded / "predictions.jsonl").read_text().splitlines()]
    key = lambda r: (r["suite"], r["row"])  # noqa: E731
    assert sorted(map(key, rows_a)) == sorted(map(key, rows_b)) and len(rows_b) == 28
    by_key = {key(r): r["answers"] for r in rows_a}
    assert all(by_key[key(r)] == r["answers"] for r in rows_b)  # bit-identical answers
    report = (sharded / "report.md").read_text()
    assert "merged from 3 worker runs" in report and "worker 2" in report
    run = json.loads((sharded / "run.json").read_text())
    assert run["merged_workers"] == 3 and run["totals"]["requests"] == 28


@needs_data
def test_merge_refuses_what_does_not_add_up(run_main, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--tasks", "agnews,jevbench_easy", "--limit", "6", "--output", str(out), "--workers", "2"]
    assert run_main(argv + ["--worker", "0"]) == 0
    capsys.readouterr()

    def merge_error():
        assert run_main(["--merge", "--workers", "2", "--output", str(out)]) == 2
        return capsys.readouterr().err

    assert "worker 1: no run folder" in merge_error()
    assert run_main(argv + ["--worker", "1"]) == 0
    w1 = out / "worker-1"
    pred = w1 / "predictions.jsonl"
    good = pred.read_text()

    pred.write_text("".join(good.splitlines(keepends=True)[:-1]))  # an unfinished worker
    err = merge_error()
    assert "worker 1 has not finished suite" in err and "1 of its" in err

    stranger = (out / "worker-0" / "predictions.jsonl").read_text().splitlines(keepends=True)[0]
    pred.write_text(good + stranger)  # a row of worker 0's share
    assert "outside its share" in merge_error()

    pred.write_text(good + good.splitlines(keepends=True)[0])
    assert "predicted twice" in merge_error()
    first = json.loads(good.splitlines()[0])
    pred.write_text(json.dumps({**first, "id": "bogus"}) + "\n" + "".join(good.splitlines(keepends=True)[1:]))
    assert "carries id 'bogus'" in merge_error()  # a row is the record it claims to be
    pred.write_text(json.dumps({**first, "row": str(first["row"])}) + "\n" + "".join(good.splitlines(keepends=True)[1:]))
    assert "is not a prediction row" in merge_error()
    pred.write_text(good)

    key = json.loads((w1 / "run_key.json").read_text())
    (w1 / "run_key.json").write_text(json.dumps({**key, "readout": "label-sequence"}))
    assert "readout: worker 0 has 'auto', worker 1 has 'label-sequence'" in merge_error()
    (w1 / "run_key.json").write_text(json.dumps(key))

    run = json.loads((w1 / "run.json").read_text())
    last = run["invocations"][-1]
    resumed = {**last, "git_revision": "0123abc", "throughput": {**last["throughput"], "requests": 3}}
    (w1 / "run.json").write_text(json.dumps({**run, "git_revision": "0123abc",
                                             "invocations": run["invocations"] + [resumed]}))
    assert "several code revisions" in merge_error()  # rows predicted under two revisions
    # a re-run after a new commit that found every row done predicted nothing: its revision does not count
    idle = {**resumed, "throughput": {**last["throughput"], "requests": 0}}
    (w1 / "run.json").write_text(json.dumps({**run, "git_revision": "0123abc",
                                             "invocations": run["invocations"] + [idle]}))
    w0_json = out / "worker-0" / "run.json"
    run0 = json.loads(w0_json.read_text())  # worker 0 too, so the merged metadata cannot borrow its top level
    w0_json.write_text(json.dumps({**run0, "git_revision": "0123abc", "invocations": run0["invocations"] + [idle]}))
    assert run_main(["--merge", "--workers", "2", "--output", str(out)]) == 0
    capsys.readouterr()
    assert json.loads((out / "run.json").read_text())["git_revision"] == run["git_revision"] != "0123abc"
    w0_json.write_text(json.dumps(run0))
    invocations = [{**i, "git_revision": "0123abc"} for i in run["invocations"]]
    (w1 / "run.json").write_text(json.dumps({**run, "git_revision": "0123abc", "invocations": invocations}))
    assert "code revision" in merge_error()
    (w1 / "run.json").write_text(json.dumps(run))
    (w1 / "run_key.json").write_text(json.dumps({**key, "tasks": list(reversed(key["tasks"]))}))
    assert run_main(["--merge", "--workers", "2", "--output", str(out)]) == 0  # the same suites, other order
    capsys.readouterr()
    (w1 / "run_key.json").write_text(json.dumps(key))
    # the merged folder is a run folder of its own: a plain run with other settings is refused
    assert run_main(["--tasks", "agnews,jevbench_easy", "--limit", "6", "--output", str(out)]) == 2
    assert "holds predictions of a different run" in capsys.readouterr().err

    shutil.copytree(w1, out / "worker-1-copy")
    # an unrelated folder beside the workers is ignored; with the files restored every check passes
    assert run_main(["--merge", "--workers", "2", "--output", str(out)]) == 0
    # a worker stopped early resumes in its own folder, and the merge then passes
    pred.write_text("".join(good.splitlines(keepends=True)[:-2]))
    assert run_main(argv + ["--worker", "1"]) == 0
    answers = lambda text: sorted((r["suite"], r["row"], json.dumps(r["answers"])) for r in map(json.loads, text.splitlines()))  # noqa: E731
    assert answers(pred.read_text()) == answers(good)
    assert run_main(["--merge", "--workers", "2", "--output", str(out)]) == 0


def test_shard_flags_go_together(run_main, capsys):
    assert run_main(["--worker", "1"]) == 2
    assert "--worker and --workers go together" in capsys.readouterr().err
    assert run_main(["--worker", "3", "--workers", "3"]) == 2
    assert "0..2" in capsys.readouterr().err
    assert run_main(["--merge", "--output", "x"]) == 2
    assert "--merge takes --workers" in capsys.readouterr().err
    assert run_main(["--merge", "--workers", "0", "--output", "x"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert run_main(["--worker", "0", "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


@needs_data
def test_resuming_a_worker_under_another_revision_warns_before_running(run_main, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--tasks", "jevbench_easy", "--limit", "4", "--output", str(out), "--workers", "2", "--worker", "1"]
    assert run_main(argv) == 0
    assert "rows on disk were predicted under" not in capsys.readouterr().err  # the first run: nothing to warn of
    run_json = out / "worker-1" / "run.json"
    run = json.loads(run_json.read_text())
    run_json.write_text(json.dumps({**run, "invocations": [{**i, "git_revision": "0123abc"} for i in run["invocations"]]}))
    assert run_main(argv) == 0  # nothing left to predict: it runs, and says what a merge will need
    err = capsys.readouterr().err
    assert "worker 1's rows on disk were predicted under 0123abc" in err and "git worktree add --detach DIR 0123abc" in err


def test_prediction_revisions_count_only_invocations_that_predicted():
    from noulengine.eval.merge import prediction_revisions

    def inv(rev, requests):
        return {"git_revision": rev, "throughput": {"requests": requests}}

    assert prediction_revisions({"git_revision": "b", "invocations": [inv("a", 5), inv("b", 0)]}) == {"a"}
    assert prediction_revisions({"git_revision": "b", "invocations": [inv("a", 0), inv("b", 0)]}) == set()  # empty share
    assert prediction_revisions({"git_revision": "b", "invocations": [inv("a", 5), {"git_revision": "b"}]}) == {"a", "b"}
    assert prediction_revisions({"git_revision": "a", "throughput": {"requests": 3}}) == {"a"}  # the older layout


def test_a_worker_with_an_empty_share_merges_whatever_code_reran_it(tmp_path, capsys):
    from noulengine.eval.merge import ShardMergeError, load_worker_runs

    def worker(r, invocations):
        d = tmp_path / f"worker-{r}"
        d.mkdir()
        (d / "run_key.json").write_text(json.dumps({"workers": 2, "worker": r}))
        (d / "run.json").write_text(json.dumps({"status": "finished", "git_revision": invocations[-1][0],
                                                "invocations": [{"git_revision": g, "status": "finished",
                                                                 "throughput": {"requests": n}}
                                                                for g, n in invocations]}))
        (d / "predictions.jsonl").write_text("")

    worker(0, [("X", 3)])
    worker(1, [("X", 0), ("Y", 0)])  # nothing in its share: its re-run under Y predicted nothing
    assert [r["worker"] for r in load_worker_runs(tmp_path, 2)] == [0, 1]
    (tmp_path / "worker-1" / "run.json").write_text(json.dumps({"status": "finished", "git_revision": "Y",
                                                                "invocations": [{"git_revision": "Y", "status": "finished",
                                                                                 "throughput": {"requests": 2}}]}))
    with pytest.raises(ShardMergeError, match="worker 0 predicted under 'X', worker 1 under 'Y'"):
        load_worker_runs(tmp_path, 2)


def _previous(folder):
    """The earlier invocations as a resuming eval reads them (the invocation log, rows on disk credited)."""
    from noulengine.eval.run_state import InvocationLog
    from noulengine.eval.runner import read_predictions

    rows = len(read_predictions(folder / "predictions.jsonl", repair=False))
    return InvocationLog(folder / "run.json", {}, {"git_revision": "now"}, rows_on_disk=rows).previous


@pytest.mark.parametrize("on_disk, advice", [
    (["0123abc"], "git worktree add --detach DIR 0123abc"),
    (["0123abc", "4567def"], "refuses this worker already"),
    (["0123abc-dirty-aaaaaaaaaaaa"], "cannot be checked out again"),
    ([None], "cannot be checked out again"),
])
def test_the_revision_warning_gives_advice_that_works(tmp_path, capsys, on_disk, advice):
    from noulengine.eval.__main__ import _warn_revision_change

    invocations = [{"git_revision": g, "status": "finished", "throughput": {"requests": 1}} for g in on_disk]
    (tmp_path / "run.json").write_text(json.dumps({"status": "finished", "invocations": invocations}))
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps({"suite": "s", "row": i}) + "\n"
                                                        for i in range(len(on_disk))))
    _warn_revision_change(1, "fffffff", _previous(tmp_path))
    err = capsys.readouterr().err
    assert "worker 1's rows on disk were predicted under" in err and advice in err
    if len(on_disk) > 1 or "dirty" in str(on_disk[0]) or on_disk[0] is None:
        assert "worktree" not in err


def test_the_revision_warning_counts_a_killed_invocations_rows(tmp_path, capsys):
    from noulengine.eval.__main__ import _warn_revision_change

    # run.json is written as an invocation starts (0 requests); a kill after its first batch leaves rows on disk
    invocations = [{"git_revision": "X", "status": "finished", "throughput": {"requests": 2}},
                   {"git_revision": "Y", "status": "running", "throughput": {"requests": 0}}]
    (tmp_path / "run.json").write_text(json.dumps({"status": "running", "invocations": invocations}))
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps({"suite": "s", "row": i}) + "\n" for i in range(5)))
    _warn_revision_change(0, "X", _previous(tmp_path))
    assert "refuses this worker already" in capsys.readouterr().err  # X and Y both predicted rows
