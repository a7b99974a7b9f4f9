"""The opt-in int8 CPU path (issue #15): quantized linear layers, float32 head, close answers."""

from __future__ import annotations

import pytest
import torch

from noulengine import Engine
from tests.conftest import three_question_request


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    return tiny_llama_dir


def test_int8_quantizes_the_decoder_and_keeps_the_head_float32(model_dir):
    engine = Engine.from_pretrained(str(model_dir), dtype="int8", device="cpu")
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    named = list(engine.runner.base.named_modules())
    assert any(isinstance(m, DynamicLinear) for _, m in named)
    for name, m in named:  # every decoder linear is quantized but the MLP down-projections
        if type(m) is torch.nn.Linear or isinstance(m, DynamicLinear):
            assert isinstance(m, DynamicLinear) != name.endswith("down_proj"), name
    assert engine.runner.head.weight.dtype == torch.float32
    assert engine.describe()["dtype"] == "int8"
    ref = Engine.from_pretrained(str(model_dir), dtype="float32", device="cpu")
    a, b = engine.decide(three_question_request()), ref.decide(three_question_request())
    for fld, x in a.answers.items():
        assert abs(sum(x.probabilities.values()) - 1) < 1e-9
        diff = max(abs(p - q) for p, q in zip(x.probabilities.values(), b.answers[fld].probabilities.values()))
        assert diff < 0.05, (fld, diff)  # quantization noise, not a different model


def test_int8_is_refused_off_cpu(model_dir):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CPU path"):
            Engine.from_pretrained(str(model_dir), dtype="int8", device="cuda")
