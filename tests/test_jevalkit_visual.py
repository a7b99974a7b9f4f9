"""VisualDecisionBench (jevalkit-v1) from a hand-written local copy: image questions through the vision
path (a tiny random Qwen2-VL), video questions unsupported but visible in coverage, availability,
and what inference receives."""

from __future__ import annotations

import copy

import pytest

from noulengine.eval.suites import get_suite
from noulengine.eval.suites.families.visual import parse_item
from noulengine.metrics import Scorer
from noulengine.records.errors import RecordError
from tests.jevalkit_helpers import FIXTURES, bench, read_rows  # noqa: F401 (bench: a fixture)

RELEASE = FIXTURES / "visual-decision-bench"
ROWS = read_rows(RELEASE / "test.jsonl")
CONTEXT = {"source_dir": FIXTURES}


@pytest.fixture(scope="module")
def vlm():
    from noulengine import Engine
    from tests.vision_models import build

    model, processor, tokenizer = build("qwen2_vl")
    return Engine.from_model(model, tokenizer, processor=processor), tokenizer


def _rec(rid, **changes):
    item = copy.deepcopy(ROWS[rid])
    item.update(changes)
    return parse_item(item, file="test.jsonl", context=CONTEXT)


def test_image_rows_carry_their_images():
    rec = _rec("vdb-img-1")
    assert len(rec.request.images) == 1 and rec.request.images[0].mime_type == "image/png"
    assert rec.request.images[0].data == (RELEASE / "images" / "red.png").read_bytes()
    assert rec.targets["colour"].label == "red" and rec.targets["list_it"].label == "yes"
    assert _rec("vdb-img-2").targets["quality"].label == "2"  # "good" = level 2
    assert rec.metadata["modality"] == "image" and rec.metadata["protocol"]["fields"] == {}


def test_video_rows_stay_with_every_question_unsupported():
    rec = _rec("vdb-vid-1")
    assert rec.request.images == () and [q.field for q in rec.request.questions] == ["visitor", "action"]
    assert rec.metadata["modality"] == "video"
    assert set(rec.metadata["protocol"]["fields"]) == {"visitor", "action"}
    assert all("not supported" in f["unsupported"] for f in rec.metadata["protocol"]["fields"].values())


def test_video_questions_count_as_errors_in_coverage():
    """Six decisions: the four image ones answered right (0.9 each), the two video ones answered too --
    and still errors: coverage 4/6, accuracy 4/6, two unsupported."""
    scorer = Scorer(metadata_slices=("modality",))
    for rid in ROWS:
        rec = _rec(rid)
        answers = {}
        for q in rec.request.questions:
            gold = rec.targets[q.field].label
            rest = (1 - 0.9) / (len(q.labels) - 1)
            answers[q.field] = {"probabilities": {lab: 0.9 if lab == gold else rest for lab in q.labels}}
        scorer.update(rec, {"answers": answers, "error": None})
    r = scorer.compute()
    assert r["counts"]["decisions"] == 6 and r["counts"]["scored"] == 4
    assert r["counts"]["error_kinds"] == {"unsupported_modality": 2}
    assert r["counts"]["coverage"] == pytest.approx(4 / 6) and r["accuracy"] == pytest.approx(4 / 6)
    assert r["accuracy_scored"] == 1.0 and r["reference"]["unsupported"] == 2
    assert r["slices"]["modality"]["video"]["counts"]["coverage"] == 0.0


def test_bad_rows_name_the_rule():
    with pytest.raises(RecordError, match="media entry"):
        _rec("vdb-img-1", media=[{"type": "audio", "path": "a.wav"}])
    with pytest.raises(RecordError):
        _rec("vdb-img-1", media=[{"type": "image", "path": "images/missing.png"}])  # images are read and checked


def test_inference_receives_state_questions_and_images_only(vlm):
    engine, tokenizer = vlm
    for rid in ROWS:
        a = _rec(rid)
        b = _rec(rid, id="zz-secret", source="OTHER-SECRET", category="SECRET-CAT",
                 gold={f: None for f in ROWS[rid]["gold"]})
        assert (a.request.state, a.request.questions, a.request.images) == \
               (b.request.state, b.request.questions, b.request.images)
        ca, cb = engine.compiler.compile(a.request), engine.compiler.compile(b.request)
        assert ca.token_ids == cb.token_ids
        text = tokenizer.decode(ca.token_ids)
        for secret in (rid, "vdb-SECRET-SOURCE", "shelf", "door-0001", "gold"):
            assert secret not in text


def test_unavailable_without_the_copy(bench, tmp_path):
    status = get_suite("visual-decision-bench").available(tmp_path / "empty")
    assert status.state == "unavailable" and "visual-decision-bench/test.jsonl" in status.reason
    assert "vision-language --model" in status.reason


def test_runs_through_the_vision_path(bench, vlm, tmp_path):
    from noulengine.eval.runner import EvalConfig, run_eval

    engine, _ = vlm
    [res] = run_eval(engine, EvalConfig(suite="visual-decision-bench", output=str(tmp_path / "run"),
                                        source=str(FIXTURES), progress=False, plots=False))
    m = res.metrics
    assert res.status == "ready" and m["counts"]["decisions"] == 6
    assert m["counts"]["scored"] == 4 and m["counts"]["error_kinds"] == {"unsupported_modality": 2}
    assert set(m["slices"]["modality"]) == {"image", "video"}


def test_a_text_only_model_gives_error_rows_not_a_crash(bench, tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine
    from noulengine.eval.runner import EvalConfig, run_eval

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    [res] = run_eval(engine, EvalConfig(suite="visual-decision-bench", output=str(tmp_path / "run"),
                                        source=str(FIXTURES), progress=False, plots=False))
    kinds = res.metrics["counts"]["error_kinds"]
    assert res.metrics["counts"]["decisions"] == 6 and kinds.get("unsupported_modality") == 2
    assert sum(kinds.values()) == 6  # the image rows are error rows too (no vision on this model)
