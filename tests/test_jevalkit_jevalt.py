"""JevAlt-Bench (jevalkit-v1) from hand-written local copies of the en/tr/de test files: split by
file, the abstain candidate, insertion-ordered rubrics, language slices, soft scores, the
equal-mass reference ECE, availability, and what inference receives."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from noulengine.eval.suites import get_suite
from noulengine.eval.suites.families.jevalt import parse_item
from noulengine.metrics import Scorer
from noulengine.metrics.reference import ece_equal_mass
from noulengine.records.errors import RecordError
from tests.jevalkit_helpers import FIXTURES, bench, read_rows  # noqa: F401 (bench: a fixture)

ROWS = {}
for _lang in ("en", "tr", "de"):
    for _line in (FIXTURES / "jevalt-bench" / _lang / "test.jsonl").read_text(encoding="utf-8").splitlines():
        _row = json.loads(_line)
        ROWS[_row["id"]] = (_row, f"{_lang}/test.jsonl")


def _rec(rid, **changes):
    row, file = ROWS[rid]
    row = copy.deepcopy(row)
    row.update(changes)
    return parse_item(row, file=file)


def _score(pairs):
    scorer = Scorer(metadata_slices=("lang",))
    for rec, probs in pairs:
        answers = {q.field: {"probabilities": dict(zip(q.labels, probs))} for q in rec.request.questions}
        scorer.update(rec, {"answers": answers, "error": None})
    return scorer.compute()


def test_split_is_the_file_not_the_split_field():
    rec = _rec("en-1")
    assert ROWS["en-1"][0]["split"] == "train"  # the release's placeholder
    assert rec.metadata["split"] == "test" and rec.metadata["split_field"] == "train"
    assert rec.metadata["lang"] == "en" and rec.metadata["file"] == "en/test.jsonl"


def test_abstain_tag_adds_unknown_to_choice_and_score():
    q = _rec("en-1").request.questions[0]
    assert q.labels == ("shipping", "billing", "unknown") and q.descriptions[2] == "not enough information to decide"
    rec = _rec("en-1")
    assert rec.targets["team"].probabilities == {"shipping": 0.7, "billing": 0.1, "unknown": 0.2}
    s = _rec("tr-2")  # abstain on a list rubric: a last level "unknown", the gold
    assert s.request.questions[0].descriptions == ("düşük", "orta", "yüksek", "unknown")
    assert s.targets["aciliyet"].label == "3"


def test_gold_never_decides_the_input(tiny_llama, tiny_tokenizer):
    from noulengine import Engine

    # without the tag, a gold "unknown" is refused, not answered by adding the candidate
    with pytest.raises(RecordError, match="not a candidate"):
        _rec("tr-1", targets={"ekip": {"label": "unknown", "dist": None}})
    with pytest.raises(RecordError, match="not a level"):
        _rec("tr-2", tags=[])
    # with the tag, the candidate is there whatever the gold; the compiled input is the same
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    a = _rec("en-1")
    b = _rec("en-1", id="zz-secret", targets={"team": {"label": "billing", "dist": None}}, source="SECRET-SRC",
             license="SECRET-LIC", split="SECRET-SPLIT")
    assert engine.compiler.compile(a.request).token_ids == engine.compiler.compile(b.request).token_ids
    for rid in ROWS:
        rec = _rec(rid)
        stripped = _rec(rid, targets={}, tags=[t for t in ROWS[rid][0]["tags"] if t == "abstain"], source=None,
                        license=None, split=None, id="other")
        assert engine.compiler.compile(rec.request).token_ids == engine.compiler.compile(stripped.request).token_ids
        text = tiny_tokenizer.decode(engine.compiler.compile(rec.request).token_ids)
        for secret in (rid, "jevalt-curated", "cc-by-4.0", "tag-routing", "tag-policy", "dist"):
            assert secret not in text


def test_object_rubric_keeps_insertion_order():
    rec = _rec("en-2")  # keys none, some, severe (alphabetical would put severe second)
    q = rec.request.questions[0]
    assert q.labels == ("0", "1", "2")
    assert q.descriptions == ("none: works around it easily", "some: loses a feature", "severe: cannot use the product")
    assert rec.targets["impact"].label == "1"
    assert rec.targets["impact"].probabilities == {"0": 0.2, "1": 0.5, "2": 0.3}
    plain = _rec("de-2")  # digit keys in order: the descriptions alone; an integer gold is the position
    assert plain.request.questions[0].descriptions == ("kann warten", "diese Woche", "heute")
    assert plain.targets["dringlichkeit"].label == "2"


def test_noul_label_and_dist():
    rec = _rec("en-3")
    assert rec.targets["refund"].label == "yes" and rec.targets["refund"].probabilities == {"no": 0.1, "yes": 0.9}


def test_equal_mass_ece_by_hand():
    conf, ok = [0.9, 0.8, 0.6, 0.55], [1.0, 0.0, 1.0, 0.0]
    # 2 bins: {0.55, 0.6} (acc 0.5, conf 0.575) and {0.8, 0.9} (acc 0.5, conf 0.85)
    assert ece_equal_mass(conf, ok, 2) == pytest.approx(0.5 * 0.075 + 0.5 * 0.35)
    # 3 bins of sizes 2, 1, 1 (the larger first): {0.55, 0.6}, {0.8}, {0.9}
    assert ece_equal_mass(conf, ok, 3) == pytest.approx(0.5 * 0.075 + 0.25 * 0.8 + 0.25 * 0.1)


def test_hard_and_soft_scores_with_language_slices():
    """en-1 gets (0.6, 0.1, 0.3): right, conf 0.6; tr-1 gets (0.3, 0.7): wrong, conf 0.7; de-1 gets
    (0.8, 0.2): right, conf 0.8. Fewer decisions than 15 bins: one per bin, ECE = mean |conf - ok|."""
    report = _score([(_rec("en-1"), [0.6, 0.1, 0.3]), (_rec("tr-1"), [0.3, 0.7]), (_rec("de-1"), [0.8, 0.2])])
    assert report["accuracy"] == pytest.approx(2 / 3) and report["reference"]["accuracy"] == pytest.approx(2 / 3)
    assert report["reference"]["ece"] == pytest.approx((0.4 + 0.7 + 0.2) / 3)
    assert report["reference"]["rules"]["ece_bins"].startswith("15 equal-mass")
    # soft: only en-1 has a dist (0.7, 0.1, 0.2): TVD = 0.5 * (0.1 + 0 + 0.1) = 0.1
    assert report["distribution"]["n"] == 1 and report["distribution"]["tvd"] == pytest.approx(0.1)
    assert report["distribution"]["brier_vs_distribution"] == pytest.approx(0.01 + 0.0 + 0.01)
    assert set(report["slices"]["lang"]) == {"en", "tr", "de"}
    assert report["slices"]["lang"]["tr"]["accuracy"] == 0.0


def test_bad_rows_name_the_rule():
    with pytest.raises(RecordError, match="unknown key 'expected'"):
        _rec("en-1", expected={})
    with pytest.raises(RecordError, match="does not ask"):
        _rec("en-1", targets={"other": {"label": "x"}})


def test_unavailable_names_every_missing_file_and_the_download(bench, tmp_path):
    part = tmp_path / "partial" / "jevalt-bench" / "en"
    part.mkdir(parents=True)
    shutil.copy(FIXTURES / "jevalt-bench" / "en" / "test.jsonl", part)
    status = get_suite("jevalt-bench").available(tmp_path / "partial")
    assert status.state == "unavailable"
    assert "jevalt-bench/tr/test.jsonl" in status.reason and "jevalt-bench/de/test.jsonl" in status.reason
    assert "download JevAlt-Bench" in status.reason


def test_runs_from_the_local_copies(bench, tiny_llama, tiny_tokenizer, tmp_path):
    from noulengine import Engine
    from noulengine.eval.runner import EvalConfig, run_eval

    rows = get_suite("jevalt-bench").load(source=FIXTURES)
    assert [r.id for _, r in rows] == ["en-1", "en-2", "en-3", "tr-1", "tr-2", "de-1", "de-2"]
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    [res] = run_eval(engine, EvalConfig(suite="jevalt-bench", output=str(tmp_path / "run"), source=str(FIXTURES),
                                        progress=False, plots=False))
    m = res.metrics
    assert m["counts"]["decisions"] == 7 and m["counts"]["errors"] == 0 and m["distribution"]["n"] == 3
    assert set(m["slices"]["lang"]) == {"en", "tr", "de"} and m["reference"]["family"] == "jevalt-bench"
