"""Issue #34 item 10: no command prints transformers' ``is_gradient_checkpointing``
FutureWarning. peft reads that deprecated property whenever it wraps a model, so every load of
the default model (base + LoRA adapter) and every LoRA training run printed it; the two calls into
peft now hide exactly that message (noulengine.models.peft_compat). A tiny random model, CPU."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings

from noulengine import Engine
from noulengine.models.peft_compat import quiet_peft_checkpointing_warning
from noulengine.train import TrainConfig, train
from noulengine.train.contamination import EvaluationIndex
from noulengine.train.methods import apply_method
from tests.conftest import REPO
from tests.test_train import save_tiny, toy_rows, write


def _future_warnings(fn) -> list[str]:
    """Run ``fn()`` showing every warning; the FutureWarning messages it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def _adapter(tmp_path, tiny_llama, tiny_tokenizer):
    """A `noulengine train` folder holding a LoRA adapter over a saved tiny model (one step)."""
    model_dir = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    data = write(tmp_path / "train.jsonl", toy_rows(8, 0))
    train(TrainConfig(data=str(data), output=str(tmp_path / "out"), model=str(model_dir), lora_r=4, max_steps=1,
                      progress=False), evaluation_index=EvaluationIndex())
    return tmp_path / "out"


def test_lora_training_wraps_the_model_without_a_future_warning(tiny_llama):
    assert _future_warnings(lambda: apply_method(copy.deepcopy(tiny_llama), method="lora", lora_r=4)) == []


def test_loading_an_adapter_prints_no_future_warning(tmp_path, tiny_llama, tiny_tokenizer):
    out = _adapter(tmp_path, tiny_llama, tiny_tokenizer)
    assert _future_warnings(lambda: Engine.from_pretrained(str(out))) == []


def test_decide_on_an_adapter_prints_no_future_warning(tmp_path, tiny_llama, tiny_tokenizer):
    """The user's view: a command's stderr, Python's default warning filters."""
    out = _adapter(tmp_path, tiny_llama, tiny_tokenizer)
    request = toy_rows(1, 3)[0]
    env = {**os.environ, "PYTHONPATH": str(REPO), "NOULENGINE_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)
    run = subprocess.run([sys.executable, "-m", "noulengine", "decide", "--model", str(out), "--no-progress",
                          "--state", json.dumps(request["state"]), "--questions", json.dumps(request["questions"])],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "FutureWarning" not in run.stderr and "is_gradient_checkpointing" not in run.stderr


def test_only_that_warning_is_hidden():
    def both():
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("another deprecation", FutureWarning)
        warnings.warn("`is_gradient_checkpointing` is deprecated (as a DeprecationWarning)", DeprecationWarning)

    def quiet():
        with quiet_peft_checkpointing_warning():
            both()

    assert _future_warnings(quiet) == ["another deprecation"]
    assert len(_future_warnings(both)) == 2  # outside the block, shown as configured
