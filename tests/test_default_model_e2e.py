"""End to end on the real embedded default model (SmolLM2-135M-Instruct) and real records."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import SHARED_DATA, three_question_request
from tests.test_engine_equivalence import reference_view_logprobs

pytestmark = pytest.mark.default_model


def _first_lines(path, n):
    with open(path, encoding="utf-8") as fh:
        return [next(fh) for _ in range(n)]


def test_three_question_request_in_one_pass_matches_separate_runs(default_engine):
    req = three_question_request()
    compiled = default_engine.compile(req)
    decision = default_engine.decide(req)
    assert set(decision.answers) == {"topic", "risk", "flag"}
    assert decision.input_tokens == compiled.input_tokens > compiled.max_position
    model = default_engine.runner.model
    for plan in compiled.questions:
        ans = decision.answers[plan.field]
        # the default ships fitted temperatures: probabilities are softmax(log-probs / T)
        ref = torch.softmax(reference_view_logprobs(model, compiled, plan)[0] / ans.temperature, 0)
        got = torch.tensor([ans.probabilities[lab] for lab in plan.labels], dtype=torch.float64)
        assert torch.allclose(got, ref, atol=1e-4)
        assert abs(sum(ans.probabilities.values()) - 1) < 1e-9 and 0 < ans.x_mass <= 1
    assert 0 <= decision.answers["risk"].value <= 2
    assert decision.answers["flag"].value == decision.answers["flag"].probabilities["yes"]
    assert decision.latency_s > 0


@pytest.mark.skipif(not (SHARED_DATA / "agnews" / "test.jsonl").is_file(), reason="shared data not present")
def test_cli_decide_on_real_agnews_and_wildjailbreak_records(tmp_path):
    lines = _first_lines(SHARED_DATA / "agnews" / "test.jsonl", 2)
    lines += _first_lines(SHARED_DATA / "wildjailbreak" / "test.local_ids.jsonl", 2)
    lines.insert(2, '{"id": "broken", "state": "x", "questions": {"q": {"type": "nope", "instructions": "?"}}}\n')
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(lines), encoding="utf-8")
    out = tmp_path / "answers.jsonl"
    proc = subprocess.run([sys.executable, "-m", "noulengine.cli", "decide", "--input", str(src), "--output", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr  # one error row
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[2]["error"]["record_id"] == "broken" and "unknown type" in rows[2]["error"]["message"]
    for r in rows[:2] + rows[3:]:
        ans = r["answers"]["decision"]
        assert r["error"] is None and abs(sum(ans["probabilities"].values()) - 1) < 1e-6
        assert ans["label"] in ans["labels"]
    assert set(rows[0]["answers"]["decision"]["labels"]) == {"world", "sports", "business", "sci_tech"}
    assert rows[3]["answers"]["decision"]["labels"] == ["harmful", "benign"]


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "agnews_train").is_dir(), reason="shared data not present")
def test_train_the_real_base_model_for_a_few_steps_on_real_rows(tmp_path):
    """`noulengine train` on the real embedded base with real AG News train rows: runs, records
    what it did, and its output folder loads and answers with the readout it was trained with."""
    import csv

    from noulengine import Engine
    from noulengine.eval.suites import get_suite

    module = get_suite("agnews").module
    rows = []
    with (SHARED_DATA / "agnews_train" / "vicrudakov_agnews_train_4000_indexed.csv").open(encoding="utf-8") as fh:
        for idx, text, label in csv.reader(fh):
            if idx.isdigit() and label in module.CRITERIA and len(rows) < 6:
                rows.append(module.make_record(f"e2e-train-{idx}", text, label))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "model"
    proc = subprocess.run([sys.executable, "-m", "noulengine", "train", "--data", str(data), "--output", str(out),
                           "--lora-layers", "2", "--lora-r", "4", "--max-steps", "2", "--max-batch-size", "3",
                           "--progress", "false"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = json.loads((out / "training.json").read_text())
    assert t["steps"] == 2 and t["base_model"]["name"] == "SmolLM2-135M-Instruct"
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in t["loss_curve"])
    assert t["evaluation_overlap_check"]["suites"]["agnews"]["rows"] == 7600
    engine = Engine.from_pretrained(str(out))
    assert engine.config.readout == "symbols" and engine.identity.sha256 != t["base_model"]["sha256"]
    ans = engine.decide(rows[0]).answers["decision"]
    assert abs(sum(ans.probabilities.values()) - 1) < 1e-9 and ans.readout == "symbols"


def test_default_is_the_trained_decision_model_and_the_base_stays_reachable(default_engine):
    from noulengine import Engine
    from noulengine.models.loading import DEFAULT_ADAPTER_DIR, sha256_file

    if not (DEFAULT_ADAPTER_DIR / "training.json").is_file():
        pytest.skip("no trained default adapter installed")
    t = json.loads((DEFAULT_ADAPTER_DIR / "training.json").read_text())
    assert default_engine.identity.name == t["name"] and default_engine.config.readout == t["readout"] == "auto"
    assert default_engine.calibration is not None  # temperatures fitted on validation-v1 calibration rows
    from noulengine.models.loading import DEFAULT_ADAPTER_SHA256, default_base

    assert t["base_model"]["sha256"] == default_base().sha256  # trained on the pinned base GGUF
    assert t["base_model"]["spec"] == default_base().name  # named, so it loads on any machine
    assert sha256_file(DEFAULT_ADAPTER_DIR / "adapter_model.safetensors") == DEFAULT_ADAPTER_SHA256
    # trained with portable CPU numerics at 2 threads, so `scripts/train_default.py` rebuilds these
    # bytes on another CPU (issue #33; measured on a second machine: docs/training.md, CPU numerics)
    assert t["numerics"]["mode"] == "portable" and t["numerics"]["threads"] == 2
    assert len(t["data"]["train"]["sha256"]) == 64 and t["layout"] == "state-first"
    base = Engine.from_pretrained("SmolLM2-135M-Instruct")
    assert base.training is None and base.calibration is None and base.config.readout == "auto"
    assert base.identity.sha256 == t["base_model"]["sha256"] != default_engine.identity.sha256
    from noulengine.models.loading import DEFAULT_DECISION_MODEL

    # the default by its shipped name: the same model (and so the same calibration file and run keys)
    named = Engine.from_pretrained(DEFAULT_DECISION_MODEL)
    assert named.identity.sha256 == default_engine.identity.sha256 and named.identity.name == DEFAULT_DECISION_MODEL
    assert named.calibration is not None


# The README's Python example and the tickets issue #22 names, with the README's own questions.
README_QUESTIONS = {
    "route": {"type": "choice", "instructions": "Which team handles this?",
              "criteria": {"billing": "Payments and refunds", "shipping": "Delivery problems",
                           "tech": "Website or app errors"}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]},
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
}
README_TICKETS = [  # (ticket, expected route, expected refund)
    ("My card was charged twice for order 4471.", "billing", None),
    ("My parcel has not arrived after two weeks, where is it?", "shipping", "no"),
    ("The app crashes with error 500 when I open my orders page.", "tech", "no"),
    ("I returned the shoes last week, please send my money back.", "billing", "yes"),
]


def _reverse_options(questions: dict) -> dict:
    out = json.loads(json.dumps(questions))
    out["route"]["criteria"] = dict(reversed(list(out["route"]["criteria"].items())))
    return out


# The app-crash ticket is a measured miss of the v2 default (issue #22): in criteria order it is
# routed to billing (p 0.47; reversed: tech 0.47) and refund reads yes (p 0.56; experiments/readme_tickets.py
# --model default, session 21, the portable build as the first build). Strict:
# a model that fixes it turns this xfail into a failure, so the marker is removed with the fix.
_MISSES = {"The app crashes with error 500 when I open my orders page."}


@pytest.mark.parametrize("ticket,route,refund", [
    pytest.param(*t, marks=pytest.mark.xfail(strict=True, reason="measured miss of the v2 default, see above"))
    if t[0] in _MISSES else t for t in README_TICKETS])
def test_readme_example_and_tickets_are_decided_by_content(default_engine, ticket, route, refund):
    """The default routes each ticket to the team its text implies, in either option order (a
    model answering by option position fails the reversed order)."""
    for questions in (README_QUESTIONS, _reverse_options(README_QUESTIONS)):
        d = default_engine.decide({"state": {"ticket": ticket}, "questions": questions})
        assert d.error is None, d.error
        assert d.answers["route"].label == route, (ticket, d.answers["route"].probabilities)
        if refund is not None:
            assert d.answers["refund"].label == refund, (ticket, d.answers["refund"].probabilities)


def test_readme_tickets_script_reports_what_the_engine_decides(default_engine, capsys):
    """experiments/readme_tickets.py (how a candidate default is checked on these tickets) counts the
    same route answers as the default engine gives here, in both orders (its report on this
    session's engine: no second load of the model)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "readme_tickets.py"
    spec = importlib.util.spec_from_file_location("readme_tickets", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.report(default_engine, "default")
    out = capsys.readouterr().out.splitlines()
    want = sum(default_engine.decide({"state": {"ticket": t}, "questions": q}).answers["route"].label == route
               for t, route, _ in README_TICKETS for q in (README_QUESTIONS, _reverse_options(README_QUESTIONS)))
    assert len([line for line in out if line.startswith("default |")]) == 2 * len(README_TICKETS)
    assert out[-1].startswith(f"default: routes {want}/{2 * len(README_TICKETS)}, refund ")
