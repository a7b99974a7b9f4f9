"""The evaluation runner on a tiny model: predictions, resume without loss or duplicates, outputs."""

from __future__ import annotations

import json

import pytest

from noulengine import Engine
from noulengine.eval.report import write_outputs
from noulengine.eval.runner import EvalConfig, run_eval
from noulengine.eval.score import score_file
from tests.conftest import SHARED_DATA

pytestmark = pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.csv").is_file(), reason="shared data not present")


def _run(engine, out, **kw):
    cfg = EvalConfig(tasks=["agnews", "typed_decisions", "jevbench_easy"], limit=3, output=str(out), progress=False, **kw)
    return run_eval(engine, cfg)


def test_run_resume_and_outputs(tiny_llama, tiny_tokenizer, tmp_path):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    results = _run(engine, tmp_path)
    pred = tmp_path / "predictions.jsonl"
    rows = [json.loads(x) for x in pred.read_text().splitlines()]
    assert len(rows) == 9 and {r["suite"] for r in rows} == {"agnews", "typed_decisions", "jevbench_easy"}
    typed = next(r for r in results if r.name == "typed_decisions")
    assert typed.metrics["counts"]["decisions"] == 15  # decision level: 3 rows x 5 fields
    assert typed.metrics["distribution"]["status"] != "unavailable"  # soft gold present
    easy = next(r for r in results if r.name == "jevbench_easy")
    assert easy.metrics["distribution"]["tvd"] is None  # no gold_probs: unavailable, not zero

    # Simulate a run killed mid-write: drop two rows and leave a torn line.
    text = pred.read_text().splitlines(keepends=True)
    pred.write_text("".join(text[:-2]) + text[-2][:25])
    again = _run(engine, tmp_path)
    rows2 = [json.loads(x) for x in pred.read_text().splitlines()]
    keys = [(r["suite"], r["row"]) for r in rows2]
    assert len(keys) == len(set(keys)) == 9
    assert sum(r.new_predictions for r in again) == 2
    # throughput covers only the two re-run rows (jevbench_easy, one decision each), not resumed ones
    assert sum(r.new_decisions for r in again) == 2 and sum(len(r.latencies) for r in again) == 2
    for a, b in zip(results, again):
        assert a.metrics["accuracy"] == b.metrics["accuracy"]

    meta = {"suite": "accuracy-v1", "engine": engine.describe(), "selection": {"limit": 3}, "git_revision": None}
    write_outputs(again, tmp_path, meta)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert set(metrics) == {"agnews", "typed_decisions", "jevbench_easy"}
    report = (tmp_path / "report.md").read_text()
    assert "| agnews | ready | 3 |" in report
    assert (tmp_path / "reliability_agnews.png").stat().st_size > 1000
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["throughput"]["requests"] == 2

    # `noulengine score --count-missing` on the same predictions: rows not predicted count as errors.
    scored = score_file("agnews", pred, count_missing=True)
    assert scored["predictions_matched"] == 3
    assert scored["counts"]["scored"] == 3 and scored["counts"]["errors"] == scored["counts"]["decisions"] - 3
    assert scored["counts"]["error_kinds"] == {"missing_prediction": scored["counts"]["decisions"] - 3}


def test_invalid_external_answers_count_as_errors(tmp_path):
    bad = [{"row": 0, "answers": {"decision": {"probabilities": {"world": 0.7, "sports": 0.7, "business": 0,
                                                                 "sci_tech": 0}}}},
           {"row": 1, "answers": {"decision": {"probabilities": {"world": float("nan")}}}},
           {"row": 2, "answers": {"decision": {"probabilities": {"world": 0.1, "sports": 0.1, "business": 0.1,
                                                                 "sci_tech": 0.7}}}}]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in bad).replace("NaN", "0.5") + "\n")
    report = score_file("agnews", path)
    assert report["counts"]["scored"] == 1
    assert report["counts"]["error_kinds"]["invalid_answer"] == 2


def test_score_reports_every_bad_prediction_line(tmp_path):
    ok = {"row": 0, "answers": {"decision": {"probabilities": {"world": 0.7, "sports": 0.1, "business": 0.1,
                                                                "sci_tech": 0.1}}}}
    lines = [json.dumps(ok).encode(), b"\xff\xfe", json.dumps(ok).encode(), b"[1, 2]",
             json.dumps({"row": 10**6, "answers": {}}).encode(),
             json.dumps({"row": 3, "answers": {"topic": {"probabilities": {"world": 1.0}}}}).encode(),
             json.dumps({"id": ["x"], "answers": {}}).encode(), json.dumps({"row": 4, "response": "oops"}).encode(),
             json.dumps({"row": 5, "answers": [{"decision": 1}]}).encode()]
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError) as info:
        score_file("agnews", path)
    msg = str(info.value)
    assert msg.startswith("8 bad prediction line(s)")
    for words in (":2: not UTF-8", ":3: row 0 predicted twice", ":4: expected a JSON object",
                  ":5: suite 'agnews' has no row 1000000", ":6: answers name field(s) ['topic']",
                  ":7: give 'row' (an integer) or 'id' (a string)", ":8: field 'response' must be an object",
                  ":9: field 'answers' must be an object"):
        assert words in msg, words


def test_eval_without_matplotlib_fails_before_the_model_loads(monkeypatch, capsys):
    import importlib.util

    from noulengine import cli
    from noulengine.eval.__main__ import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: pytest.fail("the model must not load"))
    assert main(["--tasks", "agnews", "--limit", "1", "--output", "unused"]) == 2
    err = capsys.readouterr().err
    assert "need matplotlib" in err and "noulengine[plots]" in err and "--no-plots" in err


def test_no_plots_scores_without_drawing(tiny_llama, tiny_tokenizer, tmp_path):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    results = run_eval(engine, EvalConfig(tasks=["agnews"], limit=2, output=str(tmp_path), progress=False, plots=False))
    assert results[0].metrics["reliability"] is None and results[0].metrics["counts"]["scored"] == 2
    assert not list(tmp_path.glob("*.png"))


def test_resumed_eval_keeps_the_first_runs_timing_and_the_report_reads_right(tiny_llama, tiny_tokenizer, tmp_path,
                                                                              monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    argv = ["--tasks", "agnews,jevbench_easy", "--limit", "4", "--output", str(tmp_path), "--no-progress", "--no-plots"]
    assert main(argv) == 0
    first = json.loads((tmp_path / "run.json").read_text())["invocations"]
    assert len(first) == 1 and first[0]["throughput"]["requests"] == 8
    assert main(argv) == 0  # everything already predicted: resumed, nothing new to run
    assert f"wrote {tmp_path}/" in capsys.readouterr().out
    run = json.loads((tmp_path / "run.json").read_text())
    assert [i["throughput"]["requests"] for i in run["invocations"]] == [8, 0]
    assert run["invocations"][0] == first[0] and run["totals"]["requests"] == 8
    report = (tmp_path / "report.md").read_text()
    assert "8 requests run in" in report and "no new requests" in report
    assert "| chance | majority |" in report and "## Glossary" in report and "x_mass" in report
    assert "{'" not in report and "`None`" not in report and "Rows: the first 4 rows of each suite" in report
    assert "| 0 | world |" in report  # AG News slots are named by their labels
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["agnews"]["metrics"]["baselines"]["chance"] == 0.25


def test_repeated_ids_are_counted_and_named():
    from noulengine.eval.runner import repeated_ids
    from noulengine.records.schema import parse_record

    q = {"q": {"type": "noul", "instructions": "x"}}
    recs = [parse_record({"id": i, "state": "s", "questions": q}) for i in ("a", "b", "a", "c", "b", "a")]
    assert repeated_ids(recs) == {"count": 2, "extra_rows": 3, "ids": ["a", "b"]}


def test_toolace_reports_its_three_repeated_ids():
    from noulengine.eval.runner import repeated_ids
    from noulengine.eval.suites import get_suite

    rows = get_suite("toolace").load(source=SHARED_DATA)
    dup = repeated_ids(rec for _, rec in rows)
    assert dup["count"] == 3 and len(rows) == 310 and dup["extra_rows"] == 3
    assert [i[:8] for i in dup["ids"]] == sorted(["f6fab49c", "a570fc8e", "ae47fa77"])


def test_a_run_folder_of_another_run_is_refused_naming_old_and_new(tiny_llama, tiny_tokenizer, tmp_path,
                                                                   monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(tiny_llama, tiny_tokenizer))
    argv = ["--tasks", "jevbench_easy", "--output", str(tmp_path), "--no-progress", "--no-plots"]
    assert main(argv + ["--limit", "1"]) == 0
    capsys.readouterr()
    assert main(argv + ["--limit", "2"]) == 2
    assert "limit: the folder's run has 1, this one 2" in capsys.readouterr().err


def test_score_a_sample_or_the_predicted_rows_only(tiny_llama, tiny_tokenizer, tmp_path, capsys):
    from noulengine.eval.score import main as score_main

    cfg = EvalConfig(tasks=["jevbench_easy"], sample=3, seed=0, output=str(tmp_path), progress=False, plots=False)
    (res,) = run_eval(Engine.from_model(tiny_llama, tiny_tokenizer), cfg)
    pred = tmp_path / "predictions.jsonl"
    same = score_file("jevbench_easy", pred, sample=3, seed=0)
    assert same["rows_selected"] == 3 and same["rows_missing"] == 0 and same["accuracy"] == res.metrics["accuracy"]
    whole = score_file("jevbench_easy", pred, count_missing=True)  # the whole suite: 45 missing rows are errors
    assert whole["rows_missing"] == 45 and whole["counts"]["errors"] == 45
    default = score_file("jevbench_easy", pred)  # by default only the predicted rows are scored, and said so
    assert default["counts"]["decisions"] == 3 and default["accuracy"] == res.metrics["accuracy"]
    assert default["notes"][0].startswith(f"jevbench_easy: {pred} has predictions for 3 of the suite's 48 rows")
    only = score_file("jevbench_easy", pred, predicted_only=True)
    assert only["counts"]["decisions"] == 3 and only["rows_missing"] == 45 and only["accuracy"] == res.metrics["accuracy"]
    assert score_main(["--suite", "jevbench_easy", "--predictions", str(pred), "--sample", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| suite | rows predicted | rows missing |") and "| jevbench_easy | 3 | 0 |" in out
    assert score_main(["--suite", "jevbench_easy", "--predictions", str(pred), "--predicted-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_missing"] == 45


def test_report_warns_when_the_model_was_trained_on_other_prompts(tmp_path):
    meta = {"suite": "accuracy-v1", "git_revision": None, "selection": {},
            "engine": {"model": {"name": "m"}, "prompt_version": "noul-prompt-2", "trained_prompt_version": "noul-prompt-1"}}
    write_outputs([], tmp_path, meta)
    report = (tmp_path / "report.md").read_text()
    assert "trained on prompts of `noul-prompt-1`, read here with `noul-prompt-2`" in report
    write_outputs([], tmp_path, {**meta, "engine": {**meta["engine"], "trained_prompt_version": "noul-prompt-2"}})
    assert "trained on prompts" not in (tmp_path / "report.md").read_text()
