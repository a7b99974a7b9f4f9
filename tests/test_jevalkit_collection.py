"""The jevalkit-v1 collection: every family in one run from a data root holding zh-decision-bench and the
hand-written local copies; without the copies the other families are reported unavailable with the
download they need (never a crash); --sample and noulengine score work on the families too."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from noulengine.eval.suites import default_tasks, expand_tasks, get_suite
from tests.conftest import SHARED_DATA
from tests.jevalkit_helpers import FIXTURES, bench, read_rows  # noqa: F401 (bench: a fixture)

FAMILIES = ["zh-decision-bench", "decisionbench", "jevalt-bench", "procedural-typed-decisions", "decision-index",
            "visual-decision-bench"]
LOCAL = FAMILIES[1:]
needs_zh = pytest.mark.skipif(not (SHARED_DATA / "zh_decision_bench" / "voice_routing.jsonl").is_file(),
                              reason="shared zh data not present")


@pytest.fixture
def data_root(tmp_path):
    """A --source DIR with the shared zh files and every family's hand-written local copy."""
    root = tmp_path / "data"
    shutil.copytree(FIXTURES, root)
    os.symlink(SHARED_DATA / "zh_decision_bench", root / "zh_decision_bench")
    return root


def test_the_collection_lists_every_family():
    assert default_tasks("jevalkit-v1") == FAMILIES == expand_tasks(None, collection="jevalkit-v1")
    assert expand_tasks(["jevalkit-v1"]) == FAMILIES  # a collection named as a task (the suites CLI)
    for name in LOCAL:
        suite = get_suite(name)
        assert suite.local_copy and suite.manifest.get("download") and suite.version == "jevalkit-v1"
    assert not get_suite("zh-decision-bench").local_copy


@needs_zh
def test_every_family_runs_then_reports_unavailable_without_its_copy(bench, data_root, tiny_llama, tiny_tokenizer,
                                                                     tmp_path):
    from noulengine import Engine
    from noulengine.eval.report import write_outputs
    from noulengine.eval.runner import EvalConfig, run_eval

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    results = run_eval(engine, EvalConfig(suite="jevalkit-v1", limit=2, output=str(tmp_path / "all"),
                                          source=str(data_root), progress=False, plots=False))
    assert [r.name for r in results] == FAMILIES and all(r.status == "ready" for r in results)
    assert all(r.metrics["reference"]["family"] == r.name for r in results)
    write_outputs(results, tmp_path / "all", {"suite": "jevalkit-v1", "engine": engine.describe()})

    empty = tmp_path / "empty"
    empty.mkdir()
    results = run_eval(engine, EvalConfig(suite="jevalkit-v1", limit=2, output=str(tmp_path / "none"),
                                          source=str(empty), progress=False, plots=False))
    status = {r.name: r for r in results}
    assert status["zh-decision-bench"].status == "ready"  # prepared and pinned by the first run
    for name in LOCAL:  # an earlier copy is never reused without its source
        assert status[name].status == "unavailable" and status[name].metrics is None
        assert "source data absent" in status[name].reason and "then pass --source DIR" in status[name].reason
    metrics = write_outputs(results, tmp_path / "none", {"suite": "jevalkit-v1", "engine": engine.describe()})
    assert metrics["decisionbench"]["status"] == "unavailable"
    assert "decisionbench/eval.jsonl" in metrics["decisionbench"]["reason"]
    report = (tmp_path / "none" / "report.md").read_text(encoding="utf-8")
    assert "| decisionbench | unavailable |" in report and "Reason: source data absent" in report


def test_sample_and_score_on_a_family(bench, tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine
    from noulengine.eval.runner import EvalConfig, run_eval
    from noulengine.eval.score import score_file

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    [res] = run_eval(engine, EvalConfig(suite="decisionbench", sample=3, seed=1, output=str(tmp_path / "run"),
                                        source=str(FIXTURES), progress=False, plots=False))
    assert res.rows == 3
    report = score_file("decisionbench", tmp_path / "run" / "predictions.jsonl", sample=3, seed=1, source=str(FIXTURES))
    assert report["accuracy"] == res.metrics["accuracy"]
    assert report["reference"] == res.metrics["reference"]
    collection = score_file("jevalkit-v1", tmp_path / "run" / "predictions.jsonl", sample=3, seed=1,
                            source=str(FIXTURES))
    assert collection["suites"]["decisionbench"]["reference"]["rules"]["nll_floor"] == 1e-15
    assert collection["suites"]["jevalt-bench"]["status"] == "not predicted"


def test_run_json_records_the_local_copys_sha256(bench, tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine.eval.suites import sha256_file

    suite = get_suite("jevalt-bench")
    assert suite.prepared_pins() == {}  # nothing copied yet
    suite.load(source=FIXTURES)
    pins = suite.prepared_pins()
    assert pins == {f"{lang}/test.jsonl": sha256_file(FIXTURES / "jevalt-bench" / lang / "test.jsonl")
                    for lang in ("en", "tr", "de")}
    assert json.dumps(pins)  # what eval writes into run.json's suite_sha256


@needs_zh
def test_sharded_run_merges_to_the_single_run(bench, data_root, tiny_llama, tiny_tokenizer, monkeypatch, tmp_path,
                                              capsys):
    """Two workers over three families (pinned and local copies), merged with --source: the same
    predictions and metrics, reference blocks included, as one run."""
    from noulengine import Engine, cli
    from noulengine.eval.__main__ import main

    engine = Engine.from_model(tiny_llama, tiny_tokenizer, max_batch_size=1)
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: engine)
    common = ["--suite", "jevalkit-v1", "--tasks", "zh-decision-bench,decisionbench,jevalt-bench", "--limit", "4",
              "--source", str(data_root), "--no-progress", "--no-plots"]
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert main(common + ["--output", str(single)]) == 0
    for r in range(2):
        assert main(common + ["--output", str(sharded), "--worker", str(r), "--workers", "2"]) == 0
    assert main(["--merge", "--workers", "2", "--output", str(sharded), "--source", str(data_root), "--no-plots"]) == 0
    a = json.loads((single / "metrics.json").read_text(encoding="utf-8"))
    b = json.loads((sharded / "metrics.json").read_text(encoding="utf-8"))
    for name in ("zh-decision-bench", "decisionbench", "jevalt-bench"):
        ma, mb = a[name]["metrics"], b[name]["metrics"]
        assert ma["counts"] == mb["counts"] and ma["reference"]["accuracy"] == mb["reference"]["accuracy"]
        assert ma["reference"]["ece"] == pytest.approx(mb["reference"]["ece"], abs=1e-9)
    run = json.loads((sharded / "run.json").read_text(encoding="utf-8"))
    assert set(run["suite_sha256"]["decisionbench"]) == {"eval.jsonl"}
