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
        ref = torch.softmax(reference_view_logprobs(model, compiled, plan)[0], 0)
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
