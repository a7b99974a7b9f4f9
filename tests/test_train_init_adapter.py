"""Continued fine-tuning (``--init-adapter``): a LoRA run starts from a trained adapter's weights,
refuses an adapter of other LoRA settings, and pins the adapter by content on --resume."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from noulengine.train import TrainConfig, train
from noulengine.train.contamination import EvaluationIndex
from noulengine.train.methods import InitAdapterError
from tests.test_train import save_tiny, toy_rows, write


@pytest.fixture()
def toy(tmp_path, tiny_tokenizer, tiny_llama):
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    return {"model": str(model_dir), "data": str(write(tmp_path / "train.jsonl", toy_rows(24, 0))),
            "selection": str(write(tmp_path / "sel.jsonl", toy_rows(6, 1, role="selection")))}


def config(toy, output, **kw) -> TrainConfig:
    base = dict(data=toy["data"], output=str(output), model=toy["model"], selection=toy["selection"], lora_r=4,
                lora_alpha=8, lr=1e-2, epochs=1, batch_tokens=512, max_batch_size=4, seed=3, flip_rate_rows=0,
                progress=False)
    return TrainConfig(**{**base, **kw})


def test_a_run_started_from_an_adapter_starts_at_its_weights(tmp_path, toy):
    index = EvaluationIndex()
    first = train(config(toy, tmp_path / "a"), evaluation_index=index)
    a = load_file(tmp_path / "a" / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and a[k].abs().max() > 0 for k in a)  # trained: B left zero init
    # lr 0 and another seed: the saved adapter is the initial one, bit for bit, so the weights came
    # from the file and not from this run's (other-seed) peft initialisation
    cont = train(config(toy, tmp_path / "b", lr=0.0, seed=11, init_adapter=str(tmp_path / "a"), eval_every=1),
                 evaluation_index=index)
    b = load_file(tmp_path / "b" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the continued run's step-0 selection score is the first run's final model's
    start = cont.training["learning_curve"][0]
    assert start["step"] == 0
    assert start["all"]["nll"] == pytest.approx(first.training["epochs"][-1]["selection"]["nll"], abs=1e-6)
    init = cont.training["init_adapter"]
    assert init["sha256"] == hashlib.sha256((tmp_path / "a" / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert init["verified_base"] and init["tensors"] == len(a) and init["steps"] == first.training["steps"]
    assert "init_adapter" not in cont.training["hyperparameters"]  # a path; pinned by sha256 above
    # a plain run has no initial adapter
    assert first.training["init_adapter"] is None


def test_an_adapter_of_other_lora_settings_is_refused_by_name(tmp_path, toy):
    index = EvaluationIndex()
    train(config(toy, tmp_path / "a"), evaluation_index=index)
    with pytest.raises(InitAdapterError, match=r"adapter_config.json r is 4, this run's is 8"):
        train(config(toy, tmp_path / "b", lora_r=8, init_adapter=str(tmp_path / "a")), evaluation_index=index)
    with pytest.raises(InitAdapterError, match="training.json layout is 'state-first', this run's is 'schema-first'"):
        train(config(toy, tmp_path / "c", layout="schema-first", init_adapter=str(tmp_path / "a")),
              evaluation_index=index)
    with pytest.raises(InitAdapterError, match="no adapter_config.json there"):
        train(config(toy, tmp_path / "d", init_adapter=str(tmp_path)), evaluation_index=index)
    # a merged model's folder is named as such
    train(config(toy, tmp_path / "m", merge=True, max_steps=1), evaluation_index=index)
    with pytest.raises(InitAdapterError, match="holds full model weights"):
        train(config(toy, tmp_path / "d2", init_adapter=str(tmp_path / "m")), evaluation_index=index)
    # fields that change what a tensor means without changing its shape: a plain peft adapter (no
    # training.json) with rsLoRA scaling would load and be another model
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (plain / name).write_bytes((tmp_path / "a" / name).read_bytes())
    cfg = json.loads((plain / "adapter_config.json").read_text())
    (plain / "adapter_config.json").write_text(json.dumps({**cfg, "use_rslora": True}))
    with pytest.raises(InitAdapterError, match=r"use_rslora is True, this run's is False \(this trainer always uses"):
        train(config(toy, tmp_path / "f", init_adapter=str(plain)), evaluation_index=index)
    (plain / "adapter_config.json").write_text("{not json")
    with pytest.raises(InitAdapterError, match="adapter_config.json is not readable JSON"):
        train(config(toy, tmp_path / "g", init_adapter=str(plain)), evaluation_index=index)
    (plain / "adapter_config.json").write_text(json.dumps(cfg))
    plain_run = train(config(toy, tmp_path / "h", init_adapter=str(plain), max_steps=1), evaluation_index=index)
    assert plain_run.training["init_adapter"]["verified_base"] is False  # no training.json: base unchecked
    with pytest.raises(ValueError, match="method must be 'lora'"):
        config(toy, tmp_path / "e", method="full", init_adapter=str(tmp_path / "a"))


def test_resume_refuses_another_initial_adapter(tmp_path, toy):
    index = EvaluationIndex()
    train(config(toy, tmp_path / "a"), evaluation_index=index)
    train(config(toy, tmp_path / "a2", seed=5), evaluation_index=index)
    paused = train(config(toy, tmp_path / "b", init_adapter=str(tmp_path / "a"), stop_after=2), evaluation_index=index)
    assert paused.stopped == "stop_after"
    meta = json.loads((tmp_path / "b" / "checkpoint" / "checkpoint.json").read_text())
    assert meta["data_sha256"]["init_adapter"] == hashlib.sha256(
        (tmp_path / "a" / "adapter_model.safetensors").read_bytes()).hexdigest()
    with pytest.raises(ValueError, match=r"--init-adapter: the checkpoint was trained with it \(sha256 [0-9a-f]{64}\), "
                       "this command has none"):
        train(config(toy, tmp_path / "b", resume=str(tmp_path / "b")), evaluation_index=index)
    with pytest.raises(ValueError, match="--init-adapter: the file's sha256"):
        train(config(toy, tmp_path / "b", init_adapter=str(tmp_path / "a2"), resume=str(tmp_path / "b")),
              evaluation_index=index)
    done = train(config(toy, tmp_path / "b", init_adapter=str(tmp_path / "a"), resume=str(tmp_path / "b")),
                 evaluation_index=index)
    assert done.stopped is None and done.training["init_adapter"]["sha256"] == meta["data_sha256"]["init_adapter"]
