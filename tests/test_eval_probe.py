"""The reversed-order probe (issue #25, item 5): every choice question asked again with its options
reversed, as extra requests of the same batches; the share of changed answers per suite beside the
rotation flip rate, in metrics.json, report.md and the terminal summary; resumable; in the run key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from noulengine import Engine
from noulengine.eval.probe import change_summary, decide_with_probe, record_items, reversed_request
from noulengine.records.schema import parse_record, request_from_json
from tests.conftest import SHARED_DATA, biased_head_engine, topic_request

STATES = ["Stocks fell sharply.", "The team won the cup.", "A new chip was announced.", "Talks resumed in Geneva."]

needs_data = pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.csv").is_file(), reason="shared data not present")


@pytest.fixture(scope="module")
def slot_engine(tiny_llama, tiny_tokenizer):
    """Always answers the first option (the symbol A), whatever it is."""
    return biased_head_engine(tiny_llama, tiny_tokenizer, readout="symbols", label="world")


@pytest.fixture(scope="module")
def content_engine(tiny_llama, tiny_tokenizer):
    """Always answers the option labelled 'world', wherever it stands."""
    return biased_head_engine(tiny_llama, tiny_tokenizer, readout="label-sequence", label="world")


def test_reversed_request_reverses_choice_options_only():
    req = request_from_json(topic_request("s", risk={"type": "score", "instructions": "Risk?",
                                                      "criteria": ["low", "high"]},
                                           flag={"type": "noul", "instructions": "Flag?"}))
    rev = reversed_request(req)
    assert [q.field for q in rev.questions] == ["topic"]  # score and noul questions have no option order
    (q,) = rev.questions
    assert q.labels == ("sci_tech", "business", "sports", "world")
    assert q.descriptions == ("Science.", "Business.", "Sports.", "World news.")  # each label keeps its meaning
    assert rev.state == req.state and rev.id == req.id
    only_score = request_from_json({"state": "s", "questions": {"r": {"type": "score", "instructions": "?",
                                                                      "criteria": ["a", "b"]}}})
    assert reversed_request(only_score) is None


def _pairs(rows, requests):
    recs = [parse_record({**r, "id": f"r{i}", "targets": {"topic": {"label": "world"}}}) for i, r in enumerate(requests)]
    return list(record_items(zip(recs, rows)))


def test_a_slot_reader_changes_every_answer(slot_engine):
    requests = [topic_request(s) for s in STATES]
    rows = decide_with_probe(slot_engine, [request_from_json(r) for r in requests], "reverse")
    assert all(r["answers"]["topic"]["label"] == "world" for r in rows)  # slot 0 in order
    assert all(r["probe"]["reverse"]["answers"]["topic"]["label"] == "sci_tech" for r in rows)  # slot 0 reversed
    s = change_summary(_pairs(rows, requests))
    assert s["items"] == 4 and s["changed"] == 4 and s["change_share"] == 1.0
    assert s["accuracy_in_order"] == 1.0 and s["accuracy_reversed"] == 0.0


def test_a_content_reader_changes_none(content_engine):
    requests = [topic_request(s) for s in STATES]
    rows = decide_with_probe(content_engine, [request_from_json(r) for r in requests], "reverse")
    assert all(r["answers"]["topic"]["label"] == r["probe"]["reverse"]["answers"]["topic"]["label"] == "world"
               for r in rows)
    assert change_summary(_pairs(rows, requests))["change_share"] == 0.0


def test_two_options_under_rotation_debiasing_are_order_invariant(tiny_llama, tiny_tokenizer):
    """With --debias permute a two-option question is averaged over both orders, so reversing it
    changes nothing: a reference known to be invariant, on the plain tiny model."""
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, readout="symbols", debias="permute")
    requests = [topic_request(s, criteria={"world": "World news.", "sports": "Sports."}) for s in STATES * 2]
    rows = decide_with_probe(engine, [request_from_json(r) for r in requests], "reverse")
    s = change_summary(_pairs(rows, requests))
    assert s["items"] == 8 and s["change_share"] == 0.0


def test_probe_requests_ride_in_the_same_batches(slot_engine, monkeypatch):
    calls = []
    real = slot_engine.decide_batch
    monkeypatch.setattr(slot_engine, "decide_batch", lambda reqs, **kw: calls.append(len(reqs)) or real(reqs, **kw))
    decide_with_probe(slot_engine, [request_from_json(topic_request(s)) for s in STATES], "reverse")
    assert calls == [8]  # one call: the 4 rows and their 4 reversed requests


def test_rows_without_the_probe_are_counted_apart():
    rec = parse_record({**topic_request("s"), "id": "r0", "targets": {"topic": {"label": "world"}}})
    row = {"answers": {"topic": {"label": "world"}}, "error": None}
    s = change_summary(record_items([(rec, row), (rec, {**row, "probe": {"reverse": {"answers": {}, "error": {"m": "x"}}}})]))
    assert s["items"] == 0 and s["missing"] == 1 and s["errors"] == 1 and s["change_share"] is None


@needs_data
def test_eval_reports_the_change_share_and_resumes_with_the_probe(slot_engine, tmp_path):
    from noulengine.eval.report import write_outputs
    from noulengine.eval.runner import EvalConfig, run_eval

    cfg = EvalConfig(tasks=["agnews", "typed_decisions"], limit=4, output=str(tmp_path), progress=False, plots=False,
                     probe="reverse", chunk=3)
    results = run_eval(slot_engine, cfg)
    agnews = next(r for r in results if r.name == "agnews")
    assert agnews.metrics["order_probe"]["items"] == 4 and agnews.metrics["reversal_change_share"] == 1.0
    pred = tmp_path / "predictions.jsonl"
    rows = [json.loads(x) for x in pred.read_text().splitlines()]
    assert len(rows) == 8 and all("reverse" in r["probe"] for r in rows)

    # killed mid-write: two rows gone and a torn line; the resumed run re-runs them with their probes
    text = pred.read_text().splitlines(keepends=True)
    pred.write_text("".join(text[:-3]) + text[-3][:40])
    again = run_eval(slot_engine, cfg)
    rows2 = [json.loads(x) for x in pred.read_text().splitlines()]
    assert len({(r["suite"], r["row"]) for r in rows2}) == len(rows2) == 8
    assert all("reverse" in r["probe"] for r in rows2) and sum(r.new_predictions for r in again) == 3
    for a, b in zip(results, again):
        assert a.metrics["order_probe"] == b.metrics["order_probe"]

    meta = {"suite": "accuracy-v1", "engine": slot_engine.describe(), "selection": {"limit": 4}, "git_revision": None,
            "probe": "reverse"}
    metrics = write_outputs(again, tmp_path, meta)
    assert metrics["agnews"]["metrics"]["reversal_change_share"] == 1.0
    report = (tmp_path / "report.md").read_text()
    assert "| flip rate | reversal changed |" in report and "Probe: `reverse`" in report
    assert "Option order (`--probe reverse`): 4 of 4 choice decisions changed their answer" in report


@needs_data
def test_eval_command_keys_the_probe_and_prints_it(content_engine, tmp_path, monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: content_engine)
    argv = ["--tasks", "agnews", "--limit", "3", "--no-progress", "--no-plots"]
    plain, probed = tmp_path / "plain", tmp_path / "probed"
    assert main(argv + ["--output", str(plain)]) == 0
    assert "reversal changed" not in capsys.readouterr().out
    # a folder made without the probe is refused for a probe run, and the other way round
    assert main(argv + ["--output", str(plain), "--probe", "reverse"]) == 2
    assert "probe: the folder's run has None, this one 'reverse'" in capsys.readouterr().err
    assert main(argv + ["--output", str(probed), "--probe", "reverse"]) == 0
    out = capsys.readouterr().out
    header, agnews = out.splitlines()[0], out.splitlines()[1]
    assert "reversal changed" in header and agnews.split()[-1] == "0.000"  # the content reader never moves
    assert json.loads((probed / "run_key.json").read_text())["probe"] == "reverse"
    assert json.loads((probed / "run.json").read_text())["probe"] == "reverse"
    assert json.loads((probed / "metrics.json").read_text())["agnews"]["metrics"]["order_probe"]["items"] == 3
    assert main(argv + ["--output", str(probed)]) == 2
    assert "probe: the folder's run has 'reverse', this one None" in capsys.readouterr().err


def test_ray_rows_wait_for_their_probe_whatever_order_batches_land(slot_engine, monkeypatch):
    """On Ray the probe requests join the same Dataset; a row is written only once its own
    decision and its probe's have both landed (here in a scrambled completion order)."""
    import noulengine.distributed.ray_data as ray_data
    from noulengine.eval.runner import EvalConfig, _predictions

    recs = [parse_record({**topic_request(s), "id": f"r{i}"}) for i, s in enumerate(STATES)]
    recs.append(parse_record({"id": "score-only", "state": "s", "questions": {
        "r": {"type": "score", "instructions": "?", "criteria": ["a", "b"]}}}))
    todo = list(enumerate(recs))

    def fake_iter(requests, config):
        answers = [d.to_dict() for d in slot_engine.decide_batch(requests)]
        assert len(requests) == 9  # 5 rows, 4 of them with a choice question to reverse
        for i in (8, 0, 4, 7, 1, 2, 6, 5, 3):
            yield i, answers[i]

    monkeypatch.setattr(ray_data, "iter_decisions", fake_iter)
    parts = list(_predictions(None, todo, EvalConfig(ray=object(), probe="reverse", chunk=2)))
    got = {item[0]: row for part in parts for item, row in part}
    assert sorted(got) == [0, 1, 2, 3, 4] and [len(p) for p in parts] == [2, 2, 1]
    for i in range(4):
        assert got[i]["answers"]["topic"]["label"] == "world"
        assert got[i]["probe"]["reverse"]["answers"]["topic"]["label"] == "sci_tech"
    assert got[4]["probe"] == {"reverse": {"answers": {}, "error": None}}


@needs_data
def test_probe_workers_merge_into_the_single_runs_change_share(slot_engine, tmp_path, monkeypatch, capsys):
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: slot_engine)
    argv = ["--tasks", "agnews,typed_decisions", "--limit", "5", "--probe", "reverse", "--no-progress", "--no-plots"]
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert main(argv + ["--output", str(single)]) == 0
    for r in range(2):
        assert main(argv + ["--output", str(sharded), "--worker", str(r), "--workers", "2"]) == 0
    assert main(["--merge", "--workers", "2", "--output", str(sharded), "--no-plots"]) == 0
    a = json.loads((single / "metrics.json").read_text())
    b = json.loads((sharded / "metrics.json").read_text())
    for suite in ("agnews", "typed_decisions"):
        assert a[suite]["metrics"]["order_probe"] == b[suite]["metrics"]["order_probe"]
    assert b["agnews"]["metrics"]["reversal_change_share"] == 1.0
    assert json.loads((sharded / "run_key.json").read_text())["probe"] == "reverse"
    assert json.loads((sharded / "run.json").read_text())["probe"] == "reverse"


@needs_data
def test_order_sensitivity_script_wraps_two_eval_runs(tiny_llama, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    """experiments/order_sensitivity.py: eval --probe reverse and eval --debias permute on one sample,
    their order numbers side by side (and the run folders kept with --run-dir)."""
    import importlib.util

    from noulengine import cli
    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("order_sensitivity", REPO / "experiments" / "order_sensitivity.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(cli, "engine_from_args", lambda args, **_: Engine.from_model(
        tiny_llama, tiny_tokenizer, readout="symbols", debias=args.debias))
    out = tmp_path / "order.json"
    assert script.main(["--suites", "agnews,jevbench_easy", "--sample", "3", "--run-dir", str(tmp_path / "runs"),
                        "--output", str(out)]) == 0
    got = json.loads(out.read_text())["suites"]
    assert set(got) == {"agnews", "jevbench_easy"} and got["agnews"]["choice_decisions"] == 3
    assert got["agnews"]["reversal_change_share"] is not None and got["agnews"]["rotation_flip_rate"] is not None
    key = json.loads((tmp_path / "runs" / "in-order" / "run_key.json").read_text())
    assert key["probe"] == "reverse" and key["debias"] == "none"
    assert json.loads((tmp_path / "runs" / "permute" / "run_key.json").read_text())["debias"] == "permute"
    assert "| suite | choice decisions | accuracy in order | reversed | changed by reversal |" in capsys.readouterr().out


def test_the_probe_is_compared_in_every_run_key_old_or_new():
    from noulengine.eval.run_state import key_differences, run_key

    describe = {"model": {"sha256": "m"}, "readout": "symbols", "debias": "none", "dtype": "float32"}
    plain = run_key(describe, suite="accuracy-v1", limit=3, sample=None, seed=0)
    probed = run_key(describe, suite="accuracy-v1", limit=3, sample=None, seed=0, probe="reverse")
    before = {k: v for k, v in plain.items() if k != "probe"}  # a key written before the probe existed
    legacy = {k: plain[k] for k in ("suite", "model_sha256", "debias", "dtype", "limit", "sample", "seed")}
    legacy.update(readout="auto", calibration=None)  # a key written before settings were resolved
    for old in (plain, before, legacy):
        assert key_differences(old, probed, given={"readout": "auto", "calibration": None}) == [
            "probe: the folder's run has None, this one 'reverse'"]
    assert key_differences(before, plain) == []


@needs_data
def test_compare_scores_models_on_the_rows_all_answered_with_their_reversal(slot_engine, content_engine, tmp_path):
    """`noulengine compare` (which replaced scripts/same_rows.py): two models' eval runs, one partial,
    are compared on the rows both answered, scored by `noulengine score`'s scorer, with each
    model's reversal change share (the slot engine answers by position: every reversal changes it;
    the content engine: none)."""
    from noulengine.eval.compare import CompareError, compare_runs, load_run, parse_run
    from noulengine.eval.runner import EvalConfig, run_eval
    from noulengine.eval.score import score_file

    for name, engine, limit in (("slot", slot_engine, 4), ("content", content_engine, 3)):
        cfg = EvalConfig(tasks=["agnews"], limit=limit, output=str(tmp_path / name), progress=False, plots=False,
                         probe="reverse")
        run_eval(engine, cfg)
    runs = [load_run(*parse_run(str(tmp_path / n))) for n in ("slot", "content")]
    res = compare_runs(runs, n_resamples=500)
    e = res["suites"]["agnews"]
    assert e["records"] == 3 and e["rows_per_run"] == {"slot": 4, "content": 3}  # the fourth row has no partner
    assert e["runs"]["slot"]["reversal_change_share"] == 1.0 and e["runs"]["content"]["reversal_change_share"] == 0.0
    cut = tmp_path / "slot3.jsonl"
    cut.write_text("".join((tmp_path / "slot" / "predictions.jsonl").read_text().splitlines(keepends=True)[:3]))
    assert e["runs"]["slot"]["accuracy"] == score_file("agnews", cut)["accuracy"]
    with pytest.raises(CompareError, match="predicted twice"):
        load_run("twice", [tmp_path / "slot" / "predictions.jsonl"] * 2)
