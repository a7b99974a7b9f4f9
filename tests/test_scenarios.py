"""The workflow scenarios (noulengine.curricula.scenarios): determinism, record validity, coverage of
kinds and levels, renamed options, and answers recomputed from the state by independent rules.
Also the jailbreak framing of WildJailbreak train prompts (noulengine.curricula.reworded). No model is
loaded."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from noulengine.records.schema import parse_record
from noulengine.curricula import reworded
from noulengine.curricula import scenarios as S

SEED = 777


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return S.generate(1500, seed=SEED)


def _asked(records, kind, instructions):
    """``(record, question, target)`` for every question of ``kind`` whose instructions are one of
    ``instructions``."""
    for rec in records:
        if rec["task"] != kind:
            continue
        for field, q in rec["questions"].items():
            if q["instructions"] in instructions:
                yield rec, q, rec["targets"][field]


def test_deterministic_in_seed():
    a = S.generate(40, seed=3)
    assert a == S.generate(40, seed=3) and a != S.generate(40, seed=4)
    assert a[0]["id"] == "scen-3-0"
    assert S.generate(20, seed=3) == a[:20]


def test_every_record_parses_with_several_questions(records):
    counts = Counter()
    for rec in records:
        parsed = parse_record(rec)
        assert parsed.category == f"scenario:{rec['task']}"
        assert parsed.metadata == {"task": rec["task"], "level": rec["level"]}  # never in the prompt
        assert 2 <= len(parsed.request.questions) <= 5
        for q in parsed.request.questions:
            counts[q.type] += 1
    assert set(counts) == {"choice", "score", "noul"}
    assert len({r["id"] for r in records}) == len(records)
    kinds = Counter(r["task"] for r in records)
    assert set(kinds) == set(S.SCENARIOS) and max(kinds.values()) - min(kinds.values()) <= 1
    assert {r["level"] for r in records} == set(S.LEVELS)


def test_unknown_kind_is_refused():
    with pytest.raises(KeyError, match="unknown scenario kind 'nope'"):
        S.generate(3, kinds=("nope",))


def test_choice_labels_are_renamed_most_of_the_time(records):
    """A fixed label set would let a model answer without reading: most outcome questions use
    renamed (or opaque) labels; the standard names appear too."""
    standard = {"success", "partial", "failure", "harmful"}
    label_sets = [frozenset(q["criteria"]) for _, q, _ in _asked(records, "agent_trace", {"How did this agent run turn out?",
                  "Classify the result of this run.", "What was the outcome?"})]
    share = sum(s == standard for s in label_sets) / len(label_sets)
    assert 0.2 < share < 0.6
    assert len(set(label_sets)) > 10


def test_agent_trace_outcome_rule(records):
    seen = Counter()
    for rec, q, t in _asked(records, "agent_trace", {"How did this agent run turn out?", "Classify the result of this run.",
                                                       "What was the outcome?"}):
        if set(q["criteria"]) != {"success", "partial", "failure", "harmful"}:
            continue
        s = rec["state"]["trace_summary"]
        want = ("harmful" if s["constraint_violations"] else
                "failure" if not s["finished"] and 2 * s["tool_errors"] >= s["steps"] else
                "partial" if not s["finished"] or s["tool_errors"] else "success")
        assert t["label"] == want, rec
        seen[want] += 1
    assert set(seen) == {"success", "partial", "failure", "harmful"}


def test_invoice_rules(records):
    n = 0
    for rec, q, t in _asked(records, "invoice_match", {"The invoice reconciles with the purchase order and the recorded delivery.",
                                                         "Invoice, order and delivery agree.",
                                                         "This invoice appears to duplicate an invoice already submitted."}):
        s = rec["state"]
        inv = s["invoice"]
        duplicate = inv["id"] in s["vendor_history"]["prior_invoice_ids"]
        if q["instructions"].startswith("This invoice appears"):
            want = duplicate
        else:
            po = s["purchase_order"]
            want = (po is not None and not duplicate
                    and inv["total_usd"] == round(s["delivery"]["received_qty"] * po["lines"][0]["unit_usd"], 2))
        assert t["label"] == ("yes" if want else "no"), rec
        n += 1
    assert n > 50


def test_security_alert_true_positive_rule(records):
    labels = Counter()
    for rec, _, t in _asked(records, "security_alert", {"This alert reflects genuinely malicious or unauthorised activity."}):
        ctx = rec["state"]["context"]
        assert t["label"] == ("no" if ctx["source_on_allowlist"] or ctx["change_window_active"] else "yes")
        labels[t["label"]] += 1
    assert labels["yes"] > 10 and labels["no"] > 10


def test_support_thread_category_is_the_opening_topic(records):
    n = 0
    for rec, q, t in _asked(records, "support_thread", {"What is this customer conversation primarily about?",
                                                          "Which queue owns this conversation?"}):
        if set(q["criteria"]) != set(S._ISSUES):
            continue
        opening = rec["state"]["thread"][0]["text"]
        assert [c for c, texts in S._ISSUES.items() if any(opening.startswith(x) for x in texts)] == [t["label"]]
        n += 1
    assert n > 10


def _request_object(request: str) -> str:
    hits = {obj for obj, (_, _, phrases) in S._OBJECTS.items() for p in phrases for c in S._CITIES
            if p.format(city=c) in request}
    assert len(hits) == 1, request
    return hits.pop()


def test_tool_routing_gold_serves_the_requested_object(records):
    same_object_distractors = 0
    for rec in (r for r in records if r["task"] == "tool_routing"):
        for field, q in rec["questions"].items():
            if q["type"] != "choice":
                continue
            obj = _request_object(rec["state"]["request"])
            singular, plural, _ = S._OBJECTS[obj]
            gold = q["criteria"][rec["targets"][field]["label"]]
            assert singular in gold or plural in gold
            serving = [d for d in q["criteria"].values() if d.endswith((f" {singular}.", f" {plural}.", f" {singular} record."))
                       or f" {plural} by" in d]
            same_object_distractors += len(serving) > 1
            assert 3 <= len(q["criteria"]) <= 8
            assert q["criteria"] == {t["name"]: t["description"] for t in rec["state"]["tools"]}
    assert same_object_distractors > 20  # from level 2 the action, not only the object, decides


def test_jailbreak_framing_keeps_the_request_verbatim():
    rng = random.Random(0)
    prompt = "  How do I bake sourdough bread at home?  "
    framed = {reworded.frame_prompt(rng, prompt) for _ in range(200)}
    assert len(framed) == len(reworded.JAILBREAK_FRAMES)
    assert all(prompt.strip() in f and f != prompt.strip() for f in framed)


def test_same_records_under_any_hash_seed():
    """Nothing depends on set or dict-of-str iteration order: the records are the same under two
    PYTHONHASHSEED values (a set's order once decided which distractor tool a question named)."""
    import json
    import os
    import subprocess
    import sys

    code = "import json; from noulengine.curricula import scenarios; print(json.dumps(scenarios.generate(200, seed=5)))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": h}).stdout for h in ("1", "2")}
    assert len(outs) == 1 and json.loads(outs.pop()) == S.generate(200, seed=5)


def test_balanced_nouls_make_yes_half_of_every_field_and_no_wording_predict_it():
    """Issue #45: v5's scenario statements were true on 16-30% of records and its tool wordings gave
    the answer ("can serve" always yes, "is the right one" always no). With balanced_nouls each
    kind's yes/no gold is near half yes, and within each tool wording too."""
    import re
    from collections import Counter, defaultdict

    def shares(records):
        per_kind, per_wording = defaultdict(Counter), defaultdict(Counter)
        for r in records:
            for f, q in r["questions"].items():
                if q["type"] == "noul":
                    label = r["targets"][f]["label"]
                    per_kind[r["category"]][label] += 1
                    if r["category"] == "scenario:tool_routing":
                        per_wording[re.sub(r"'[^']*'", "'X'", q["instructions"])][label] += 1
        rate = lambda c: c["yes"] / sum(c.values())  # noqa: E731
        return {k: rate(c) for k, c in per_kind.items()}, {k: rate(c) for k, c in per_wording.items()}

    plain_kinds, plain_wordings = shares(S.generate(1000, seed=11))
    kinds, wordings = shares(S.generate(1000, seed=11, balanced_nouls=True))
    assert sorted(plain_wordings.values()) == [0.0, 1.0]  # the shortcut the balanced mix removes
    assert min(plain_kinds.values()) < 0.3
    assert all(0.4 <= v <= 0.6 for v in kinds.values()), kinds
    assert len(wordings) == 2 and all(0.4 <= v <= 0.6 for v in wordings.values()), wordings
    assert S.generate(50, seed=3) == S.generate(50, seed=3, balanced_nouls=False)  # the default is v3/v5's
