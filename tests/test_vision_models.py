"""Vision-language models: the one-pass tree against plain transformers forward passes.

For every supported family (tiny random models, ``tests/vision_models.py``) the packed tree's
answers equal a plain forward pass of ``prefix + branch`` with the processor's pixel inputs, run
by the model's own ``forward`` (its own embedding merge, rotary positions and masks).
"""

from __future__ import annotations

import pytest
import torch

from noulengine import Engine
from noulengine.engine.batching import collate
from noulengine.records.errors import UnsupportedModalityError
from tests.conftest import three_question_request
from tests.test_engine_equivalence import assert_branch_change_is_isolated
from tests.vision_models import FAMILIES, build, image_field, png_bytes


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model, processor, tokenizer = build(request.param)
    return request.param, model, processor, tokenizer


def _engine(family, **kwargs):
    _, model, processor, tokenizer = family
    return Engine.from_model(model, tokenizer, processor=processor, **kwargs)


def _request(*images, **extra):
    return three_question_request(images=[image_field(im) for im in images], **extra)


def _context(compiled, pos):
    """The tokens a read position sees: its ancestors' segments and its own segment up to it."""
    seg, parents = compiled.segment_ids, compiled.parents
    chain, s = set(), seg[pos]
    while s >= 0:
        chain.add(s)
        s = parents[s]
    return [compiled.token_ids[i] for i in range(pos + 1) if seg[i] in chain]


def reference_term_logprobs(name, model, compiled, plan) -> list[float]:
    """``log p(token | context)`` of each readout term from a plain ``model(...)`` call per term."""
    tid = model.config.image_token_id
    out = []
    for pos, tok in zip(plan.term_pos, plan.term_tok):
        ids = torch.tensor([_context(compiled, pos)])
        kwargs = dict(compiled.vision.tensors) if compiled.vision is not None else {}
        if name.startswith("qwen"):
            kwargs["mm_token_type_ids"] = (ids == tid).long()  # what its processor returns
        elif name == "gemma3":
            kwargs["token_type_ids"] = (ids == tid).long()
        with torch.no_grad():
            logits = model(input_ids=ids, **kwargs).logits[0, -1].double()
        out.append(torch.log_softmax(logits, -1)[tok].item())
    return out


def engine_term_logprobs(engine, compiled_list, row=0, *, hidden=None) -> dict[str, list[float]]:
    """Per question, the engine's ``log p`` of each readout term from one packed batch."""
    if hidden is None:
        batch = collate(compiled_list, list(range(len(compiled_list))), pad_id=engine.pad_id)
        hidden = engine.runner.hidden_states(batch)
    head = engine.runner.head
    out = {}
    for plan in compiled_list[row].questions:
        logits = torch.nn.functional.linear(hidden[row, plan.term_pos], head.weight).double()
        if head.softcap:
            logits = torch.tanh(logits / head.softcap) * head.softcap
        lp = torch.log_softmax(logits, -1)
        out[plan.field] = lp[range(len(plan.term_tok)), plan.term_tok].tolist()
    return out


@pytest.mark.parametrize("layout", ["state-first", "schema-first"])
@pytest.mark.parametrize("readout", ["symbols", "label-sequence"])
def test_tree_equals_plain_forward_per_question(family, readout, layout):
    """Schema-first: the images follow the questions and precede the state (docs/prompt-layouts.md)."""
    name, model, *_ = family
    engine = _engine(family, readout=readout, layout=layout)
    compiled = engine.compile(_request(png_bytes(seed=1), png_bytes((48, 80), seed=2)))
    assert compiled.vision is not None and compiled.vision.num_images == 2
    assert compiled.vision.image_tokens > 0
    assert compiled.prefix_tokens < compiled.input_tokens  # branches share the prefix
    got = engine_term_logprobs(engine, [compiled])
    for plan in compiled.questions:
        ref = reference_term_logprobs(name, model, compiled, plan)
        assert max(abs(a - b) for a, b in zip(got[plan.field], ref)) < 1e-4, (name, plan.field)


def test_decide_probabilities_match_reference(family):
    name, model, *_ = family
    engine = _engine(family, readout="symbols")
    req = _request(png_bytes(seed=3))
    compiled = engine.compile(req)
    decision = engine.decide(req)
    for plan in compiled.questions:
        ref = torch.softmax(torch.tensor(reference_term_logprobs(name, model, compiled, plan), dtype=torch.float64), 0)
        got = torch.tensor([decision.answers[plan.field].probabilities[lab] for lab in plan.labels], dtype=torch.float64)
        assert torch.allclose(got, ref, atol=1e-4), (name, plan.field, got, ref)


def test_pixels_are_read(family):
    engine = _engine(family, readout="symbols")
    a = png_bytes(seed=5)
    from PIL import Image
    import io

    im = Image.open(io.BytesIO(a)).convert("RGB")
    im.putpixel((10, 10), tuple(255 - c for c in im.getpixel((10, 10))))  # one pixel changed
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    da, db = engine.decide(_request(a)), engine.decide(_request(buf.getvalue()))
    ca, cb = engine.compile(_request(a)), engine.compile(_request(buf.getvalue()))
    assert ca.token_ids == cb.token_ids  # same placeholders: only the pixels differ
    diff = max(abs(da.answers[f].probabilities[k] - db.answers[f].probabilities[k])
               for f in da.answers for k in da.answers[f].probabilities)
    assert diff > 0


def test_changing_one_branch_leaves_others_bit_identical(family):
    assert_branch_change_is_isolated(_engine(family, readout="symbols"), _request(png_bytes(seed=6)))


def test_batching_and_slot_independence(family):
    engine = _engine(family, readout="symbols")
    reqs = [_request(png_bytes(seed=10 + i), state=f"Case {i}: the server rejected {i} logins.") for i in range(3)]
    reqs.append(three_question_request(state="A text-only request in the same batch."))
    reqs.append(_request(png_bytes((40, 64), seed=20), png_bytes(seed=21)))
    alone = [engine.decide(r) for r in reqs]
    together = engine.decide_batch(reqs)
    reversed_ = engine.decide_batch(reqs[::-1])[::-1]
    for a, b, c in zip(alone, together, reversed_):
        for field in a.answers:
            for label, p in a.answers[field].probabilities.items():
                assert abs(p - b.answers[field].probabilities[label]) < 1e-5
                assert abs(p - c.answers[field].probabilities[label]) < 1e-5
    # several image requests really share one forward pass
    compiled = [engine.compile(r) for r in reqs if r.get("images")]
    hidden_rows = engine_term_logprobs(engine, compiled, row=1)
    single = engine_term_logprobs(engine, [compiled[1]])
    for field in single:
        assert max(abs(x - y) for x, y in zip(hidden_rows[field], single[field])) < 1e-5


def test_image_order_matters(family):
    engine = _engine(family, readout="symbols")
    a, b = png_bytes(seed=30), png_bytes(seed=31, size=(64, 48))
    ab, ba = engine.compile(_request(a, b)), engine.compile(_request(b, a))
    first = {k: v for k, v in ab.vision.tensors.items()}
    second = {k: v for k, v in ba.vision.tensors.items()}
    assert any(first[k].shape != second[k].shape or not torch.equal(first[k], second[k]) for k in first)
    pa, pb = engine.decide(_request(a, b)), engine.decide(_request(b, a))
    assert pa.answers["topic"].probabilities != pb.answers["topic"].probabilities


def test_vlm_without_images_is_a_text_model(family):
    name, model, *_ = family
    engine = _engine(family, readout="symbols")
    req = three_question_request()
    compiled = engine.compile(req)
    assert compiled.vision is None
    got = engine_term_logprobs(engine, [compiled])
    for plan in compiled.questions:
        ref = reference_term_logprobs(name, model, compiled, plan)
        assert max(abs(x - y) for x, y in zip(got[plan.field], ref)) < 1e-4
    # and through the fast paths a text request takes (causal / prefix cache), answers agree
    one_q = {"state": "x", "questions": {"flag": {"type": "noul", "instructions": "Is it?"}}}
    fast = engine.decide(one_q).answers["flag"].probabilities
    engine.config.causal_path = False
    slow = engine.decide(one_q).answers["flag"].probabilities
    engine.config.causal_path = True
    assert all(abs(fast[k] - slow[k]) < 1e-5 for k in fast)


def test_text_only_model_refuses_images_alone(tiny_llama, tiny_tokenizer):
    engine = Engine.from_model(tiny_llama, tiny_tokenizer)
    out = engine.decide_batch([_request(png_bytes()), three_question_request()])
    assert out[0].error["error_type"] == "UnsupportedModalityError" and "text-only" in out[0].error["message"]
    assert out[1].error is None and out[1].answers
    with pytest.raises(UnsupportedModalityError):
        engine.decide(_request(png_bytes()))


# -- negative controls: the checks above can fail ---------------------------------------------

def test_qwen_one_dimensional_positions_are_wrong():
    """1-D (tree-depth) positions instead of the 3-D multimodal rope give other logits."""
    model, processor, tokenizer = build("qwen2_vl")
    engine = Engine.from_model(model, tokenizer, processor=processor, readout="symbols")
    compiled = engine.compile(_request(png_bytes(seed=1)))
    right = engine_term_logprobs(engine, [compiled])
    adapter = engine.runner.vision
    plain = type(adapter).__mro__[1].position_ids  # the base class: positions as given
    adapter.position_ids = lambda *a, **k: plain(adapter, *a, **k)
    try:
        wrong = engine_term_logprobs(engine, [compiled])
    finally:
        del adapter.position_ids
    worst = max(abs(x - y) for f in right for x, y in zip(right[f], wrong[f]))
    assert worst > 1e-4


def test_gemma3_without_image_block_is_wrong():
    """Without the bidirectional image block the tree misses the model's own mask."""
    model, processor, tokenizer = build("gemma3")
    engine = Engine.from_model(model, tokenizer, processor=processor, readout="symbols")
    compiled = engine.compile(_request(png_bytes(seed=1), png_bytes(seed=2)))
    plan = compiled.questions[0]
    ref = reference_term_logprobs("gemma3", model, compiled, plan)
    engine.runner.vision.bidirectional_images = False
    try:
        wrong = engine_term_logprobs(engine, [compiled])[plan.field]
    finally:
        engine.runner.vision.bidirectional_images = True
    assert max(abs(x - y) for x, y in zip(wrong, ref)) > 1e-4
    right = engine_term_logprobs(engine, [compiled])[plan.field]
    assert max(abs(x - y) for x, y in zip(right, ref)) < 1e-5


# -- CUDA: bf16 and flex attention (skipped without a GPU; run by scripts/gpu_check.sh) ---------

def _max_logprob_gap(a, b) -> float:
    return max(abs(u - v) for f, x in a.answers.items() for u, v in zip(x.logprobs, b.answers[f].logprobs))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu_float32(name, dtype):
    model, processor, tokenizer = build(name)
    cpu = Engine.from_model(model, tokenizer, processor=processor, readout="symbols")
    reqs = [_request(png_bytes(seed=40)), _request(png_bytes(seed=41), png_bytes((40, 64), seed=42)),
            three_question_request()]
    want = cpu.decide_batch(reqs)
    gpu_model, _, _ = build(name, dtype=dtype)
    gpu = Engine.from_model(gpu_model.to("cuda"), tokenizer, processor=processor, readout="symbols")
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for a, b in zip(gpu.decide_batch(reqs), want):
        assert a.ok and b.ok and _max_logprob_gap(a, b) <= tol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", FAMILIES)
def test_cuda_flex_attention_matches_sdpa(name):
    try:
        flex_model, processor, tokenizer = build(name, attn="flex_attention")
    except (ValueError, ImportError) as exc:
        pytest.skip(f"{name}: transformers refuses flex attention here: {exc}")
    sdpa_model, _, _ = build(name)
    reqs = [_request(png_bytes(seed=50)), _request(png_bytes(seed=51), png_bytes(seed=52))]
    flex = Engine.from_model(flex_model.to("cuda"), tokenizer, processor=processor, readout="symbols")
    sdpa = Engine.from_model(sdpa_model.to("cuda"), tokenizer, processor=processor, readout="symbols")
    for a, b in zip(flex.decide_batch(reqs), sdpa.decide_batch(reqs)):
        assert a.ok and b.ok and _max_logprob_gap(a, b) <= 1e-4


def test_vlm_without_processor_says_so():
    model, _, tokenizer = build("qwen2_vl")
    engine = Engine.from_model(model, tokenizer)
    assert engine.describe()["vision"] is None
    out = engine.decide_batch([_request(png_bytes()), three_question_request()])
    assert "no processor" in out[0].error["message"] and out[1].ok
