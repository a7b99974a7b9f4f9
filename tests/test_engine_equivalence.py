"""The packed one-pass engine against plain transformers forward passes of the same tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from noulengine import Engine
from tests.conftest import three_question_request


def reference_view_logprobs(model, compiled, plan) -> torch.Tensor:
    """(V, K) candidate log-probs from separate plain forward passes (full head, causal mask).

    Each read position's context is rebuilt from the packed tree: the tokens of its ancestors
    plus its own segment up to it, run alone with default positions.
    """
    seg, parents, ids = compiled.segment_ids, compiled.parents, compiled.token_ids

    def context(pos):
        chain, s = [], seg[pos]
        while s >= 0:
            chain.append(s)
            s = parents[s]
        keep = [i for i in range(pos + 1) if seg[i] in chain]
        return [ids[i] for i in keep]

    term_logp = []
    with torch.no_grad():
        for pos, tok in zip(plan.term_pos, plan.term_tok):
            ctx = torch.tensor([context(pos)])
            logits = model(input_ids=ctx).logits[0, -1].float()
            term_logp.append(torch.log_softmax(logits, -1)[tok])
    alt = torch.zeros(len(plan.alt_vc), dtype=torch.float64)
    for a, lp in zip(plan.term_alt, term_logp):
        alt[a] += lp.double()
    vc = torch.full((plan.num_views * plan.num_candidates,), float("-inf"), dtype=torch.float64)
    for a, v in enumerate(plan.alt_vc):
        vc[v] = torch.logaddexp(vc[v], alt[a])
    return vc.view(plan.num_views, plan.num_candidates)


@pytest.mark.parametrize("readout", ["auto", "symbols", "label-token", "label-sequence"])
def test_one_pass_equals_separate_runs(tiny_model, tiny_tokenizer, readout):
    engine = Engine.from_model(tiny_model, tiny_tokenizer, readout=readout)
    req = three_question_request()
    compiled = engine.compile(req)
    assert compiled.max_position < compiled.input_tokens  # branches really share the prefix
    decision = engine.decide(req)
    for plan in compiled.questions:
        ref = torch.softmax(reference_view_logprobs(tiny_model, compiled, plan)[0], 0)
        got = torch.tensor([decision.answers[plan.field].probabilities[lab] for lab in plan.labels], dtype=torch.float64)
        assert torch.allclose(got, ref, atol=1e-4), (plan.field, got, ref)
        assert abs(got.sum().item() - 1) < 1e-9


def test_permute_views_equal_separate_runs(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, readout="symbols", debias="permute")
    req = three_question_request()
    compiled = engine.compile(req)
    plan = compiled.questions[0]
    assert plan.num_views == 4
    ref = reference_view_logprobs(tiny_llama, compiled, plan)
    answer = engine.decide(req).answers["topic"]
    expected = torch.softmax(ref.mean(0), 0)
    got = torch.tensor([answer.probabilities[lab] for lab in plan.labels], dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-4)
    assert answer.flip_rate is not None and 0.0 <= answer.flip_rate <= 1.0


def assert_branch_change_is_isolated(engine, request: dict) -> None:
    """Rewording one question (same token count) leaves the other questions' log-probs
    bit-identical and changes its own (``request``: :func:`three_question_request`-shaped)."""
    b = copy.deepcopy(request)
    b["questions"]["risk"]["instructions"] = "How risky!"  # the same number of tokens
    ca, cb = engine.compile(request), engine.compile(b)
    assert ca.input_tokens == cb.input_tokens and ca.token_ids != cb.token_ids
    da, db = engine.decide(request), engine.decide(b)
    for fld in ("topic", "flag"):
        assert da.answers[fld].logprobs == db.answers[fld].logprobs
    assert da.answers["risk"].logprobs != db.answers["risk"].logprobs


def test_changing_one_branch_leaves_others_bit_identical(tiny_model, tiny_tokenizer):
    assert_branch_change_is_isolated(Engine.from_model(tiny_model, tiny_tokenizer), three_question_request())


def test_sliding_window_model_with_long_prefix(tiny_gemma3, tiny_tokenizer):
    """Prefix far longer than the 16-token window: the sliding mask must follow position ids."""
    engine = Engine.from_model(tiny_gemma3, tiny_tokenizer)
    assert engine.runner.sliding_window == 16
    req = three_question_request(state="the agent trace " * 40)
    compiled = engine.compile(req)
    decision = engine.decide(req)
    for plan in compiled.questions:
        ref = torch.softmax(reference_view_logprobs(tiny_gemma3, compiled, plan)[0], 0)
        got = torch.tensor([decision.answers[plan.field].probabilities[lab] for lab in plan.labels], dtype=torch.float64)
        assert torch.allclose(got, ref, atol=1e-4)


def test_eager_attention_matches_sdpa(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    sdpa = LlamaForCausalLM(cfg).eval()
    cfg_eager = copy.deepcopy(cfg)
    cfg_eager._attn_implementation = "eager"
    eager = LlamaForCausalLM(cfg_eager).eval()
    eager.load_state_dict(sdpa.state_dict())
    assert eager.config._attn_implementation == "eager"
    req = three_question_request()
    ds = Engine.from_model(sdpa, tiny_tokenizer).decide(req)
    de = Engine.from_model(eager, tiny_tokenizer).decide(req)
    for fld, ans in ds.answers.items():
        for lab, p in ans.probabilities.items():
            assert abs(p - de.answers[fld].probabilities[lab]) < 1e-5


def test_answer_independent_of_batch_neighbours_and_slot(tiny_model, tiny_tokenizer):
    engine = Engine.from_model(tiny_model, tiny_tokenizer)
    target = three_question_request(state="short")
    others = [three_question_request(state="a much longer state " * k) for k in (1, 5, 9)]
    alone = engine.decide(target)
    for batch in ([target] + others, others + [target], [others[1], target, others[0]]):
        for budget in (100_000, 300):
            out = engine.decide_batch(batch, batch_tokens=budget)
            got = out[batch.index(target)]
            for fld, ans in alone.answers.items():
                for lab, p in ans.probabilities.items():
                    assert abs(got.answers[fld].probabilities[lab] - p) < 1e-5
                    assert torch.isfinite(torch.tensor(got.answers[fld].logprobs)).all()


def test_only_candidate_rows_of_the_head_are_used(tiny_llama, tiny_tokenizer):
    """Zeroing every non-candidate row of the head changes the normaliser, never the renormalised answer."""
    engine = Engine.from_model(tiny_llama, tiny_tokenizer, readout="symbols")
    req = three_question_request()
    before = engine.decide(req)
    compiled = engine.compile(req)
    cand = {t for plan in compiled.questions for t in plan.term_tok}
    # A model copy whose head (untied) keeps only candidate rows.
    model = copy.deepcopy(tiny_llama)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    mask = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)
    mask[list(cand)] = True
    with torch.no_grad():
        model.lm_head.weight[~mask] = 0.0
    after = Engine.from_model(model, tiny_tokenizer, readout="symbols").decide(req)
    for fld, ans in before.answers.items():
        for lab, p in ans.probabilities.items():
            assert abs(after.answers[fld].probabilities[lab] - p) < 1e-6
