"""Training: the loss is the engine's own readout, packed trees train like separate prompts,
refusal rules, option permutation, determinism, save/reload, and learning a toy task."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from noulengine import Engine
from noulengine.compile import Compiler, CompilerConfig
from noulengine.engine.model_runner import ModelRunner
from noulengine.records.schema import parse_record
from noulengine.train import TrainConfig, TrainingDataError, load_training_rows, train
from noulengine.train.contamination import EvaluationIndex, normalize_text
from noulengine.train.data import TrainRow, permute_question
from noulengine.train.loss import batch_losses, compile_example
from tests.test_engine_equivalence import reference_view_logprobs

QUESTIONS = {
    "topic": {"type": "choice", "instructions": "Which topic?",
              "criteria": {"world": "World news.", "business": None, "human_review": "Escalate.", "observe": "Watch."}},
    "risk": {"type": "score", "instructions": "How risky?", "criteria": ["none", "low", "high"]},
    "flag": {"type": "noul", "instructions": "Should a human look at it?"},
}


def record(rid="r1", state="The server rejected 3 logins.", targets=None, **extra):
    targets = targets or {"topic": {"label": "observe"}, "risk": {"label": "2"}, "flag": {"label": "yes"}}
    return {"id": rid, "state": state, "questions": QUESTIONS, "targets": targets, **extra}


def write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def row_of(obj) -> TrainRow:
    rec = parse_record(obj)
    return TrainRow(rec, 1, tuple(rec.targets[q.field].label for q in rec.request.questions),
                    (None,) * len(rec.request.questions))


@pytest.fixture()
def symbols_compiler(tiny_tokenizer):
    return Compiler(tiny_tokenizer, CompilerConfig(readout="symbols", max_positions=2048))


def test_loss_equals_plain_forward_cross_entropy(tiny_model, tiny_tokenizer, symbols_compiler):
    ex = compile_example(symbols_compiler, row_of(record()))
    out = batch_losses(ModelRunner(tiny_model), [ex], [0], loss="full", pad_id=tiny_tokenizer.pad_token_id)
    for j, plan in enumerate(ex.compiled.questions):
        ref = reference_view_logprobs(tiny_model, ex.compiled, plan)  # separate plain runs, full head
        assert float(out.losses[j]) == pytest.approx(float(-ref[0, ex.gold[j]]), abs=1e-4)
        cand = ref[0] - torch.logsumexp(ref[0], 0)
        only = batch_losses(ModelRunner(tiny_model), [ex], [0], loss="candidates", pad_id=0)
        assert float(only.losses[j]) == pytest.approx(float(-cand[ex.gold[j]]), abs=1e-4)


def test_packed_loss_is_sum_of_per_question_losses(tiny_llama, tiny_tokenizer, symbols_compiler):
    packed = compile_example(symbols_compiler, row_of(record()))
    singles = []
    for fld in QUESTIONS:
        obj = record(rid=fld, targets={fld: record()["targets"][fld]})
        obj["questions"] = {fld: QUESTIONS[fld]}
        singles.append(compile_example(symbols_compiler, row_of(obj)))
    runner = ModelRunner(tiny_llama)
    total = torch.stack(batch_losses(runner, [packed], [0]).losses).sum()
    parts = [batch_losses(runner, [s], [0]).losses[0] for s in singles]
    assert float(total) == pytest.approx(float(sum(parts)), abs=1e-4)
    # and in one padded batch with neighbours of other lengths the losses do not change
    batched = batch_losses(runner, [packed] + singles, [0, 1, 2, 3]).losses
    assert float(torch.stack(batched[:3]).sum()) == pytest.approx(float(total), abs=1e-4)


def test_gradients_flow_only_into_trainable_parameters(tiny_tokenizer, tiny_llama, symbols_compiler):
    import copy

    from noulengine.train.methods import apply_method, trainable_parameters

    model = apply_method(copy.deepcopy(tiny_llama), method="lora", lora_r=4, lora_alpha=8)
    ex = compile_example(symbols_compiler, row_of(record()))
    batch_losses(ModelRunner(model, train=True), [ex], [0]).mean_loss().backward()
    trainable = {id(p) for p in trainable_parameters(model)}
    assert trainable and all("lora_" in n for n, p in model.named_parameters() if id(p) in trainable)
    assert all(p.grad is None for p in model.parameters() if id(p) not in trainable)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_parameters(model))


def test_permutation_moves_symbols_not_meanings():
    q = parse_record(record()).request.questions[0]
    seen = set()
    for seed in range(20):
        p = permute_question(q, random.Random(seed))
        assert sorted(zip(p.labels, p.descriptions)) == sorted(zip(q.labels, q.descriptions))
        seen.add(p.labels)
    assert len(seen) > 5
    score, noul = parse_record(record()).request.questions[1:]
    assert permute_question(score, random.Random(0)) is score and permute_question(noul, random.Random(0)) is noul


def test_gold_follows_its_label_under_permutation(symbols_compiler):
    for seed in range(5):
        ex = compile_example(symbols_compiler, row_of(record()), random.Random(seed))
        plan = ex.compiled.questions[0]
        assert plan.labels[ex.gold[0]] == "observe"


# -- refusal rules ------------------------------------------------------------------------------

def test_every_bad_row_is_refused_with_file_line_id_and_rule(tmp_path):
    index = EvaluationIndex()
    index.add("agnews", "test-row-1", {"text": "A test article that must never be trained on, quite long."})
    rows = [
        record("ok"),
        record("no_target", targets={"topic": {"label": "world"}, "risk": {"label": "0"}}),
        record("bad_target", targets={"topic": {"label": "sports"}, "risk": {"label": "0"}, "flag": {"label": "no"}}),
        record("val", validation_role="selection"),
        record("ok"),
        record("test-row-1"),
        record("leak", state={"article": "a TEST article that must never be trained on,   quite long."}),
    ]
    path = write(tmp_path / "train.jsonl", rows)
    with pytest.raises(TrainingDataError) as err:
        load_training_rows(path, index=index)
    by_line = {e.line: e for e in err.value.errors}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7]
    assert by_line[2].record_id == "no_target" and by_line[2].field == "targets.flag"
    assert "not a candidate" in by_line[3].rule and by_line[3].record_id == "bad_target"
    assert by_line[4].field == "validation_role"
    assert "duplicate id" in by_line[5].rule
    assert by_line[6].field == "id" and "agnews" in by_line[6].rule
    assert by_line[7].field == "state" and "agnews" in by_line[7].rule
    assert all(str(path) in str(e) for e in err.value.errors)


def test_overlength_row_is_refused_never_truncated(tmp_path, tiny_tokenizer, tiny_llama):
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    long_state = " ".join(["evidence"] * 3000)
    path = write(tmp_path / "train.jsonl", [record("short"), record("long", state=long_state)])
    with pytest.raises(TrainingDataError) as err:
        train(TrainConfig(data=str(path), output=str(tmp_path / "out"), model=str(model_dir), progress=False),
              evaluation_index=EvaluationIndex())
    (e,) = err.value.errors
    assert e.record_id == "long" and e.line == 2 and "positions" in e.rule
    assert not (tmp_path / "out").exists()


def test_evaluation_index_catches_real_suite_rows():
    from noulengine.eval.suites import get_suite

    suite = get_suite("agnews")
    if not suite.available().available:
        pytest.skip("AG News data not on this machine")
    from noulengine.train.contamination import build_evaluation_index

    index = build_evaluation_index()
    first = json.loads(suite.prepare().open().readline())
    assert index.overlap(first["id"], {}) is not None
    assert index.overlap("fresh-id", {"body": "  " + first["state"]["text"].upper()}) is not None
    assert index.overlap("fresh-id", {"text": "An article nobody has written yet about nothing at all."}) is None
    assert index.suites["agnews"]["rows"] == 7600


def test_normalize_text():
    assert normalize_text("  A\tb\n C ") == "a b c"


# -- training runs on tiny models ---------------------------------------------------------------

def save_tiny(tmp_path: Path, model, tokenizer, name="tiny") -> Path:
    out = tmp_path / name
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def toy_rows(n: int, seed: int, role=None):
    """A learnable task: the state names a colour; the question asks which colour it names."""
    rng = random.Random(seed)
    colours = ["world", "business", "observe"]
    rows = []
    for i in range(n):
        gold = rng.choice(colours)
        rows.append({"id": f"toy-{seed}-{i}", "state": f"{gold} {gold} {gold}",
                     "questions": {"c": {"type": "choice", "instructions": "Which word is repeated?",
                                         "criteria": {c: None for c in colours}},
                                   "n": {"type": "noul", "instructions": "Is the word world?"}},
                     "targets": {"c": {"label": gold}, "n": {"label": "yes" if gold == "world" else "no"}},
                     **({"validation_role": role} if role else {})})
    return rows


def toy_accuracy(engine, rows) -> float:
    decisions = engine.decide_batch(rows, on_error="raise")
    hits = [d.answers[f].label == r["targets"][f]["label"] for d, r in zip(decisions, rows) for f in ("c", "n")]
    return sum(hits) / len(hits)


def test_a_few_steps_learn_a_toy_task_from_chance(tmp_path, tiny_tokenizer, tiny_llama):
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", toy_rows(96, 0))
    sel = write(tmp_path / "sel.jsonl", toy_rows(24, 1, role="selection"))
    test = toy_rows(60, 2)
    before = toy_accuracy(Engine.from_pretrained(str(model_dir), readout="symbols"), test)
    # Options in a fixed order here: a 2-layer random model learns the word -> symbol map in a
    # few steps (reading permuted option lists is what the real recipe's augmentation teaches).
    result = train(TrainConfig(data=str(data), output=str(tmp_path / "out"), model=str(model_dir), method="full",
                               lr=3e-3, epochs=5, batch_tokens=1024, max_batch_size=8, selection=str(sel),
                               permute=False, flip_rate_rows=24, progress=False), evaluation_index=EvaluationIndex())
    after = toy_accuracy(Engine.from_pretrained(str(tmp_path / "out")), test)
    assert before < 0.75 and after >= 0.9, (before, after)
    t = result.training
    assert [e["epoch"] for e in t["epochs"]] == [1, 2, 3, 4, 5]
    assert all("selection" in e for e in t["epochs"]) and t["chosen_by"] == "selection NLL"
    assert t["final"]["permutation"]["flip_rate"] is not None
    assert t["data"]["train"]["rows"] == 96 and t["data"]["train"]["questions"] == 192
    assert len(t["loss_curve"]) == t["steps"] and t["readout"] == "symbols"


def test_lora_adapter_saves_reloads_bit_identical_and_is_deterministic(tmp_path, tiny_tokenizer, tiny_llama):
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", toy_rows(24, 0))
    outs = []
    for run in ("a", "b"):
        cfg = TrainConfig(data=str(data), output=str(tmp_path / run), model=str(model_dir), lora_r=4, lora_alpha=8,
                          lr=1e-2, batch_tokens=512, seed=7, progress=False)
        outs.append(train(cfg, evaluation_index=EvaluationIndex()))
    a, b = (tmp_path / "a" / "adapter_model.safetensors"), (tmp_path / "b" / "adapter_model.safetensors")
    assert a.read_bytes() == b.read_bytes()  # deterministic under --seed
    # peft writes target_modules in set order (PYTHONHASHSEED-dependent): saved sorted, the same bytes
    config = (tmp_path / "a" / "adapter_config.json").read_text()
    assert config == (tmp_path / "b" / "adapter_config.json").read_text()
    assert json.loads(config)["target_modules"] == sorted(json.loads(config)["target_modules"])
    t = outs[0].training
    assert t["base_model"]["spec"] == str(model_dir.resolve()) and t["method"] == "lora"
    assert set(t["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    # the in-memory trained model, merged exactly as the loader merges, against the reloaded folder
    merged = outs[0].model.merge_and_unload()
    mem = Engine.from_model(merged, tiny_tokenizer, readout="symbols").decide_batch(toy_rows(8, 3))
    loaded_engine = Engine.from_pretrained(str(tmp_path / "a"))
    assert loaded_engine.config.readout == "symbols"  # the readout it was trained with
    loaded = loaded_engine.decide_batch(toy_rows(8, 3))
    for x, y in zip(mem, loaded):
        for f in ("c", "n"):
            assert x.answers[f].probabilities == y.answers[f].probabilities


def test_lora_layers_adapts_only_the_top_layers(tiny_llama):
    import copy

    from noulengine.train.methods import apply_method

    model = apply_method(copy.deepcopy(tiny_llama), method="lora", lora_layers=1)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(".layers.1." in n for n in names)
    top = apply_method(copy.deepcopy(tiny_llama), method="top-k", top_k=1)
    names = [n for n, p in top.named_parameters() if p.requires_grad]
    assert any(".layers.1." in n for n in names) and not any(".layers.0." in n for n in names)
    with pytest.raises(ValueError, match="lora_layers"):
        apply_method(copy.deepcopy(tiny_llama), method="lora", lora_layers=5)


def test_cli_refuses_bad_rows_with_exit_2(tmp_path, capsys):
    from noulengine.cli import main

    path = write(tmp_path / "train.jsonl", [record("x", validation_role="calibration")])
    rc = main(["train", "--data", str(path), "--output", str(tmp_path / "o"), "--model", str(tmp_path / "none")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "train.jsonl:1" in err and "validation_role" in err and "record 'x'" in err


@pytest.mark.slow
def test_data_parallel_two_cpu_processes_with_accelerate(tmp_path, tiny_tokenizer, tiny_llama):
    """Data parallel on CPU, 2 processes (``torchrun``; the Accelerator picks up its environment
    and uses gloo): both take equal shares of every epoch's batches, gradients are averaged,
    rank 0 writes the model."""
    import os
    import shutil
    import subprocess
    import sys

    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if launcher is None:
        pytest.skip("torchrun not installed next to this python")
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", toy_rows(32, 0))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [launcher, "--nproc_per_node", "2", "--master_port", "29517", "-m", "noulengine.train", "--data", str(data), "--output", str(tmp_path / "out"), "--model", str(model_dir),
           "--lora-r", "4", "--lr", "1e-2", "--batch-tokens", "512", "--progress", "false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = json.loads((tmp_path / "out" / "training.json").read_text())
    assert t["processes"] == 2 and t["steps"] >= 1
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
    assert "agnews" in t["evaluation_overlap_check"]["suites"]  # the overlap guard ran here too


def test_trained_folder_applies_its_calibration_and_checks_its_base(tmp_path, tiny_tokenizer, tiny_llama):
    from noulengine.calibrate.file import FORMAT, VERSION
    from noulengine.models.loading import ModelNotFoundError

    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", toy_rows(8, 0))
    train(TrainConfig(data=str(data), output=str(tmp_path / "out"), model=str(model_dir), lora_r=4, max_steps=1,
                      progress=False), evaluation_index=EvaluationIndex())
    out = tmp_path / "out"
    plain = Engine.from_pretrained(str(out))
    assert plain.calibration is None and plain.training["readout"] == "symbols"
    # read with its own readout, a symbol-trained model still takes 2..255 options: beyond the 62
    # symbols a question is read by label-sequence; an explicit --readout symbols still refuses
    many = {"state": "x", "questions": {"q": {"type": "choice", "instructions": "Pick one.",
                                              "criteria": {f"opt{i}": None for i in range(70)}}}}
    assert plain.decide(many).answers["q"].readout == "label-sequence"
    strict = Engine.from_pretrained(str(out), readout="symbols")
    assert strict.decide_batch([many])[0].error["field"] == "questions.q"
    cal = {"format": FORMAT, "version": VERSION, "model": {"name": "out", "sha256": plain.identity.sha256},
           "readout": "symbols", "debias": "none", "group_by": "global", "groups": {"global": {"temperature": 2.0}}}
    (out / "calibration.json").write_text(json.dumps(cal))
    shipped = Engine.from_pretrained(str(out))
    assert shipped.calibration is not None and shipped.config.calibration == str(out / "calibration.json")
    assert shipped.decide(toy_rows(1, 5)[0]).answers["c"].temperature == 2.0
    assert Engine.from_pretrained(str(out), calibration="none").calibration is None
    # fitted for another readout: not applied
    assert Engine.from_pretrained(str(out), readout="label-sequence").calibration is None
    meta = json.loads((out / "training.json").read_text())
    meta["base_model"]["sha256"] = "0" * 64
    (out / "training.json").write_text(json.dumps(meta))
    with pytest.raises(ModelNotFoundError, match="does not transfer"):
        Engine.from_pretrained(str(out))


def test_model_names():
    from noulengine.models.loading import DEFAULT_ADAPTER_DIR, default_model_spec, is_base_name

    assert is_base_name("SmolLM2-135M-Instruct") and is_base_name("base") and not is_base_name("runs/x")
    assert is_base_name("gemma-3-270m") and is_base_name("smollm2") and not is_base_name("gemma")
    expected = str(DEFAULT_ADAPTER_DIR) if (DEFAULT_ADAPTER_DIR / "training.json").is_file() else "SmolLM2-135M-Instruct"
    assert default_model_spec() == expected


def test_adapter_config_target_modules_are_written_sorted_in_peft_format(tmp_path):
    """peft's set order of target_modules changes with PYTHONHASHSEED; the saved config does not."""
    from noulengine.train.methods import _sort_target_modules

    config = tmp_path / "adapter_config.json"
    data = {"r": 16, "target_modules": ["v_proj", "down_proj", "q_proj"], "alpha_pattern": {}}
    config.write_text(json.dumps(data, indent=2, sort_keys=True))
    _sort_target_modules(config)
    want = {**data, "target_modules": ["down_proj", "q_proj", "v_proj"]}
    assert config.read_text() == json.dumps(want, indent=2, sort_keys=True)
    regex = {"r": 4, "target_modules": "^(?:model\\\\.layers\\\\.1\\\\..*)$"}  # a pattern string stays as it is
    config.write_text(json.dumps(regex, indent=2, sort_keys=True))
    _sort_target_modules(config)
    assert json.loads(config.read_text()) == regex
    _sort_target_modules(tmp_path / "absent.json")  # nothing to sort: no error, nothing written
    assert not (tmp_path / "absent.json").exists()
