"""Train-side tool and yes/no data (issue #33 items 1-2): :mod:`noulengine.curricula.toolrl`,
:mod:`noulengine.curricula.nouls` and the ``v4`` mix of ``scripts/train_default.py``.

Rule tests run on rows written here in ToolRL's format; the contamination count, determinism and
the v4 build also run on the real file when ``../shared/data`` is present (skipped otherwise)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from noulengine.compile.render import render_question, render_state
from noulengine.records.errors import RecordError
from noulengine.records.schema import request_from_json
from noulengine.curricula import nouls, toolrl
from noulengine.train.contamination import EvaluationIndex

REPO = Path(__file__).resolve().parents[1]


def _instruction(tools):
    lines = ["You are a helpful assistant.", "", "**Available Tools**"]
    for k, (name, desc) in enumerate(tools):
        lines += [f"{k + 1}. Name: {name}", f"Description: {desc}", 'Parameters: {"x": {"type": "string"}}']
    return "\n".join(lines + ["", "**Steps for Each Turn**"])


def _row(tools, request, calls, *, history=""):
    out = "<think> I could write <tool_call> here in prose. </think>\n"
    if calls:
        lines = "\n".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
        out += f"<tool_call>\n{lines}\n</tool_call>"
    else:
        out += "<response> Hello. </response>"
    return {"instruction": _instruction(tools),
            "input": f"**Dialogue Records History**\n{history}<user> {request} </user>", "output": out}


TOOLS = [("Weather Now", "Returns the current weather for a city."),
         ("Stock Quote", "Retrieves the latest share price of a company."),
         ("Translate", "Translates a sentence into another language."),
         ("Hotel Finder", "Searches hotels near a location.")]


def _synthetic(n=60):
    """``n`` usable single-call rows (varied catalogue sizes) plus one multi-call row."""
    rows = []
    for i in range(n):
        tools = [(f"{name} {i}", f"{desc} Variant {i}.") for name, desc in TOOLS[: 1 + i % 4]]
        rows.append(_row(tools, f"Request number {i}: please help with the weather.", [(tools[0][0], {"q": i})]))
    rows.append(_row([(f"{a} m", f"{b} Multi.") for a, b in TOOLS],
                     "Translate 'hola' and then tell me the weather in Oslo.",
                     [("Translate m", {"text": "hola"}), ("Weather Now m", {"city": "Oslo"})]))
    return rows


def _write(tmp_path, rows) -> Path:
    path = tmp_path / "rlla_sft.json"
    path.write_text(json.dumps(rows))
    return path


def test_parse_reads_calls_after_the_reasoning_only_and_names_bad_rows():
    row = toolrl.parse_row(3, _row(TOOLS, "What is the weather in Oslo?", [("Weather Now", {"city": "Oslo"})]))
    assert [t.name for t in row.tools] == [t[0] for t in TOOLS]
    assert row.calls == (("Weather Now", {"city": "Oslo"}),) and row.request == "What is the weather in Oslo?"
    bad = _row(TOOLS, "x", [])
    bad["output"] = "<think> ok </think>\n<tool_call>\nnot json\n</tool_call>"
    with pytest.raises(RecordError, match=r"row 7.*field 'output'.*<tool_call> line 1: expected a JSON object"):
        toolrl.parse_row(7, bad)
    with pytest.raises(RecordError, match=r"row 2.*field 'instruction'.*numbered tool catalogue"):
        toolrl.parse_row(2, {"instruction": "no tools", "input": "<user> x </user>", "output": ""})


@pytest.mark.parametrize("request_text,calls,want", [
    ("Translate 'hola' and then tell me the weather in Oslo.",
     [("Translate", {"text": "hola"}), ("Weather Now", {"city": "Oslo"})], ("Translate", "Weather Now")),
    # the user asks for the weather first, the output calls it second: the order is not the request's
    ("What is the weather in Oslo, and translate 'hola'.",
     [("Translate", {"text": "hola"}), ("Weather Now", {"city": "Oslo"})], "multi_call_order_disagrees_with_request"),
    ("Two things please.", [("Translate", {"text": "hola"}), ("Weather Now", {"city": "Oslo"})],
     "multi_call_order_not_in_request"),
    ("Translate 'hola', weather in Oslo, translate 'adios'.",
     [("Translate", {"text": "hola"}), ("Weather Now", {"city": "Oslo"}), ("Translate", {"text": "adios"})],
     "multi_call_interleaved"),
    # the same argument for both tools: no order to read
    ("Pet 55555 and product 55555.", [("Translate", {"id": 55555}), ("Weather Now", {"id": 55555})],
     "multi_call_order_disagrees_with_request"),
    # 5 inside 1.5 is not a mention of 5; "101.0" is mentioned as 101
    ("List [1.5, 2.5] stats, then 5 of 6, then recitation 101.",
     [("Translate", {"a": [1.5, 2.5]}), ("Weather Now", {"k": 5}), ("Stock Quote", {"r": "101.0"})],
     ("Translate", "Weather Now", "Stock Quote")),
])
def test_multi_call_rows_give_one_decision_per_call_only_in_an_unambiguous_order(request_text, calls, want):
    row = toolrl.parse_row(0, _row(TOOLS, request_text, calls))
    decisions, reason = toolrl.decisions_of(row)
    if isinstance(want, tuple):
        assert reason is None
        assert [(d.gold, d.called_so_far) for d in decisions] == [(n, want[:k]) for k, n in enumerate(want)]
    else:
        assert decisions == [] and reason == want


def test_left_out_rows_are_counted_by_reason(tmp_path):
    rows = _synthetic(12) + [
        _row(TOOLS, "Hi there", []),
        _row(TOOLS, "Weather?", [("Weather Now", {})],
             history="<user> earlier </user>\n<tool_call>\n{}\n</tool_call>\n"),
        _row(TOOLS + [TOOLS[0]], "Weather in Oslo?", [("Weather Now", {"c": "Oslo"})]),
        _row(TOOLS, "Weather in Oslo?", [("Unknown Tool", {"c": "Oslo"})]),
    ]
    data = toolrl.build(_write(tmp_path, rows), index=EvaluationIndex(), seed=1, selection_rows=2, variants=3)
    assert data.report["left_out"] == {"no_tool_call": 1, "earlier_dialogue_turns": 1, "duplicate_tool_names": 1,
                                       "call_not_in_catalogue": 1}
    assert data.report["kept_rows"] == 13 and len(data.selection_rows) == 2
    assert len(data.train_choice) == 3 * (data.report["train"]["decisions"])
    assert {r.index for r in data.train_rows}.isdisjoint({r.index for r in data.selection_rows})


def test_contamination_drops_requests_and_tools_of_an_evaluation_suite(tmp_path):
    rows = _synthetic(10)
    index = EvaluationIndex()
    request = json.loads(json.dumps(rows[3]))["input"].split("<user>")[1].split("</user>")[0].strip()
    index.add("toolace", "t1", {"request": request,
                                "tools": [{"name": "x", "description": TOOLS[1][1] + " Variant 5."}]})
    index.add("toolace", "t2", {"request": "unrelated",
                                "tools": [{"name": "y", "description": TOOLS[0][1] + " Variant 7."}]})
    data = toolrl.build(_write(tmp_path, rows), index=index, seed=1, selection_rows=1, variants=1)
    assert [o["row"] for o in data.report["overlaps_evaluation_suite"]] == [3]
    assert data.report["left_out"] == {"overlaps_evaluation_suite": 1, "called_tool_in_evaluation_suite": 1}
    assert data.report["catalogue_tools_removed_as_in_evaluation_suite"] == 1  # row 5's uncalled Stock Quote
    for rec in data.train_choice + data.selection_choice:
        assert index.overlap(rec["id"], rec["state"]) is None


def test_gold_position_is_uniform_over_the_options(tmp_path):
    rows = _synthetic(200)
    data = toolrl.build(_write(tmp_path, rows), index=EvaluationIndex(), seed=4, selection_rows=10, variants=3)
    by_size: dict[int, Counter] = {}
    for rec in data.train_choice:
        labels = list(rec["questions"]["decision"]["criteria"])
        assert [t["name"] for t in rec["state"]["tools"]] == labels  # the state's catalogue is the options, in order
        by_size.setdefault(len(labels), Counter())[labels.index(rec["targets"]["decision"]["label"])] += 1
    assert set(by_size) >= {3, 4, 5, 6}
    for k, counts in by_size.items():
        assert len(counts) == k and max(counts.values()) - min(counts.values()) <= 1, (k, counts)
    policies = Counter(r["source"]["names"] for r in data.train_choice)
    assert set(policies) == set(toolrl.NAME_POLICIES) and max(policies.values()) == min(policies.values())


def test_renamed_catalogues_and_metadata_never_reach_the_prompt(tmp_path):
    """Only state and questions reach the model: the original names of a renamed catalogue, the
    reference output, ids and metadata appear in neither."""
    raw = _synthetic(40)
    data = toolrl.build(_write(tmp_path, raw), index=EvaluationIndex(), seed=2, selection_rows=4, variants=3)
    rows = {r.index: r for r in data.train_rows + data.selection_rows}
    rng = random.Random(0)
    recs = data.train_choice + nouls.tool_nouls(rng, data.train_rows, 40)
    recs += nouls.topic_nouls(rng, [(f"agnews_train:{i}", f"Article {i} text.", t) for i, t in
                                    enumerate(["world", "sports", "business", "sci_tech"] * 4)])
    recs += nouls.safety_nouls(rng, [(f"wj:{i}", f"Prompt {i}.", "harmful" if i % 2 else "benign") for i in range(8)])
    for rec in recs:
        req = request_from_json(rec)
        stripped = request_from_json({"state": rec["state"], "questions": rec["questions"]})
        assert (req.state, req.questions) == (stripped.state, stripped.questions)
        text = render_state(req.state) + "".join(render_question(q, "label-token", range(q.num_candidates))
                                                 for q in req.questions)
        for leak in (rec["id"], "<think>", "tool_call", "native_annotation", rec["category"],
                     json.dumps(rec["source"])):
            assert leak not in text, (leak, rec["id"])
        if rec["kind"] == "tool" and rec["source"]["names"] != "original":
            for t in rows[rec["source"]["row"]].tools:
                assert t.name not in text, (t.name, rec["id"])


def test_yes_and_no_are_balanced_within_each_source_and_class(tmp_path):
    rng = random.Random(7)
    topics = ["world", "sports", "business", "sci_tech"]
    ag = nouls.topic_nouls(rng, [(f"a{i}", f"Text {i}.", topics[i % 4]) for i in range(101)])
    wj = nouls.safety_nouls(rng, [(f"w{i}", f"Prompt {i}.", "harmful" if i % 3 else "benign") for i in range(90)])
    data = toolrl.build(_write(tmp_path, _synthetic(30)), index=EvaluationIndex(), seed=1, selection_rows=2, variants=1)
    tl = nouls.tool_nouls(rng, data.train_rows, 64)
    for recs in (ag, wj, tl):
        answers = Counter(r["targets"]["decision"]["label"] for r in recs)
        assert abs(answers["yes"] - answers["no"]) <= 1, answers
    by_topic = Counter((topics[int(r["source"]["key"][1:]) % 4], r["targets"]["decision"]["label"]) for r in ag)
    for t in topics:
        assert abs(by_topic[t, "yes"] - by_topic[t, "no"]) <= 1, by_topic
    by_class = Counter(("harmful" if int(r["source"]["key"][1:]) % 3 else "benign", r["targets"]["decision"]["label"])
                       for r in wj)
    assert by_class["harmful", "yes"] == by_class["harmful", "no"] == 30
    assert by_class["benign", "yes"] == by_class["benign", "no"] == 15
    assert Counter(r["targets"]["decision"]["label"] for r in tl) == {"yes": 32, "no": 32}
    assert Counter(r["source"]["form"] for r in tl) == {"catalogue": 32, "described": 32}
    # the wording varies: "yes" is not one fixed question
    yes_wordings = {r["questions"]["decision"]["instructions"] for r in wj
                    if r["targets"]["decision"]["label"] == "yes"}
    assert len(yes_wordings) > 5


def test_paraphrase_keeps_the_rest_of_a_description():
    rng = random.Random(0)
    seen = {nouls.paraphrase_description(rng, "Retrieves the specific details for a given user.") for _ in range(40)}
    assert len(seen) > 4
    assert all(s.endswith("for a given user.") or s.endswith("for a specified user.") for s in seen)
    assert all(s.split()[0] in ("Retrieves", "Fetches", "Gets", "Returns", "Looks") for s in seen)


# -- the real file -------------------------------------------------------------------------------------------

def _data_dir():
    from noulengine.eval.suites import resolve_data_dir

    d = resolve_data_dir(None)
    if d is None or not (d / toolrl.SOURCE_FILE).is_file():
        pytest.skip("no raw data root with toolrl_train (../shared/data or $NOULENGINE_DATA)")
    return d


def _toolace_index():
    from noulengine.eval.suites import get_suite
    from noulengine.train.contamination import index_suite

    index = EvaluationIndex()
    suite = get_suite("toolace")
    index_suite(index, suite, suite.prepare(None))
    return index


def test_real_file_drops_the_rows_whose_request_is_a_toolace_test_request():
    """The issue expected 9 such rows (SOURCE.md: first 80 characters folded). Measured under the
    project's overlap rule, and by 5-word-shingle overlap of every user turn: 6 rows (0, 48, 175,
    221, 257, 322); the 80-character rule also matches the shared "Role definition" preamble of
    ToolACE's dialogue-history rows, which is not a request."""
    data = toolrl.build(_data_dir() / toolrl.SOURCE_FILE, index=_toolace_index(), seed=20261231,
                        selection_rows=40, variants=3)
    hits = data.report["overlaps_evaluation_suite"]
    assert [h["row"] for h in hits] == [0, 48, 175, 221, 257, 322]
    assert all("'toolace'" in h["rule"] for h in hits)
    assert data.report["left_out"]["overlaps_evaluation_suite"] == 6


_HASH_SCRIPT = """
import hashlib, json, random, sys
from noulengine.curricula import nouls, toolrl
from noulengine.train.contamination import EvaluationIndex
path = sys.argv[1]
data = toolrl.build(path, index=EvaluationIndex(), seed=3, selection_rows=5, variants=3)
recs = data.train_choice + data.selection_choice + nouls.tool_nouls(random.Random(1), data.train_rows, 50)
recs += nouls.safety_nouls(random.Random(2), [(f"w{i}", f"P {i}", "harmful" if i % 2 else "benign") for i in range(20)])
print(hashlib.sha256(json.dumps(recs, sort_keys=True).encode()).hexdigest())
"""


def test_records_do_not_depend_on_the_hash_seed(tmp_path):
    from noulengine.eval.suites import resolve_data_dir

    d = resolve_data_dir(None)
    real = d is not None and (d / toolrl.SOURCE_FILE).is_file()
    path = d / toolrl.SOURCE_FILE if real else _write(tmp_path, _synthetic(40))
    out = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        res = subprocess.run([sys.executable, "-c", _HASH_SCRIPT, str(path)], env=env, capture_output=True, text=True,
                             check=True)
        out.add(res.stdout.strip())
    assert len(out) == 1


def test_v4_mix_adds_tool_and_noul_rows_and_held_out_selection(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import train_default

    from noulengine.train.contamination import build_evaluation_index
    from noulengine.train.data import load_training_rows

    _data_dir()
    info = train_default.build_data(_data_dir(), tmp_path, "v4")
    src = info["train"]["sources"]
    assert src["toolrl_source_rows_dropped_as_overlapping_an_evaluation_suite"] == 6
    assert src["v4_rows_dropped_as_overlapping_an_evaluation_suite"] == 0
    assert (src["noul_agnews"], src["noul_wildjailbreak"], src["noul_tool"], src["noul_yes"]) == (400, 300, 300, 500)
    assert 600 <= src["toolrl_choice"] <= 1500 and info["toolrl"]["left_out"]["overlaps_evaluation_suite"] == 6
    assert info["selection"]["kinds"]["noul"] == 180 and info["selection"]["kinds"]["tool"] >= 40
    train = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    sel = [json.loads(x) for x in (tmp_path / "selection.jsonl").read_text().splitlines()]

    def texts(rec):
        s = rec["state"]
        return {s} if isinstance(s, str) else {s.get("request") or s.get("text") or s.get("prompt")}

    seen = set().union(*(texts(r) for r in train))
    assert not any(texts(r) & seen for r in sel if r.get("kind"))  # held-out rows share no text with training
    v2 = train_default.build_data(_data_dir(), tmp_path / "v2", "v2")
    assert sel[:v2["selection"]["rows"]] == [json.loads(x) for x in (tmp_path / "v2" / "selection.jsonl")
                                             .read_text().splitlines()]
    index = build_evaluation_index()
    assert len(load_training_rows(tmp_path / "train.jsonl", index=index, soft_targets=True)) == len(train)
    assert len(load_training_rows(tmp_path / "selection.jsonl", index=index, role="selection")) == len(sel)
    assert hashlib.sha256((tmp_path / "train.jsonl").read_bytes()).hexdigest() == info["train"]["sha256"]
