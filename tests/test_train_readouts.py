"""Every readout trains through the serving compiler, masks and readout (issue #22, item 1).

For ``symbols``, ``label-token``, ``label-sequence`` and ``auto`` (noul: the yes/no words; score
with level texts: those texts; score without: digits; choice: label-token, else label-sequence):

* a multi-question record's loss equals a plain transformers forward of each question's whole
  prompt run apart (label-sequence: each candidate's text and the end-of-answer token appended),
  built here from the text, not from the compiled tree;
* ``full`` = ``candidates`` - log(candidate mass) per question, and that mass is the ``x_mass``
  the engine serves;
* a packed record's per-question losses equal its questions compiled as one-question records;
* a toy task goes from chance to >= 90% with every row's options permuted;
* the saved model is served with the readout it was trained with.
"""

from __future__ import annotations

import pytest
import torch

from noulengine import Engine
from noulengine.compile import Compiler, CompilerConfig
from noulengine.compile.render import candidate_texts, render_question, render_state
from noulengine.compile.symbols import DIGITS, NOUL_WORDS, SYMBOLS
from noulengine.engine.model_runner import ModelRunner
from noulengine.records.schema import request_from_json
from noulengine.train import TrainConfig, train
from noulengine.train.contamination import EvaluationIndex
from noulengine.train.loss import batch_losses, compile_example
from tests.test_train import QUESTIONS, row_of, save_tiny, toy_accuracy, toy_rows, write

READOUTS = ["symbols", "label-token", "label-sequence", "auto"]
STATE = "The server rejected 3 logins from a new country."
# A choice with descriptions, a score with level texts, a score without, a noul; and (not under
# label-token, whose first tokens "T" collide there) a score whose level texts auto reads as sequences.
MIXED = {"topic": QUESTIONS["topic"], "risk": QUESTIONS["risk"],
         "level": {"type": "score", "instructions": "Which level?", "criteria": [None, None, None, None]},
         "flag": QUESTIONS["flag"],
         "when": {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]}}
GOLD = {"topic": "human_review", "risk": "1", "level": "3", "flag": "yes", "when": "2"}
# The mode each question is read (and so trained) by.
MODES = {"symbols": dict.fromkeys(MIXED, "symbols"), "label-token": dict.fromkeys(MIXED, "label-token"),
         "label-sequence": dict.fromkeys(MIXED, "label-sequence"),
         "auto": {"topic": "label-token", "risk": "label-token", "level": "symbols", "flag": "label-token",
                  "when": "label-sequence"}}


def fields_for(readout: str) -> list[str]:
    return [f for f in MIXED if not (readout == "label-token" and f == "when")]


def mixed_record(readout: str, fields=None, rid="mixed") -> dict:
    fields = fields or fields_for(readout)
    return {"id": rid, "state": STATE, "questions": {f: MIXED[f] for f in fields},
            "targets": {f: {"label": GOLD[f]} for f in fields}}


def compiler_for(tokenizer, readout: str) -> Compiler:
    return Compiler(tokenizer, CompilerConfig(readout=readout, max_positions=2048))


def spellings(q, mode: str) -> list[tuple[str, ...]]:
    """Per candidate, the answer texts credited to it under ``mode`` (display order = criteria order)."""
    k = q.num_candidates
    if mode == "symbols":
        table = NOUL_WORDS if q.type == "noul" else DIGITS if q.type == "score" else SYMBOLS
        return [(table[i],) for i in range(k)]
    if mode == "label-token" and q.type == "noul":
        return [("no", "No"), ("yes", "Yes")]
    return Compiler.text_variants(candidate_texts(q, mode))


def plain_candidate_logprobs(model, tokenizer, state, q, mode: str, *, length_norm: bool = False) -> torch.Tensor:
    """(K,) full-vocabulary candidate log-probabilities from plain ``model(input_ids)`` forwards of
    the question's whole prompt (chat template around state + question, tokenized whole), alone.

    symbols / label-token: the first token of each spelling after the prompt, read at its last
    token. label-sequence: the spelling's tokens and the end-of-answer token appended, one forward
    per spelling, the sum of their log-probabilities (``length_norm``: their mean). Spellings of one
    candidate are log-sum-exp'ed.
    """
    content = render_state(state) + render_question(q, mode, range(q.num_candidates), SYMBOLS)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        last = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].double(), -1)
        out = []
        for texts in spellings(q, mode):
            alts = []
            for text in texts:
                ids = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
                assert ids[:len(prompt_ids)] == prompt_ids and len(ids) > len(prompt_ids)
                if mode != "label-sequence":
                    alts.append(ids[len(prompt_ids)])
                    continue
                ids = ids + [end_id]
                logp = torch.log_softmax(model(input_ids=torch.tensor([ids[:-1]])).logits[0].double(), -1)
                total = sum(logp[i - 1, ids[i]] for i in range(len(prompt_ids), len(ids)))
                alts.append(total / (len(ids) - len(prompt_ids)) if length_norm else total)
            if mode != "label-sequence":
                alts = [last[t] for t in dict.fromkeys(alts)]
            out.append(torch.logsumexp(torch.stack(alts), 0))
    return torch.stack(out)


@pytest.mark.parametrize("readout", READOUTS)
def test_loss_equals_plain_forward_of_each_question_apart(tiny_model, tiny_tokenizer, readout):
    obj = mixed_record(readout)
    ex = compile_example(compiler_for(tiny_tokenizer, readout), row_of(obj))
    assert {p.field: p.mode for p in ex.compiled.questions} == {f: MODES[readout][f] for f in obj["questions"]}
    runner = ModelRunner(tiny_model)
    full = batch_losses(runner, [ex], [0], loss="full", pad_id=tiny_tokenizer.pad_token_id).losses
    cand = batch_losses(runner, [ex], [0], loss="candidates", pad_id=tiny_tokenizer.pad_token_id).losses
    served = Engine.from_model(tiny_model, tiny_tokenizer, readout=readout).decide(obj)
    request = request_from_json(obj)
    for j, (q, plan) in enumerate(zip(request.questions, ex.compiled.questions)):
        ref = plain_candidate_logprobs(tiny_model, tiny_tokenizer, STATE, q, plan.mode)
        gold = q.labels.index(GOLD[q.field])
        log_mass = torch.logsumexp(ref, 0)
        assert float(full[j]) == pytest.approx(float(-ref[gold]), abs=1e-4), q.field
        assert float(cand[j]) == pytest.approx(float(log_mass - ref[gold]), abs=1e-4), q.field
        # full = candidates - log(mass): the full loss is the candidate cross-entropy plus the
        # full-vocabulary term -log x_mass, and that mass is what the engine serves as x_mass
        assert float(full[j]) == pytest.approx(float(cand[j]) - float(log_mass), abs=1e-4)
        x_mass = served.answers[q.field].x_mass
        assert x_mass == pytest.approx(float(torch.exp(cand[j].detach() - full[j].detach())), rel=1e-4)
        assert served.answers[q.field].readout == plan.mode


@pytest.mark.parametrize("readout", READOUTS)
def test_soft_target_losses_keep_the_identity(tiny_llama, tiny_tokenizer, readout):
    ex = compile_example(compiler_for(tiny_tokenizer, readout), row_of(mixed_record(readout)))
    ex.soft = [torch.softmax(torch.arange(p.num_candidates, dtype=torch.float64), 0) for p in ex.compiled.questions]
    runner = ModelRunner(tiny_llama)
    full = batch_losses(runner, [ex], [0], loss="full").losses
    cand = batch_losses(runner, [ex], [0], loss="candidates").losses
    served = Engine.from_model(tiny_llama, tiny_tokenizer, readout=readout).decide(mixed_record(readout))
    for j, plan in enumerate(ex.compiled.questions):
        log_mass = torch.log(torch.tensor(served.answers[plan.field].x_mass, dtype=torch.float64))
        assert float(full[j]) == pytest.approx(float(cand[j] - log_mass), abs=1e-4)


@pytest.mark.parametrize("readout", READOUTS)
def test_packed_record_equals_its_questions_run_apart(tiny_llama, tiny_tokenizer, readout):
    compiler = compiler_for(tiny_tokenizer, readout)
    fields = fields_for(readout)
    packed = compile_example(compiler, row_of(mixed_record(readout)))
    singles = [compile_example(compiler, row_of(mixed_record(readout, [f], rid=f))) for f in fields]
    runner = ModelRunner(tiny_llama)
    for loss in ("full", "candidates"):
        together = batch_losses(runner, [packed], [0], loss=loss).losses
        apart = [batch_losses(runner, [s], [0], loss=loss).losses[0] for s in singles]
        for f, a, b in zip(fields, together, apart):
            assert float(a) == pytest.approx(float(b), abs=1e-4), (loss, f)
        # one padded batch with neighbours of other lengths changes nothing either
        batched = batch_losses(runner, [packed] + singles, list(range(len(singles) + 1)), loss=loss).losses
        assert torch.allclose(torch.stack(batched).detach(), torch.stack(together + apart).detach(), atol=1e-4)


@pytest.mark.parametrize("readout", ["label-sequence", "auto"])
def test_length_normalised_scores_are_per_token_means(tiny_llama, tiny_tokenizer, readout):
    """``batch_candidate_logprobs(length_norm=True)`` (what experiments/length_norm.py compares):
    each spelling's summed log-probability divided by its token count (text + end token), then
    the spellings combined; one-token readouts are unchanged."""
    from noulengine.engine.batching import collate
    from noulengine.engine.readout import batch_candidate_logprobs

    obj = mixed_record(readout)
    compiled = compiler_for(tiny_tokenizer, readout).compile(request_from_json(obj))
    runner = ModelRunner(tiny_llama)
    with torch.no_grad():
        hidden = runner.hidden_states(collate([compiled], [0], pad_id=tiny_tokenizer.pad_token_id))
    summed, = batch_candidate_logprobs(hidden, runner.head, [compiled], [0])
    means, = batch_candidate_logprobs(hidden, runner.head, [compiled], [0], length_norm=True)
    for q, plan, s, m in zip(request_from_json(obj).questions, compiled.questions, summed, means):
        ref = plain_candidate_logprobs(tiny_llama, tiny_tokenizer, STATE, q, plan.mode, length_norm=True)
        assert torch.allclose(m[0], ref, atol=1e-4), q.field
        if plan.mode == "label-sequence":
            assert not torch.allclose(m, s, atol=1e-3)
        else:
            assert torch.equal(m, s)


def served_probabilities(engine, rows):
    return [{f: a.probabilities for f, a in d.answers.items()} for d in engine.decide_batch(rows, on_error="raise")]


@pytest.mark.parametrize("readout, loss", [("label-token", "full"), ("label-sequence", "full"),
                                           ("label-sequence", "candidates")])
def test_toy_task_learnt_from_chance_with_permuted_options(tmp_path, tiny_tokenizer, tiny_llama, readout, loss):
    """The toy task of tests/test_train.py (the state repeats the answer word), with every row's
    options permuted: read by the option names, learnt from chance; the saved folder serves with
    the readout it was trained with and gives the in-memory model's probabilities.

    10 epochs: under label-sequence the ``full`` loss first spends its steps on the mass term
    (train loss ~9 nats at epoch 1; still at chance after 5 epochs, 100% after 8), while
    ``candidates`` and label-token are at 100% after 5."""
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", toy_rows(96, 0))
    test = toy_rows(60, 2)
    before = toy_accuracy(Engine.from_pretrained(str(model_dir), readout=readout), test)
    result = train(TrainConfig(data=str(data), output=str(tmp_path / "out"), model=str(model_dir), method="full",
                               lr=3e-3, epochs=10, batch_tokens=1024, max_batch_size=8, readout=readout, loss=loss,
                               permute=True, permute_share=1.0, flip_rate_rows=0, progress=False),
                   evaluation_index=EvaluationIndex())
    served = Engine.from_pretrained(str(tmp_path / "out"))
    after = toy_accuracy(served, test)
    assert before < 0.75 and after >= 0.9, (before, after)
    assert result.training["readout"] == readout and result.training["loss"] == loss
    assert served.config.readout == readout
    assert {a.readout for d in served.decide_batch(test[:4]) for a in d.answers.values()} == {readout}
    memory = Engine.from_model(result.model.eval(), tiny_tokenizer, readout=readout)
    for x, y in zip(served_probabilities(memory, test[:8]), served_probabilities(served, test[:8])):
        for f in x:
            assert x[f] == pytest.approx(y[f], abs=1e-6)


@pytest.mark.parametrize("readout", READOUTS)
def test_saved_model_serves_with_its_training_readout(tmp_path, tiny_tokenizer, tiny_llama, readout):
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", [mixed_record(readout, rid=f"m{i}") for i in range(4)])
    train(TrainConfig(data=str(data), output=str(tmp_path / "out"), model=str(model_dir), lora_r=4, max_steps=1,
                      readout=readout, flip_rate_rows=0, progress=False), evaluation_index=EvaluationIndex())
    engine = Engine.from_pretrained(str(tmp_path / "out"))
    assert engine.training["readout"] == readout and engine.config.readout == readout
    decision = engine.decide(mixed_record(readout))
    assert {f: a.readout for f, a in decision.answers.items()} == {f: MODES[readout][f] for f in fields_for(readout)}
