"""Packed ids equal the tokenizer's ids of each whole prompt (issue #13, item 3).

For every branch, ``prefix ids + branch ids`` must be exactly what the tokenizer gives for the
concatenated prompt text (chat template applied to ``state + question``), and for every
label-sequence candidate, ``prefix + branch + candidate`` must be the ids of ``prompt + label +
END``. Tokenizing the pieces apart loses merges at the boundary (``"\\n\\n" + "Question"``).
"""

from __future__ import annotations

import pytest

from noulengine.compile import Compiler, CompilerConfig
from noulengine.compile.render import render_question, render_state
from noulengine.compile.symbols import SYMBOLS
from noulengine.records.schema import request_from_json

STATES = [
    {"ticket": "My parcel never arrived", "order": 1182, "tags": ["late", "ünïcode ✓"]},
    "Plain text evidence that ends with spaces and newlines   \n\n",
    "x",
    "Ends with a word",
    "",
]
QUESTIONS = {
    "flag": {"type": "noul", "instructions": "Is it?"},
    "route": {"type": "choice", "instructions": "Route the ticket.",
              "criteria": {"world": "World news.", "business": None, "human_review": "Escalate.", "observe": "Watch."}},
    "urgency": {"type": "score", "instructions": {"scale": "how urgent"}, "criteria": ["none", "low", "high"]},
}
READOUTS = ["symbols", "label-token", "label-sequence", "auto"]


def _reference(hf, compiler: Compiler, text: str, answer: str | None = None) -> list[int]:
    """The tokenizer's own ids of the whole prompt (and answer + END) text."""
    if compiler.frame.chat:
        prompt = hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        add_special = False
    else:
        prompt, add_special = text + compiler.frame.tail_text, True
    if answer is not None:
        prompt += answer + compiler.frame.end_text
    return list(hf(prompt, add_special_tokens=add_special)["input_ids"])


def _check_whole_prompt_ids(hf, readout: str, debias: str) -> int:
    compiler = Compiler(hf, CompilerConfig(readout=readout, debias=debias))
    checked = 0
    for state in STATES:
        request = request_from_json({"state": state, "questions": QUESTIONS})
        compiled = compiler.compile(request)
        seg = compiled.segment_ids
        by_seg: dict[int, list[int]] = {}
        for tok, s in zip(compiled.token_ids, seg):
            by_seg.setdefault(s, []).append(tok)
        prefix = by_seg.get(0, [])
        branches = [s for s, p in enumerate(compiled.parents) if p == 0]
        it = iter(branches)
        for q, plan in zip(request.questions, compiled.questions):
            k = q.num_candidates
            for view, rotation in enumerate(plan.rotations):
                branch = next(it)
                order = [(slot + rotation) % k for slot in range(k)]
                text = render_state(state) + render_question(q, plan.mode, order, SYMBOLS)
                ids = prefix + by_seg.get(branch, [])
                assert ids == _reference(hf, compiler, text), (readout, debias, state, q.field, view)
                checked += 1
                if plan.mode != "label-sequence":
                    continue
                leaves = [s for s, p in enumerate(compiled.parents) if p == branch]
                alts = [a for a, vc in enumerate(plan.alt_vc) if vc // k == view]
                assert len(leaves) == len(alts)
                variants = [v for cand in compiler.question_variants(q, plan.mode) for v in cand]
                for leaf, alt, label in zip(leaves, alts, variants):
                    read_last = [t for t, a in zip(plan.term_tok, plan.term_alt) if a == alt][-1]
                    got = ids + by_seg.get(leaf, []) + [read_last]
                    assert got == _reference(hf, compiler, text, label), (readout, state, q.field, label)
                    checked += 1
    return checked


@pytest.mark.parametrize("debias", ["none", "permute"])
@pytest.mark.parametrize("readout", READOUTS)
def test_tiny_tokenizer_packed_ids_equal_whole_prompt_ids(tiny_tokenizer, readout, debias):
    assert _check_whole_prompt_ids(tiny_tokenizer, readout, debias) > 0


@pytest.mark.parametrize("debias", ["none", "permute"])
@pytest.mark.parametrize("readout", READOUTS)
def test_smollm2_tokenizer_packed_ids_equal_whole_prompt_ids(smollm2_tokenizer, readout, debias):
    assert _check_whole_prompt_ids(smollm2_tokenizer, readout, debias) > 0


@pytest.mark.parametrize("debias", ["none", "permute"])
@pytest.mark.parametrize("readout", READOUTS)
def test_gemma_tokenizer_packed_ids_equal_whole_prompt_ids(gemma_tokenizer, readout, debias):
    assert _check_whole_prompt_ids(gemma_tokenizer, readout, debias) > 0


def test_smollm2_tokenizer_issue_example(smollm2_tokenizer):
    """The issue's own request: the packed ids hold ``198, 198, 17872`` where segment-wise
    tokenization gave ``1116, 17872``."""
    compiler = Compiler(smollm2_tokenizer)
    request = request_from_json({"state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}})
    ids = compiler.compile(request).token_ids
    question = smollm2_tokenizer.convert_tokens_to_ids("Question")
    at = ids.index(question)
    assert ids[at - 2:at] == [198, 198]
