"""zh-decision-bench v0.2 (jevalkit-v1): projection and protocol rules with hand-computed values, the
pinned payload, an end-to-end run on real rows, and what inference receives."""

from __future__ import annotations

import copy
import json
import math

import pytest

from noulengine.eval.suites import get_suite
from noulengine.eval.suites.families.zh_decision_bench import parse_item
from noulengine.eval.suites.registry import expand_tasks, resolve_suites
from noulengine.metrics import Scorer
from noulengine.metrics.reference import ece_equal_width, equal_width_edges
from noulengine.records.errors import RecordError
from tests.conftest import SHARED_DATA

ZH = SHARED_DATA / "zh_decision_bench"
needs_data = pytest.mark.skipif(not (ZH / "voice_routing.jsonl").is_file(), reason="shared zh data not present")

ITEM = {  # an upstream business_scenarios item, written by hand in the published format
    "id": "syn_cs_9001", "domain": "ecommerce_cs", "source": "synthetic (AI起草，人工审定)",
    "state": "我的快递三天了一直显示在揽收，到底发没发货啊",
    "questions": {
        "route": {"type": "choice", "instructions": "选择处理部门",
                  "criteria": {"物流配送": "发货、运输、签收、地址修改", "退换售后": "退货、换货、维修、破损、价保"}},
        "urgency": {"type": "score", "instructions": "评估该工单的紧急程度", "criteria": ["不紧急", "一般", "紧急"]},
        "escalate": {"type": "noul", "instructions": "是否需要人工介入",
                     "criteria": {"true": "需要人工介入", "false": "可自动处理"}}},
    "gold": {"route": "物流配送", "urgency": "一般", "escalate": True},
    "difficulty": "easy", "notes": "标准物流咨询：内部备注", "version": 2}


def _item(**changes):
    item = copy.deepcopy(ITEM)
    for key, value in changes.items():
        item[key] = value
    return item


def _answers(rec, probs: dict[str, list[float]]):
    """An answer map giving each field the probabilities listed in the engine's label order."""
    qs = {q.field: q for q in rec.request.questions}
    return {"answers": {f: {"probabilities": dict(zip(qs[f].labels, p))} for f, p in probs.items()}, "error": None}


def _score(pairs, slices=()):
    scorer = Scorer(metadata_slices=slices)
    for rec, ans in pairs:
        scorer.update(rec, ans)
    return scorer.compute()


# -- projection ------------------------------------------------------------------------------


def test_request_is_state_and_questions_in_chinese():
    rec = parse_item(ITEM, file="business_scenarios.jsonl")
    assert rec.request.state == ITEM["state"]
    route, urgency, escalate = rec.request.questions
    assert route.labels == ("物流配送", "退换售后") and route.descriptions[1] == "退货、换货、维修、破损、价保"
    assert urgency.descriptions == ("不紧急", "一般", "紧急") and urgency.instructions == "评估该工单的紧急程度"
    assert escalate.labels == ("no", "yes") and escalate.descriptions == ("可自动处理", "需要人工介入")
    assert rec.metadata["domain"] == "ecommerce_cs" and rec.metadata["difficulty"] == "easy"
    assert rec.metadata["notes"] == ITEM["notes"] and rec.metadata["source"] == ITEM["source"]


def test_score_gold_is_the_level_strings_position():
    rec = parse_item(ITEM, file="x")
    assert rec.targets["urgency"].label == "1"  # "一般" is the second of ["不紧急", "一般", "紧急"]
    assert parse_item(_item(gold={**ITEM["gold"], "urgency": "紧急"}), file="x").targets["urgency"].label == "2"
    with pytest.raises(RecordError, match="level strings") as exc:
        parse_item(_item(gold={**ITEM["gold"], "urgency": 1}), file="x")  # an index is not the format
    assert exc.value.field == "gold.urgency"
    with pytest.raises(RecordError, match="level strings"):
        parse_item(_item(gold={**ITEM["gold"], "urgency": "很急"}), file="x")


def test_noul_gold_is_a_json_boolean():
    assert parse_item(ITEM, file="x").targets["escalate"].label == "yes"
    assert parse_item(_item(gold={**ITEM["gold"], "escalate": False}), file="x").targets["escalate"].label == "no"
    with pytest.raises(RecordError, match="JSON boolean") as exc:
        parse_item(_item(gold={**ITEM["gold"], "escalate": "true"}), file="x")
    assert exc.value.field == "gold.escalate"


def test_bad_items_name_the_rule():
    with pytest.raises(RecordError, match="missing key 'notes'"):
        parse_item({k: v for k, v in ITEM.items() if k != "notes"}, file="x")
    with pytest.raises(RecordError, match="unknown key 'expected'"):
        parse_item(_item(expected={}), file="x")
    with pytest.raises(RecordError, match="every question needs a gold"):
        parse_item(_item(gold={"route": "物流配送", "urgency": "一般"}), file="x")
    with pytest.raises(RecordError, match="choice gold"):
        parse_item(_item(gold={**ITEM["gold"], "route": "支付问题"}), file="x")


# -- protocol rules, values by hand -------------------------------------------------------------


def test_noul_tie_breaks_towards_true_in_the_reference_only():
    """A 50/50 answer: the source (labels true, false) predicts true; the generic scorer (no, yes) predicts no."""
    yes = parse_item(ITEM, file="x")
    no = parse_item(_item(id="n", gold={**ITEM["gold"], "escalate": False}), file="x")

    def escalate(rec, p):
        return _score([(rec, _answers(rec, {"escalate": p}))])["slices"]["field"]["escalate"]

    tie = escalate(yes, [0.5, 0.5])
    assert tie["accuracy"] == 0.0 and tie["reference"]["accuracy"] == 1.0
    tie = escalate(no, [0.5, 0.5])
    assert tie["accuracy"] == 1.0 and tie["reference"]["accuracy"] == 0.0
    # away from a tie both agree: P(yes) = 0.6 on gold true
    away = escalate(yes, [0.4, 0.6])
    assert away["accuracy"] == away["reference"]["accuracy"] == 1.0
    # the same block counts the unanswered route/urgency as errors, wrong under both rules
    report = _score([(yes, _answers(yes, {"escalate": [0.5, 0.5]}))])
    assert report["accuracy"] == 0.0 and report["reference"]["accuracy"] == pytest.approx(1 / 3)


def test_reference_ece_is_15_equal_width_bins_closed_on_the_right():
    edges = equal_width_edges(15)
    assert len(edges) == 16 and edges[0] == 0.0 and edges[-1] == 1.0 and edges[5] == 5 * (1.0 / 15)
    # confidence exactly on the edge 5/15 shares the bin (4/15, 5/15] with 0.30:
    # |mean(5/15, 0.30) - mean(1, 0)| = |0.316667 - 0.5| = 0.183333 (left-closed bins would give 0.483333)
    assert ece_equal_width([edges[5], 0.30], [1.0, 0.0]) == pytest.approx(0.5 - (edges[5] + 0.30) / 2, abs=1e-15)
    assert ece_equal_width([edges[5], 0.30], [1.0, 0.0]) == pytest.approx(0.183333333333, abs=1e-9)
    assert ece_equal_width([1.0], [1.0]) == 0.0  # 1.0 sits in the last bin (14/15, 1]


def test_reference_block_by_hand():
    """Three decisions: escalate P(yes)=0.9 on gold true (right, conf 0.9); urgency (0.1, 0.7, 0.2) on
    gold 1 (right, 0.7); route (0.6, 0.4) on gold 物流配送 (right, 0.6) -- then the same item with gold
    flipped to false / 紧急 / 退换售后 (all wrong)."""
    right = parse_item(ITEM, file="x")
    wrong = parse_item(_item(id="w", gold={"route": "退换售后", "urgency": "紧急", "escalate": False}), file="x")
    probs = {"escalate": [0.1, 0.9], "urgency": [0.1, 0.7, 0.2], "route": [0.6, 0.4]}
    report = _score([(right, _answers(right, probs)), (wrong, _answers(wrong, probs))])
    ref = report["reference"]
    assert ref["accuracy"] == pytest.approx(3 / 6)
    # NLL: right ones -ln .9, -ln .7, -ln .6; wrong ones -ln .1, -ln .2, -ln .4
    assert ref["nll"] == pytest.approx(-sum(map(math.log, (0.9, 0.7, 0.6, 0.1, 0.2, 0.4))) / 6)
    assert ref["nll"] == pytest.approx(report["nll"])  # the same probabilities, the same floor: no refit
    # ECE: bins hold {0.9: 1 right, 1 wrong}, {0.7: ...}, {0.6: ...}: each |conf - 0.5|, weight 1/3
    assert ref["ece"] == pytest.approx((0.4 + 0.2 + 0.1) / 3)
    # Brier of (0.1, 0.9) on gold yes: 0.01 + 0.01 = 0.02; mean over all six, as the source computes it
    briers = [0.02, 0.01 + 0.09 + 0.04, 0.16 + 0.16, 0.81 + 0.81, 0.01 + 0.49 + 0.64, 0.36 + 0.36]
    assert ref["brier"] == pytest.approx(sum(briers) / 6)
    assert ref["rules"]["test_time_refit"] is False and ref["rules"]["nll_floor"] == 1e-12


def test_no_test_time_temperature_refit():
    """The probabilities are scored as served: NLL = -ln p exactly, with no fitted temperature anywhere."""
    rec = parse_item(ITEM, file="x")
    report = _score([(rec, _answers(rec, {"route": [0.25, 0.75]}))])
    assert report["reference"]["nll"] == pytest.approx(math.log(4)) == report["nll"]
    assert rec.metadata["protocol"]["test_time_refit"] is False
    from noulengine.metrics.reference import reference_lines

    assert any("no test-time temperature refit" in line for line in reference_lines(report))


def test_slices_by_domain_and_difficulty():
    a = parse_item(ITEM, file="x")  # ecommerce_cs, easy
    b = parse_item(_item(id="b", domain="content_moderation", difficulty="hard",
                         gold={**ITEM["gold"], "escalate": False}), file="x")
    probs = {"escalate": [0.3, 0.7], "route": [0.8, 0.2], "urgency": [0.2, 0.5, 0.3]}
    report = _score([(a, _answers(a, probs)), (b, _answers(b, probs))], slices=("domain", "difficulty"))
    assert report["slices"]["domain"]["ecommerce_cs"]["accuracy"] == 1.0  # yes, 物流配送 and 一般: all right
    assert report["slices"]["domain"]["content_moderation"]["counts"]["decisions"] == 3
    assert report["slices"]["difficulty"]["hard"]["reference"]["accuracy"] == pytest.approx(2 / 3)  # escalate wrong
    # ECE of the hard slice: confidences 0.8 (right), 0.5 (right), 0.7 (wrong), one per bin: (0.2 + 0.5 + 0.7) / 3
    assert report["slices"]["difficulty"]["hard"]["reference"]["ece"] == pytest.approx((0.2 + 0.5 + 0.7) / 3)
    assert set(report["slices"]["difficulty"]) == {"easy", "hard"}
    assert report["slices"]["domain"]["ecommerce_cs"]["reference"]["ece"] is not None


# -- the pinned payload and the registry --------------------------------------------------------


def test_manifest_pins_both_files_and_the_verified_counts():
    suite = get_suite("zh-decision-bench")
    pins = {e["path"]: e["sha256"] for e in suite.manifest["source_files"]}
    assert pins == {  # the values in shared/data/zh_decision_bench/SOURCE.md
        "zh_decision_bench/voice_routing.jsonl": "cb5f7cc7d8d9deaa2b1a7c86dbfeea78a17544122271e80024942b42bfc72ddb",
        "zh_decision_bench/business_scenarios.jsonl":
            "d25d01b2ca4079551a3e9cb9f455c17d8e4a7dfe9132d894aafe462dd342deca"}
    assert suite.prepared_pins() == {"voice_routing.jsonl": pins["zh_decision_bench/voice_routing.jsonl"],
                                     "business_scenarios.jsonl": pins["zh_decision_bench/business_scenarios.jsonl"]}
    counts = suite.manifest["counts"]
    assert (counts["rows"], counts["decisions"]) == (378, 467)
    assert counts["question_types"] == {"choice": 357, "noul": 76, "score": 34}
    assert suite.slices == ("domain", "difficulty")
    assert resolve_suites("zh-decision-bench") == ("suite", ["zh-decision-bench"])
    assert expand_tasks(None, collection="zh-decision-bench") == ["zh-decision-bench"]  # eval --suite zh-decision-bench
    assert "zh-decision-bench" in expand_tasks(None, collection="jevalkit-v1")


@needs_data
def test_a_changed_source_file_is_refused(tmp_path, monkeypatch):
    import shutil

    from noulengine.eval.suites import SourceFileChangedError
    from tests.conftest import REPO

    bench = tmp_path / "benchmarks"
    shutil.copytree(REPO / "benchmarks" / "jevalkit-v1", bench / "jevalkit-v1",
                    ignore=shutil.ignore_patterns("prepared"))
    monkeypatch.setenv("NOULENGINE_BENCHMARKS", str(bench))
    data = tmp_path / "data" / "zh_decision_bench"
    data.mkdir(parents=True)
    shutil.copy(ZH / "voice_routing.jsonl", data)
    (data / "business_scenarios.jsonl").write_bytes((ZH / "business_scenarios.jsonl").read_bytes().replace(
        "一般".encode(), "紧急".encode(), 1))
    suite = get_suite("zh-decision-bench")
    assert suite.available(tmp_path / "data").state == "changed"
    with pytest.raises(SourceFileChangedError):
        suite.prepare(source=tmp_path / "data")


@needs_data
def test_every_real_row_projects():
    rows = get_suite("zh-decision-bench").load()
    assert len(rows) == 378 and [i for i, _ in rows] == list(range(378))
    rec = rows[323][1]  # the first business_scenarios item
    assert rec.id == "syn_cs_0001" and rec.targets["urgency"].label == "1" and rec.targets["escalate"].label == "no"
    assert rows[0][1].request.state == "五点提醒我" and rows[0][1].targets["route"].label == "闹钟计时"
    assert sum(len(r.targets) for _, r in rows) == 467


# -- what inference receives ------------------------------------------------------------------


def test_inference_never_receives_gold_notes_ids_or_source(tiny_llama, tiny_tokenizer):
    """The compiled token ids of an item do not change when its gold, notes, id, source, domain,
    difficulty or version change; none of those strings is in the decoded prompt."""
    from noulengine import Engine

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    base = parse_item(ITEM, file="x")
    other = parse_item(_item(id="zz_secret_id", gold={"route": "退换售后", "urgency": "紧急", "escalate": False},
                             notes="绝密备注 gold is 退换售后", source="internal source 内部来源",
                             domain="other_domain", difficulty="hard", version=9), file="y")
    a, b = engine.compiler.compile(base.request), engine.compiler.compile(other.request)
    assert a.token_ids == b.token_ids
    text = tiny_tokenizer.decode(b.token_ids)
    for secret in ("zz_secret_id", "绝密备注", "内部来源", "other_domain", "notes", "gold", "difficulty"):
        assert secret not in text
    assert ITEM["state"] in text and "评估该工单的紧急程度" in text


@needs_data
def test_end_to_end_on_real_rows(tiny_llama, tiny_tokenizer, tmp_path):
    """Six real items (seed 20: voice routing, e-commerce, moderation; easy and mid) through the runner
    and the report, capturing every request the engine is handed."""
    from noulengine import Engine
    from noulengine.eval.report import write_outputs
    from noulengine.eval.runner import EvalConfig, run_eval

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    seen = []
    original = engine.decide_batch

    def capture(requests, **kw):
        requests = list(requests)
        seen.extend(requests)
        return original(requests, **kw)

    engine.decide_batch = capture
    cfg = EvalConfig(suite="zh-decision-bench", sample=6, seed=20, output=str(tmp_path), progress=False, plots=False)
    [res] = run_eval(engine, cfg)
    assert res.status == "ready" and res.rows == 6
    m = res.metrics
    assert m["counts"]["decisions"] == 13 and m["counts"]["errors"] == 0  # 2 x 1 + 3 x 3 + 1 x 2
    assert set(m["slices"]["domain"]) == {"voice_assistant_routing", "ecommerce_cs", "content_moderation"}
    assert set(m["slices"]["difficulty"]) == {"easy", "mid"}
    ref = m["reference"]
    assert ref["family"] == "zh-decision-bench" and ref["hard_labelled"] == 13 and 0 <= ref["ece"] <= 1
    assert ref["brier"] == pytest.approx(m["brier"]) and ref["nll"] == pytest.approx(m["nll"])

    # the engine got state and questions only, exactly as written upstream
    raw = {}
    for name in ("voice_routing.jsonl", "business_scenarios.jsonl"):
        for line in (ZH / name).read_text(encoding="utf-8").splitlines():
            item = json.loads(line)
            raw[item["id"]] = item
    assert len(seen) == 6
    for req in seen:
        item = raw[req.id]
        assert req.state == item["state"] and req.images == ()
        assert [q.field for q in req.questions] == list(item["questions"])
        for q in req.questions:
            assert q.instructions == item["questions"][q.field]["instructions"]
    preds = (tmp_path / "predictions.jsonl").read_text(encoding="utf-8")
    assert "\\u" not in preds and any("\u4e00" <= ch <= "\u9fff" for ch in preds)  # Chinese as itself

    meta = {"suite": "zh-decision-bench", "engine": engine.describe(), "selection": {"sample": 6, "seed": 20},
            "git_revision": None}
    write_outputs([res], tmp_path, meta)
    metrics = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["zh-decision-bench"]["metrics"]["reference"]["ece"] == ref["ece"]
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Protocol `zh-decision-bench`" in report and "reference ECE" in report
    assert "| content_moderation |" in report and "no test-time temperature refit" in report


@needs_data
def test_report_keeps_chinese_labels(tiny_llama, tiny_tokenizer, tmp_path):
    """The first three items are voice routing (one fixed question): report.md names its slots in Chinese."""
    from noulengine import Engine
    from noulengine.eval.report import write_outputs
    from noulengine.eval.runner import EvalConfig, run_eval

    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    results = run_eval(engine, EvalConfig(suite="zh-decision-bench", limit=3, output=str(tmp_path), progress=False,
                                          plots=False))
    write_outputs(results, tmp_path, {"suite": "zh-decision-bench", "engine": engine.describe(), "selection": {"limit": 3}})
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "| 1 | 闹钟计时 |" in report


@needs_data
def test_training_guard_indexes_both_files():
    """The evaluation-overlap guard indexes the projected records of both files (378 rows), so a
    training row repeating a business_scenarios state is refused, not only a voice_routing one."""
    from noulengine.train.contamination import EvaluationIndex, index_records

    suite = get_suite("zh-decision-bench")
    index = EvaluationIndex()
    index_records(index, suite, suite.load())
    assert index.suites["zh-decision-bench"]["rows"] == 378
    assert index.overlap("t1", "我的快递三天了一直显示在揽收，到底发没发货啊")[0] == "state"  # syn_cs_0001
    assert index.overlap("t2", "五点提醒我")[0] == "state"  # mass_0030
    assert index.overlap("syn_cs_0001", "anything")[0] == "id"
