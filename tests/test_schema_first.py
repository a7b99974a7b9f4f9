"""The schema-first prompt layout (issue #32): the questions first, then the state, one cue per question.

Each branch's answer must equal a plain forward pass over that branch's whole prompt (tokenized
whole, independently of the compiler's tree), cached and uncached, batched and alone; the
questions form a token prefix shared by every request that asks them, which the prefix store
prefills once.
"""

from __future__ import annotations

import copy

import pytest
import torch

from noulengine import Engine
from noulengine.compile.compiler import Compiler, CompilerConfig
from noulengine.compile.layout import common_prefix_length
from noulengine.compile.render import (layout_of_prompt_version, prompt_version, render_cue, render_evidence,
                                       render_schema)
from noulengine.compile.symbols import SYMBOLS
from noulengine.records.errors import OverlengthError
from noulengine.records.schema import request_from_json
from tests.conftest import three_question_request
from tests.test_engine_equivalence import reference_view_logprobs

TOL = 1e-5


def _schema_engine(model, tokenizer, **kw) -> Engine:
    return Engine.from_model(model, tokenizer, layout="schema-first", **kw)


def _whole_prompt_ids(compiler: Compiler, request: dict, field: str, view: int = 0) -> tuple[int, ...]:
    """The token ids of one branch's whole prompt ``HEAD + schema + state + cue + TAIL``, tokenized
    as one text, independently of the compiler's tree (special tokens only from the template)."""
    req = request_from_json(request)
    modes = [compiler.choose_mode(q) for q in req.questions]
    q = next(q for q in req.questions if q.field == field)
    mode = modes[[x.field for x in req.questions].index(field)]
    k = q.num_candidates
    rotation = compiler._rotations(q)[view]
    text = (render_schema(req.questions, modes) + render_evidence(req.state)
            + render_cue(q, mode, [(s + rotation) % k for s in range(k)], SYMBOLS))
    f = compiler.frame
    return f.head_fixed_ids + compiler.tok.encode_user(f.head_join + text + f.tail_join) + f.tail_fixed_ids


def _branch_context(compiled, plan, view: int = 0) -> list[int]:
    """The token ids a branch's first read position sees in the packed tree (its ancestors + itself)."""
    pos = plan.term_pos[plan.alt_vc.index(view * plan.num_candidates)]
    seg, parents = compiled.segment_ids, compiled.parents
    chain, s = [], seg[pos]
    while s >= 0:
        chain.append(s)
        s = parents[s]
    return [compiled.token_ids[i] for i in range(pos + 1) if seg[i] in chain]


def _probs(decision, plan) -> torch.Tensor:
    ans = decision.answers[plan.field]
    return torch.tensor([ans.probabilities[lab] for lab in plan.labels], dtype=torch.float64)


# ------------------------------------------------------------------------------ the prompt
def test_layout_names_and_prompt_versions():
    assert prompt_version("state-first") == "noul-prompt-3"  # unchanged: models trained before layouts
    assert prompt_version("schema-first") == "noul-prompt-3+schema-first"
    assert layout_of_prompt_version("noul-prompt-3") == "state-first"
    assert layout_of_prompt_version(None) == "state-first"
    assert layout_of_prompt_version("noul-prompt-3+schema-first") == "schema-first"
    with pytest.raises(ValueError, match="layout"):
        CompilerConfig(layout="questions-last")


def test_schema_text_lists_every_question_before_the_state_and_cues_repeat_labels_only(tiny_tokenizer):
    compiler = Compiler(tiny_tokenizer, CompilerConfig(layout="schema-first", readout="label-sequence"))
    req = three_question_request()
    compiled = compiler.compile(request_from_json(req))
    text = compiler.tok.decode(compiled.token_ids[:compiled.prefix_tokens])
    # the schema (instructions, options with descriptions) comes before the evidence
    assert text.index("Which topic?") < text.index("How risky?") < text.index("Should a human") < text.index(
        "Evidence:") < text.index("rejected 3 logins")
    assert "World news." in text and "Escalate." in text
    cue = render_cue(request_from_json(req).questions[0], "label-sequence", range(4))
    assert "world | business | human_review | observe" in cue and "World news." not in cue
    assert '"topic"' in cue


@pytest.mark.parametrize("readout", ["auto", "symbols", "label-token", "label-sequence"])
def test_branch_tokens_are_the_whole_prompt_tokenization(tiny_tokenizer, readout):
    compiler = Compiler(tiny_tokenizer, CompilerConfig(layout="schema-first", readout=readout))
    req = three_question_request()
    compiled = compiler.compile(request_from_json(req))
    for plan in compiled.questions:
        assert tuple(_branch_context(compiled, plan)) == _whole_prompt_ids(compiler, req, plan.field)


def test_smollm2_branch_tokens_are_the_whole_prompt_tokenization(smollm2_tokenizer):
    """The real tokenizer merges across piece boundaries; the tree must still be the whole text's ids."""
    compiler = Compiler(smollm2_tokenizer, CompilerConfig(layout="schema-first", readout="auto"))
    for state in ("My card was charged twice.", {"ticket": "x", "n": 3}, "\n\nleading newlines", " space"):
        req = three_question_request(state=state)
        compiled = compiler.compile(request_from_json(req))
        for plan in compiled.questions:
            assert tuple(_branch_context(compiled, plan)) == _whole_prompt_ids(compiler, req, plan.field)
        # the static prefix holds the questions and no state token
        static = compiled.token_ids[:compiled.static_tokens]
        assert "Which topic?" in compiler.tok.decode(static) and "Evidence" in compiler.tok.decode(static)
        assert compiled.static_tokens <= compiled.prefix_tokens


def test_static_prefix_is_shared_by_requests_with_the_same_questions(tiny_tokenizer):
    schema = Compiler(tiny_tokenizer, CompilerConfig(layout="schema-first"))
    state = Compiler(tiny_tokenizer, CompilerConfig(layout="state-first"))
    a = schema.compile(request_from_json(three_question_request(state="first ticket")))
    b = schema.compile(request_from_json(three_question_request(state={"other": "state"})))
    assert a.static_tokens == b.static_tokens
    assert a.token_ids[:a.static_tokens] == b.token_ids[:b.static_tokens]
    # far longer than the frame head, which is all the state-first layout shares
    sa = state.compile(request_from_json(three_question_request(state="first ticket")))
    assert sa.static_tokens == len(state.frame_head_ids())
    assert a.static_tokens > 3 * sa.static_tokens
    # the frame head is common to every schema (it must not hold the probe's own question)
    head = schema.frame_head_ids()
    assert tuple(a.token_ids[:len(head)]) == head and len(head) < a.static_tokens


# ------------------------------------------------------------------------------ equivalence
@pytest.mark.parametrize("readout", ["auto", "symbols", "label-token", "label-sequence"])
def test_each_branch_equals_a_plain_forward_pass_of_its_whole_prompt(tiny_model, tiny_tokenizer, readout):
    engine = _schema_engine(tiny_model, tiny_tokenizer, readout=readout, prefix_cache_mb=0)
    req = three_question_request()
    compiled = engine.compile(req)
    decision = engine.decide(req)
    for plan in compiled.questions:
        assert tuple(_branch_context(compiled, plan)) == _whole_prompt_ids(engine.compiler, req, plan.field)
        ref = torch.softmax(reference_view_logprobs(tiny_model, compiled, plan)[0], 0)
        assert torch.allclose(_probs(decision, plan), ref, atol=TOL), plan.field


def test_permute_views_equal_plain_forward_passes(tiny_llama, tiny_tokenizer):
    engine = _schema_engine(tiny_llama, tiny_tokenizer, readout="symbols", debias="permute", prefix_cache_mb=0)
    req = three_question_request()
    compiled = engine.compile(req)
    plan = compiled.questions[0]
    assert plan.num_views == 4
    for view in range(4):
        assert tuple(_branch_context(compiled, plan, view)) == _whole_prompt_ids(engine.compiler, req, "topic", view)
    expected = torch.softmax(reference_view_logprobs(tiny_llama, compiled, plan).mean(0), 0)
    assert torch.allclose(_probs(engine.decide(req), plan), expected, atol=TOL)


def _requests(n: int, questions_from=three_question_request, offset: int = 0) -> list[dict]:
    return [questions_from(state=f"ticket {i + offset}: {'login failed ' * (1 + i % 3)}") for i in range(n)]


@pytest.mark.parametrize("path", ["causal", "tree", "cached"])
def test_cached_and_batched_answers_equal_the_uncached_single_answers(tiny_llama, tiny_tokenizer, path):
    """Through each engine path (one question: causal; several: tree, or prefix-cached), with the
    prefix store warm on the schema, batched with neighbours: the same answers as one request alone
    without any cache, within 1e-5."""
    one_question = path == "causal"

    def make(state):
        req = three_question_request(state=state)
        if one_question:
            req["questions"] = {"topic": req["questions"]["topic"]}
        return req

    reqs = [make(f"ticket {i}: " + "login failed " * (1 + i % 3)) for i in range(6)]
    plain = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_mb=0)
    alone = [plain.decide(r) for r in reqs]
    kw = {"prefix_cache_min_tokens": 0} if path == "cached" else {}
    if path == "tree":
        kw = {"prefix_cache": False}
    cached = _schema_engine(tiny_llama, tiny_tokenizer, **kw)
    first = cached.decide_batch(reqs[:1]) + cached.decide_batch(reqs[1:2])  # the second sees the schema again
    batched = cached.decide_batch(reqs[2:], batch_tokens=4096)
    for a, b in zip(alone, first + batched):
        assert a.ok and b.ok
        for fld, ans in a.answers.items():
            assert max(abs(x - y) for x, y in zip(ans.logprobs, b.answers[fld].logprobs)) < TOL, fld
    if path != "tree":
        stats = cached.prefix_store.stats
        assert stats.hit_tokens > 0
        static = cached.compile(reqs[0]).static_tokens
        assert cached.prefix_store.lookup(cached.compile(reqs[0]).token_ids, static) is not None


def test_two_schemas_interleaved_in_one_batch(tiny_llama, tiny_tokenizer):
    def other(state):
        return {"state": state, "questions": {
            "route": {"type": "choice", "instructions": "Which team handles this?",
                      "criteria": {"billing": "Payments and refunds", "shipping": "Delivery problems",
                                   "tech": "Website or app errors"}},
            "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}}

    reqs = [r for pair in zip(_requests(8), _requests(8, other)) for r in pair]  # a, b, a, b, ...
    plain = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_mb=0)
    alone = [plain.decide(r) for r in reqs]
    cached = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0)
    got = cached.decide_batch(reqs, batch_tokens=1 << 16)
    for a, b in zip(alone, got):
        for fld, ans in a.answers.items():
            assert max(abs(x - y) for x, y in zip(ans.logprobs, b.answers[fld].logprobs)) < TOL
    store = cached.prefix_store
    for r in (reqs[0], reqs[1]):  # both schemas are stored
        c = cached.compile(r)
        assert len(store.lookup(c.token_ids, c.static_tokens)) == c.static_tokens
    assert store.stats.token_hit_rate > 0.4


def test_thousands_of_requests_on_one_schema_keep_it_cached_under_eviction(tiny_llama, tiny_tokenizer):
    """A small budget that holds a few prefixes: every request's own prefix is stored and evicted
    (LRU), the schema (used by every request) and the pinned frame head stay; the hit rate is high."""
    engine = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0)
    probe = engine.compile(three_question_request(state="x"))
    per_token = 2 * 2 * 64 * 4  # layers x (keys + values) x hidden x float32 bytes (tiny Llama: 4 KV heads x 16)
    engine.prefix_store.max_bytes = per_token * probe.input_tokens * 4
    reqs = _requests(2000)
    out = []
    for start in range(0, len(reqs), 250):
        out += engine.decide_batch(reqs[start:start + 250])
    assert all(d.ok for d in out)
    store = engine.prefix_store
    assert store.stats.evictions > 100 and store.nbytes <= store.max_bytes
    static = probe.static_tokens
    assert len(store.lookup(probe.token_ids, static)) == static  # the schema survived 2,000 requests
    assert any(e.pinned for e in store._entries.values())  # and so did the frame head
    assert store.stats.token_hit_rate > 0.5, store.stats.to_dict()
    # spot-check exactness after all that churn
    plain = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_mb=0)
    for i in (0, 777, 1999):
        ref = plain.decide(reqs[i])
        for fld, ans in ref.answers.items():
            assert max(abs(x - y) for x, y in zip(ans.logprobs, out[i].answers[fld].logprobs)) < TOL


def test_a_cold_schema_is_not_prefilled_apart(tiny_llama, tiny_tokenizer):
    """A schema seen once (cold) runs as one pass: no extra prefill of a prefix nobody reuses; seen a
    second time, it is stored and reused."""
    engine = _schema_engine(tiny_llama, tiny_tokenizer)
    q = {"type": "noul", "instructions": "Is the ticket about a refund or a charge?"}
    engine.decide({"state": "a", "questions": {"unique_field_1": q}})
    inserts = engine.prefix_store.stats.inserts  # the pinned frame head only
    engine.decide({"state": "b", "questions": {"unique_field_2": q}})
    assert engine.prefix_store.stats.inserts == inserts
    engine.decide({"state": "c", "questions": {"unique_field_2": q}})  # seen again: stored
    assert engine.prefix_store.stats.inserts == inserts + 1


def test_a_schema_admitted_when_its_state_is_stored_whole_is_kept_from_that_entry(tiny_llama, tiny_tokenizer):
    """A request asked twice: the first time its whole prefix is stored (its schema, seen once, is
    not); the second time the schema is admitted but the whole prefix is found, so nothing is
    computed. The schema must still be stored (the whole entry's first tokens, the same bits as
    computing it), or the next request on a new state recomputes it (the layout bench's warm run
    paid that: a hit rate of 52% instead of 58%)."""
    from noulengine.engine.prefix_store import prefix_chain

    engine = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0)
    req = three_question_request(state="the same ticket, asked twice: " + "login failed " * 4)
    c = engine.compile(req)
    static, store = c.static_tokens, engine.prefix_store
    engine.decide(req)
    assert store.lookup(c.token_ids, static) is None or len(store.lookup(c.token_ids, static)) != static
    engine.decide(req)
    kept = store.lookup(c.token_ids, static)
    assert kept is not None and len(kept) == static and kept.static
    whole = store.lookup(c.token_ids, c.prefix_tokens)
    assert all(k.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
               for k, w in zip(kept.keys, whole.keys))  # a copy, not a view holding the whole entry
    # the same bits as the schema computed along its own cuts, with no store
    head = engine._frame_head_len()
    with torch.inference_mode():
        direct, _, _ = prefix_chain(engine.runner, None, c.token_ids, [head, static], chunk=engine.config.chunk_tokens)
    for a, b in zip((*kept.keys, *kept.values), (*direct.keys, *direct.values)):
        assert torch.equal(a, b)
    # a new state on the same schema reuses it, and answers as a fresh engine does, bit for bit
    other = three_question_request(state="a new ticket")
    before = store.stats.hit_tokens
    got = engine.decide(other)
    assert store.stats.hit_tokens - before >= static
    fresh = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_min_tokens=0).decide(other)
    for fld, ans in fresh.answers.items():
        assert ans.logprobs == got.answers[fld].logprobs, fld


# ------------------------------------------------------------------------------ what an answer depends on
def test_an_answer_never_depends_on_another_questions_answer(tiny_llama, tiny_tokenizer):
    """Branches are isolated (tree mask): another question's cue, label readout children or answer
    never reach a branch. Its prompt holds the whole schema, so rewording another question changes the
    schema every branch reads (and so every answer), exactly as a plain forward pass of the new prompt."""
    engine = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_mb=0)
    a = three_question_request()
    b = copy.deepcopy(a)
    b["questions"]["risk"]["instructions"] = "How risky!"
    da, db = engine.decide(a), engine.decide(b)
    assert da.answers["topic"].logprobs != db.answers["topic"].logprobs  # the schema changed
    cb = engine.compile(b)
    for plan in cb.questions:
        assert tuple(_branch_context(cb, plan)) == _whole_prompt_ids(engine.compiler, b, plan.field)
        ref = torch.softmax(reference_view_logprobs(tiny_llama, cb, plan)[0], 0)
        assert torch.allclose(_probs(db, plan), ref, atol=TOL)
    # the branch of "topic" holds no token of the other questions' cues
    ca = engine.compile(a)
    topic_ctx = _branch_context(ca, ca.questions[0])
    assert tuple(topic_ctx[ca.prefix_tokens:]) == tuple(
        _whole_prompt_ids(engine.compiler, a, "topic")[ca.prefix_tokens:])


@pytest.mark.parametrize("change", ["reorder", "add"])
def test_reordering_or_adding_a_question_changes_the_prompt_each_branch_reads(tiny_llama, tiny_tokenizer, change):
    """Schema-first: the set and order of the questions are part of every branch's prompt, so
    reordering or adding a question gives each answer the plain forward pass of the new prompt (it
    may change). State-first: each branch reads only the state and its own question, so the same
    change leaves every answer the same (bit-identical when the packed length is unchanged; within
    float rounding of other matmul shapes when a question is added)."""
    base = three_question_request()
    changed = copy.deepcopy(base)
    if change == "reorder":
        changed["questions"] = dict(reversed(list(base["questions"].items())))
    else:
        changed["questions"]["extra"] = {"type": "noul", "instructions": "Is it spam?"}
    schema = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_mb=0)
    d0, d1 = schema.decide(base), schema.decide(changed)
    c1 = schema.compile(changed)
    for plan in c1.questions:
        ref = torch.softmax(reference_view_logprobs(tiny_llama, c1, plan)[0], 0)
        assert torch.allclose(_probs(d1, plan), ref, atol=TOL)
    assert any(d0.answers[f].logprobs != d1.answers[f].logprobs for f in base["questions"])
    state = Engine.from_model(tiny_llama, tiny_tokenizer, layout="state-first", prefix_cache_mb=0)
    s0, s1 = state.decide(base), state.decide(changed)
    for f in base["questions"]:
        if change == "reorder":
            assert s0.answers[f].logprobs == s1.answers[f].logprobs
        else:
            assert max(abs(x - y) for x, y in zip(s0.answers[f].logprobs, s1.answers[f].logprobs)) < TOL


# ------------------------------------------------------------------------------ limits
def test_255_options_and_overlength_refusal(tiny_llama, tiny_tokenizer):
    engine = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_mb=0, readout="label-sequence", max_positions=8192)
    many = {"state": "pick one", "questions": {"pick": {"type": "choice", "instructions": "Which?",
                                                        "criteria": {f"opt{i}": None for i in range(255)}}}}
    d = engine.decide(many)
    assert len(d.answers["pick"].probabilities) == 255
    assert abs(sum(d.answers["pick"].probabilities.values()) - 1) < 1e-9
    small = _schema_engine(tiny_llama, tiny_tokenizer, prefix_cache_mb=0, max_positions=64)
    with pytest.raises(OverlengthError, match="Nothing is truncated"):
        small.decide(three_question_request(state="long " * 100))


def test_describe_and_calibration_record_the_layout(tiny_llama, tiny_tokenizer):
    from noulengine.calibrate.file import CalibrationFileError, check_engine, parse_calibration

    engine = _schema_engine(tiny_llama, tiny_tokenizer)
    desc = engine.describe()
    assert desc["layout"] == "schema-first" and desc["prompt_version"] == "noul-prompt-3+schema-first"
    cal = parse_calibration({"format": "noulengine-calibration", "version": 1, "model": None, "readout": "auto",
                             "debias": "none", "layout": "state-first", "group_by": "global",
                             "groups": {"global": {"temperature": 1.5}}})
    with pytest.raises(CalibrationFileError, match="layout 'state-first'"):
        check_engine(cal, engine)
    legacy = parse_calibration({"format": "noulengine-calibration", "version": 1, "model": None, "readout": "auto",
                                "debias": "none", "group_by": "global", "groups": {"global": {"temperature": 1.5}}})
    assert legacy.layout == "state-first"  # files written before layouts existed
    check_engine(legacy, Engine.from_model(tiny_llama, tiny_tokenizer))


def test_common_prefix_length_is_the_static_prefix_bound(tiny_tokenizer):
    compiler = Compiler(tiny_tokenizer, CompilerConfig(layout="schema-first"))
    a = compiler.compile(request_from_json(three_question_request(state="zzz")))
    b = compiler.compile(request_from_json(three_question_request(state="{}")))
    assert common_prefix_length(a.token_ids, b.token_ids, 10_000) >= a.static_tokens


def test_a_model_trained_schema_first_is_served_schema_first(tmp_path, tiny_tokenizer, tiny_llama):
    """training.json records the layout; from_pretrained serves that layout unless asked otherwise,
    and a calibration fitted under it applies only under it."""
    import json

    from noulengine.calibrate.file import FORMAT, VERSION
    from noulengine.train import TrainConfig
    from noulengine.train.contamination import EvaluationIndex
    from noulengine.train.trainer import train
    from tests.test_train import save_tiny, toy_rows, write

    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", toy_rows(8, 0))
    train(TrainConfig(data=str(data), output=str(tmp_path / "out"), model=str(model_dir), lora_r=4, max_steps=1,
                      layout="schema-first", progress=False), evaluation_index=EvaluationIndex())
    out = tmp_path / "out"
    meta = json.loads((out / "training.json").read_text())
    assert meta["layout"] == "schema-first" and meta["prompt_version"] == "noul-prompt-3+schema-first"
    served = Engine.from_pretrained(str(out))
    assert served.compiler.layout == "schema-first"
    assert Engine.from_pretrained(str(out), layout="state-first").compiler.layout == "state-first"
    cal = {"format": FORMAT, "version": VERSION, "model": {"name": "out", "sha256": served.identity.sha256},
           "readout": "symbols", "debias": "none", "layout": "schema-first", "group_by": "global",
           "groups": {"global": {"temperature": 2.0}}}
    (out / "calibration.json").write_text(json.dumps(cal))
    assert Engine.from_pretrained(str(out)).calibration is not None
    assert Engine.from_pretrained(str(out), layout="state-first").calibration is None  # fitted under another layout


def test_eval_run_key_holds_a_non_default_layout():
    from noulengine.eval.run_state import run_key

    base = {"model": {"sha256": "x"}, "readout": "auto", "debias": "none", "dtype": "float32", "config": {}}
    old = run_key({**base, "layout": "state-first"}, suite="s", limit=None, sample=None, seed=0)
    assert "layout" not in old  # folders written before layouts existed keep matching
    new = run_key({**base, "layout": "schema-first"}, suite="s", limit=None, sample=None, seed=0)
    assert new["layout"] == "schema-first"


def test_layout_bench_measures_both_layouts_warm_and_cold(tiny_llama, tiny_tokenizer):
    """The bench's layout comparison on a tiny model: every (layout, mode) variant runs, the warm
    schema-first run reuses the cached questions, the cold one cannot, accuracy follows renamed fields."""
    from noulengine.bench.layouts import LayoutWorkload, cold_request, layouts_markdown, measure_layouts

    reqs = [request_from_json(three_question_request(state=f"ticket {i}: login failed")) for i in range(4)]
    golds = [{"topic": "world", "flag": "yes"} for _ in reqs]
    engines = {layout: Engine.from_model(tiny_llama, tiny_tokenizer, layout=layout, prefix_cache_min_tokens=0)
               for layout in ("state-first", "schema-first")}
    lines = []
    out = measure_layouts(engines, LayoutWorkload("t", "tiny", reqs, golds), reps=2, sync=lambda: None,
                          progress=lines.append)
    v = out["variants"]
    assert set(v) == {"state-first/warm", "state-first/cold", "schema-first/warm", "schema-first/cold"}
    assert len(lines) == 8  # one line per variant and repetition
    assert v["schema-first/warm"]["hit_rate"] > 0.4 and v["schema-first/cold"]["hit_rate"] < 0.2
    assert v["schema-first/warm"]["hit_rate"] > v["state-first/warm"]["hit_rate"]
    for r in v.values():
        assert r["decisions_per_s"] > 0 and 0.0 <= r["accuracy"] <= 1.0
    # a cold request shares no static prefix with another
    c0, c1 = (engines["schema-first"].compile(cold_request(r, i)) for i, r in enumerate(reqs[:2]))
    assert c0.token_ids[:c0.static_tokens] != c1.token_ids[:c1.static_tokens]
    table = layouts_markdown({"model": "tiny", "weights": "random", "device": "cpu", "dtype": "float32",
                              "threads": 1, "reps": 2, "git_revision": "x", "workloads": [out]})
    assert "schema_vs_state_warm" in table
