"""Score questions read by their level texts under the label readouts (issue #22, item 1).

A score question whose levels all have descriptions is read by those texts ("can wait", "this
week", "today") under label-token and label-sequence, not by digits that carry no meaning; its
decision stays keyed by the levels ``"0".."n-1"``. Without descriptions it keeps the digits.
"""

from __future__ import annotations

import pytest
import torch

from noulengine import Engine
from noulengine.compile import Compiler, CompilerConfig
from noulengine.compile.render import candidate_texts, render_question, render_state
from noulengine.records import RecordError
from noulengine.records.schema import request_from_json
from tests.test_engine_equivalence import reference_view_logprobs

# On the tiny tokenizer: first tokens n/N, l/L, h/H (distinct).
DISTINCT = ["none", "low", "high"]
# "This" and "Today" both start with the token "T": label-token cannot tell them apart.
COLLIDING = ["can wait", "this week", "today"]


def score_request(criteria, state="The pump leaks.") -> dict:
    return {"state": state, "questions": {"urgency": {"type": "score", "instructions": "How urgent?",
                                                      "criteria": criteria}}}


def compile_one(tokenizer, readout: str, criteria):
    request = request_from_json(score_request(criteria))
    compiler = Compiler(tokenizer, CompilerConfig(readout=readout))
    return compiler, request, compiler.compile(request)


def answer_position_id(tokenizer, prompt_text: str, answer: str) -> int:
    """The tokenizer's own id of ``answer``'s first token after the whole chat prompt."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt_text}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = tokenizer(prompt + answer, add_special_tokens=False)["input_ids"]
    assert ids[:len(prompt_ids)] == prompt_ids and len(ids) > len(prompt_ids)
    return ids[len(prompt_ids)]


@pytest.mark.parametrize("readout", ["label-token", "auto"])
def test_label_token_reads_the_first_tokens_of_the_level_texts(tiny_tokenizer, readout):
    compiler, request, compiled = compile_one(tiny_tokenizer, readout, DISTINCT)
    plan = compiled.questions[0]
    assert plan.mode == "label-token" and plan.labels == ("0", "1", "2")
    q = request.questions[0]
    assert candidate_texts(q, "label-token") == tuple(DISTINCT)
    text = render_state(request.state) + render_question(q, plan.mode, range(3))
    read_at = compiled.input_tokens - 1  # one question, one branch: its last token is the answer cue
    assert set(plan.term_pos) == {read_at}
    expected = []
    for cand, level in enumerate(DISTINCT):
        spellings = dict.fromkeys(answer_position_id(tiny_tokenizer, text, s) for s in (level, level.capitalize()))
        expected += [(cand, tid) for tid in spellings]
    got = [(plan.alt_vc[a], tok) for tok, a in zip(plan.term_tok, plan.term_alt)]
    assert got == expected
    digits = {tiny_tokenizer.convert_tokens_to_ids(d) for d in "012"}
    assert not digits & set(plan.term_tok)


def test_label_token_refuses_colliding_level_texts_and_auto_reads_them_as_sequences(tiny_tokenizer):
    with pytest.raises(RecordError, match="level texts whose first tokens are distinct") as info:
        compile_one(tiny_tokenizer, "label-token", COLLIDING)
    assert info.value.field == "questions.urgency"
    compiler, request, compiled = compile_one(tiny_tokenizer, "auto", COLLIDING)
    plan = compiled.questions[0]
    assert plan.mode == "label-sequence" and plan.labels == ("0", "1", "2")
    # each level's sequence is its own text (and capitalised spelling) + the end-of-answer token
    variants = compiler.question_variants(request.questions[0], plan.mode)
    assert [v[0] for v in variants] == COLLIDING
    for a, vc in enumerate(plan.alt_vc):
        seq = [tok for tok, alt in zip(plan.term_tok, plan.term_alt) if alt == a]
        assert seq[-1] == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert tiny_tokenizer.decode(seq[:-1]) in variants[vc]


@pytest.mark.parametrize("readout", ["auto", "symbols", "label-token", "label-sequence"])
@pytest.mark.parametrize("criteria", [[None, None, None], ["can wait", None, "today"], ["x", "", "y"], ["x", " ", "y"],
                                      ["x", "x", "y"], ["x", " x\n", "y"]])
def test_a_score_without_its_own_level_texts_keeps_the_digits(tiny_tokenizer, readout, criteria):
    """Any level without a description (none, empty or blank), or two levels with the same one,
    keeps today's digits."""
    compiler, request, compiled = compile_one(tiny_tokenizer, readout, criteria)
    plan, q = compiled.questions[0], request.questions[0]
    assert plan.mode == ("symbols" if readout == "auto" else readout)
    assert candidate_texts(q, plan.mode) == ("0", "1", "2")
    digits = [tiny_tokenizer.convert_tokens_to_ids(d) for d in "012"]
    first_per_alt = {a: tok for tok, a in reversed(list(zip(plan.term_tok, plan.term_alt)))}  # each alt's first term
    assert [first_per_alt[a] for a in range(len(plan.alt_vc))] == digits and plan.alt_vc == [0, 1, 2]
    text = render_question(q, plan.mode, range(3))
    assert "Answer with the level number only." in text and "\n0" in text


def test_symbols_mode_keeps_digits_for_level_texts(tiny_tokenizer):
    _, request, compiled = compile_one(tiny_tokenizer, "symbols", DISTINCT)
    plan = compiled.questions[0]
    assert plan.term_tok == [tiny_tokenizer.convert_tokens_to_ids(d) for d in "012"]
    text = render_question(request.questions[0], "symbols", range(3))
    assert text.splitlines()[1:] == ["Levels:", "0: none", "1: low", "2: high", "Answer with the level number only."]


@pytest.mark.parametrize("readout", ["label-token", "label-sequence"])
def test_level_texts_render_lowest_first_without_digits(tiny_tokenizer, readout):
    criteria = DISTINCT if readout == "label-token" else COLLIDING
    compiler, request, compiled = compile_one(tiny_tokenizer, readout, criteria)
    text = render_question(request.questions[0], readout, range(3))
    assert text.splitlines()[1:] == ["Levels:", *[f"- {t}" for t in criteria], "Answer with the level text only."]
    assert not any(f"{d}:" in text for d in "012")
    branch = tiny_tokenizer.decode(compiled.token_ids)
    assert "Answer with the level text only." in branch and not any(f"{d}:" in branch for d in "012")


@pytest.mark.parametrize("readout", ["auto", "label-token", "label-sequence"])
def test_decision_is_keyed_by_levels_and_equals_separate_runs(tiny_llama, tiny_tokenizer, readout):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, readout=readout)
    criteria = DISTINCT if readout == "label-token" else COLLIDING
    req = score_request(criteria)
    compiled = engine.compile(req)
    plan = compiled.questions[0]
    assert plan.mode == ("label-token" if readout == "label-token" else "label-sequence")
    answer = engine.decide(req).answers["urgency"]
    assert list(answer.probabilities) == ["0", "1", "2"]
    assert abs(sum(answer.probabilities.values()) - 1) < 1e-9
    ref = torch.softmax(reference_view_logprobs(tiny_llama, compiled, plan)[0], 0)
    got = torch.tensor([answer.probabilities[lab] for lab in plan.labels], dtype=torch.float64)
    assert torch.allclose(got, ref, atol=1e-4), (got, ref)


def test_level_texts_are_read_without_surrounding_whitespace(tiny_tokenizer):
    padded = [" none", "low\n", "  high "]
    _, request, compiled = compile_one(tiny_tokenizer, "label-token", padded)
    _, _, clean = compile_one(tiny_tokenizer, "label-token", DISTINCT)
    assert candidate_texts(request.questions[0], "label-token") == tuple(DISTINCT)
    assert compiled.token_ids == clean.token_ids and compiled.questions[0].term_tok == clean.questions[0].term_tok
