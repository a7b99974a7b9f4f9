"""A trained model served unmerged so adapters join it (issue #54 item 6).

``Engine.from_pretrained(trained, adapters=...)`` loads the trained model's base with its own
adapter as the default slot: requests naming no adapter answer as the merged model does (within
1e-5), requests naming an adapter as that adapter merged alone; the default cannot be unloaded; an
adapter trained on another base is refused before the model loads, naming the ``--model`` that
serves it; a shipped model's name works wherever an adapter folder does."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from noulengine import Engine
from noulengine.engine.engine import precheck_adapters
from noulengine.engine.lora import AdapterError
from tests.conftest import three_question_request, write_peft_adapter

peft = pytest.importorskip("peft")


def _peft_folder(model, folder, seed: int, r: int = 4):
    return write_peft_adapter(model, folder, r=r, targets=["q_proj", "v_proj", "down_proj"], seed=seed)


@pytest.fixture(scope="module")
def trained(tiny_llama, tiny_llama_dir, tmp_path_factory):
    """A trained model folder on the tiny base (as ``noulengine train`` writes one) and a second
    adapter of the same base."""
    from noulengine.models.loading import resolve_model

    root = tmp_path_factory.mktemp("unmerged")
    _, ident = resolve_model(str(tiny_llama_dir))
    record = {"format": "noulengine-training", "version": 1, "base_model": {
        "name": "tiny", "spec": str(tiny_llama_dir), "sha256": ident.sha256}, "method": "lora",
        "readout": "label-sequence", "layout": "state-first", "prompt_version": "noul-prompt-3"}
    model = _peft_folder(tiny_llama, root / "model", 11)
    (model / "training.json").write_text(json.dumps({**record, "name": "tiny-trained"}))
    other = _peft_folder(tiny_llama, root / "other", 12, r=2)
    (other / "training.json").write_text(json.dumps({**record, "name": "tiny-other"}))
    return {"model": model, "other": other}


def _probs(decision) -> dict:
    assert decision.ok, decision.error
    return {f: a.probabilities for f, a in decision.answers.items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(abs(a[f][lab] - b[f][lab]) for f in a for lab in a[f])


REQUEST = three_question_request(state={"ticket": "Order 4471: charged twice, parcel never came."})


def test_the_unmerged_default_answers_as_the_merged_model_beside_another_adapter(trained):
    merged = Engine.from_pretrained(str(trained["model"]))
    other_alone = Engine.from_pretrained(str(trained["other"]))
    engine = Engine.from_pretrained(str(trained["model"]), adapters={"o": str(trained["other"])})
    assert engine.default_adapter == "tiny-trained" and engine.identity == merged.identity
    assert engine.config.readout == "label-sequence" == merged.config.readout
    assert engine.describe()["model"] == merged.describe()["model"]
    # one mixed batch: rows of the default and of the adapter side by side
    got = engine.decide_batch([REQUEST, {**REQUEST, "adapter": "o"}, REQUEST])
    want_default, want_other = _probs(merged.decide(REQUEST)), _probs(other_alone.decide(REQUEST))
    assert _max_diff(_probs(got[0]), want_default) < 1e-5 and _max_diff(_probs(got[2]), want_default) < 1e-5
    assert _max_diff(_probs(got[1]), want_other) < 1e-5
    assert _max_diff(want_default, want_other) > 1e-3  # two different models: the test can fail


def test_unmerged_without_adapters_and_the_default_cannot_be_unloaded(trained):
    engine = Engine.from_pretrained(str(trained["model"]), unmerged=True)
    assert engine.default_adapter == "tiny-trained" and list(engine.adapters.slots) == ["tiny-trained"]
    with pytest.raises(AdapterError, match="default model .* cannot be unloaded"):
        engine.unload_adapter("tiny-trained")
    engine.load_adapter("o", trained["other"])  # a run-time load joins the same base
    engine.unload_adapter("o")
    merged = Engine.from_pretrained(str(trained["model"]), unmerged=False)
    assert merged.default_adapter is None and not merged.adapters.slots


def test_an_adapter_on_another_base_is_refused_before_the_model_loads(trained, tmp_path, monkeypatch):
    from noulengine.models import loading

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        (foreign / f).write_bytes((trained["other"] / f).read_bytes())
    (foreign / "training.json").write_text(json.dumps({"name": "f", "base_model": {
        "spec": "SmolLM2-135M-Instruct", "sha256": "b179c9523d0e" + "0" * 52}}))
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    with pytest.raises(AdapterError, match=r"adapter 'f' .* serve it with --model SmolLM2-135M-Instruct"):
        Engine.from_pretrained(str(trained["model"]), adapters={"f": str(foreign)})
    with pytest.raises(AdapterError, match="drop --dtype int8"):
        precheck_adapters(str(trained["model"]), {"o": str(trained["other"])}, "int8")
    with pytest.raises(AdapterError, match="needs adapter_config.json"):
        precheck_adapters(str(trained["model"]), {"x": str(tmp_path / "missing")})
    assert precheck_adapters(str(trained["model"]), {"o": str(trained["other"])}) == trained["model"]
    with pytest.raises(AdapterError, match="'tiny-trained' is the name of the model itself"):
        precheck_adapters(str(trained["model"]), {"tiny-trained": str(trained["other"])})


def test_a_shipped_name_registers_as_its_folder_on_the_server(tiny_llama, tiny_tokenizer):
    """``serve --adapter v2=noul-smollm2-135m-v2``: the registry reads the shipped folder (here the
    tiny model then refuses it for its layers, naming that folder, not 'no such folder')."""
    from noulengine.models.loading import DECISION_MODELS_DIR, DEFAULT_DECISION_MODEL
    from noulengine.serve.adapters import AdapterRegistry

    registry = AdapterRegistry(Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer))
    with pytest.raises(AdapterError, match=rf"{DECISION_MODELS_DIR / DEFAULT_DECISION_MODEL}\): module .* is not in"):
        registry.register("v2", DEFAULT_DECISION_MODEL)


@pytest.mark.default_model
@pytest.mark.slow
def test_the_default_served_unmerged_beside_a_shipped_adapter_answers_as_merged():
    """The real default with ``--adapter v2=noul-smollm2-135m-v2``: no-adapter rows answer as the
    merged default (with its temperatures), the v2 rows as v2 loaded by name."""
    from noulengine.models.loading import DEFAULT_DECISION_MODEL

    request = {"state": {"ticket": "I returned the shoes last week, please send my money back."}, "questions": {
        "route": {"type": "choice", "instructions": "Which team handles this?", "criteria": {
            "billing": "Payments and refunds", "shipping": "Delivery problems", "tech": "Website or app errors"}},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}}
    engine = Engine.from_pretrained(adapters={"v2": "noul-smollm2-135m-v2"})
    merged = Engine.from_pretrained()
    assert engine.default_adapter == DEFAULT_DECISION_MODEL and engine.identity == merged.identity
    assert (engine.calibration is None) == (merged.calibration is None)
    got = engine.decide_batch([request, {**request, "adapter": "v2"}])
    want = _probs(merged.decide(request))
    assert _max_diff(_probs(got[0]), want) < 1e-4
    assert _max_diff(_probs(got[1]), _probs(Engine.from_pretrained("noul-smollm2-135m-v2").decide(request))) < 1e-4
