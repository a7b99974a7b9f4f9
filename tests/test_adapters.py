"""Several LoRA adapters on one base, mixed in one batch (issue #47 items 1, 2, 4: the engine).

Three PEFT adapters of different ranks and target modules on a tiny random Llama; every row of a
mixed batch must equal its adapter merged into the base alone (peft's merge_and_unload) within 1e-5,
for every readout and both prompt layouts, through the tree, causal and prefix-cache paths; a
request's answer must not depend on which adapters share its batch; a prefix computed under one
adapter never serves another."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from noulengine import Engine
from noulengine.engine.lora import AdapterError, read_adapter
from tests.conftest import three_question_request

peft = pytest.importorskip("peft")

SPECS = {  # name: (rank, target modules, rsLoRA)
    "ranks2": (2, ["q_proj", "v_proj"], False),
    "ranks4": (4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], False),
    "ranks8": (8, ["gate_proj", "down_proj"], True),
}


@pytest.fixture(scope="module")
def adapter_dirs(tiny_llama, tmp_path_factory):
    """Three PEFT LoRA folders with non-zero B (peft starts B at zero: no effect to test)."""
    from peft import LoraConfig, get_peft_model

    from noulengine.models.peft_compat import quiet_peft_checkpointing_warning

    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for k, (name, (r, targets, rslora)) in enumerate(SPECS.items()):
        with quiet_peft_checkpointing_warning():
            model = get_peft_model(copy.deepcopy(tiny_llama), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                                                                          lora_dropout=0.0, use_rslora=rslora))
        gen = torch.Generator().manual_seed(100 + k)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        model.save_pretrained(str(root / name))
        out[name] = root / name
    return out


def _merged(tiny_llama, tiny_tokenizer, folder, **kw) -> Engine:
    from peft import PeftModel

    from noulengine.models.peft_compat import quiet_peft_checkpointing_warning

    with quiet_peft_checkpointing_warning():
        model = PeftModel.from_pretrained(copy.deepcopy(tiny_llama), str(folder)).merge_and_unload().eval()
    return Engine.from_model(model, tiny_tokenizer, **kw)


def _requests(adapter: str | None, k: int) -> list[dict]:
    state = {"ticket": f"Order {k}: my card was charged twice and the parcel never came."}
    linear = {"state": state, "questions": {"refund": {"type": "noul", "instructions": "Money back?"}}}
    long = three_question_request(state={"log": [f"event {j} of order {k}" for j in range(40)]})
    out = [three_question_request(state=state), linear, long]
    return [{**r, "adapter": adapter} if adapter else r for r in out]


def _probs(decision) -> dict:
    assert decision.ok, decision.error
    return {f: a.probabilities for f, a in decision.answers.items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(abs(a[f][lab] - b[f][lab]) for f in a for lab in a[f])


@pytest.mark.parametrize("readout", ["symbols", "label-token", "label-sequence"])
@pytest.mark.parametrize("layout", ["state-first", "schema-first"])
def test_every_row_of_a_mixed_batch_equals_its_adapter_merged_alone(tiny_llama, tiny_tokenizer, adapter_dirs,
                                                                    readout, layout):
    kw = dict(readout=readout, layout=layout, prefix_cache_min_tokens=200)
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, adapters=adapter_dirs, **kw)
    names = [None, *SPECS]
    batch = [r for k, name in enumerate(names) for r in _requests(name, k)]
    got = engine.decide_batch(batch)
    for name in names:
        alone = (Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, **kw) if name is None
                 else _merged(tiny_llama, tiny_tokenizer, adapter_dirs[name], **kw))
        k = names.index(name)
        want = alone.decide_batch(_requests(None, k))
        for j, w in enumerate(want):
            assert _max_diff(_probs(got[3 * k + j]), _probs(w)) <= 1e-5, (name, j)
    # the adapters change the answers (the test would pass vacuously otherwise)
    assert _max_diff(_probs(got[0]), _probs(got[3])) > 1e-3


def test_an_answer_does_not_depend_on_the_adapters_beside_it(tiny_llama, tiny_tokenizer, adapter_dirs):
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, adapters=adapter_dirs,
                               prefix_cache_min_tokens=200)
    alone = [_probs(d) for d in engine.decide_batch(_requests("ranks4", 1))]
    engine.reset_prefix_cache()
    mixed = engine.decide_batch(_requests("ranks2", 0) + _requests("ranks4", 1) + _requests(None, 2)
                                + _requests("ranks8", 3))
    for j in range(3):
        assert _max_diff(_probs(mixed[3 + j]), alone[j]) <= 1e-6


def test_a_prefix_computed_under_one_adapter_never_serves_another(tiny_llama, tiny_tokenizer, adapter_dirs):
    """The same long request under two adapters, one after the other, with the prefix store on:
    the second must equal its own adapter merged alone, which a store keyed by tokens alone (the
    first adapter's stored state prefix reused) would break."""
    kw = dict(prefix_cache_min_tokens=0)
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, adapters=adapter_dirs, **kw)
    request = _requests(None, 7)[2]
    engine.decide({**request, "adapter": "ranks4"})
    assert engine.prefix_store.stats.inserts >= 2
    second = engine.decide({**request, "adapter": "ranks2"})
    want = _merged(tiny_llama, tiny_tokenizer, adapter_dirs["ranks2"], **kw).decide(request)
    assert _max_diff(_probs(second), _probs(want)) <= 1e-5
    base = engine.decide(request)  # and the base's own prefix is the base's
    want_base = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, **kw).decide(request)
    assert _max_diff(_probs(base), _probs(want_base)) <= 1e-5


def test_unknown_and_unloaded_adapters_are_error_rows_naming_the_field(tiny_llama, tiny_tokenizer, adapter_dirs):
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, adapters={"a": adapter_dirs["ranks2"]})
    ok, bad = engine.decide_batch([_requests("a", 0)[0], {**_requests(None, 0)[0], "id": "r1", "adapter": "nope"}])
    assert ok.ok and not bad.ok
    assert "field 'adapter'" in bad.error["message"] and "'nope'" in bad.error["message"] and "a" in bad.error["message"]
    engine.unload_adapter("a")
    assert not engine.decide_batch([_requests("a", 0)[0]])[0].ok
    assert all(e.adapter == 0 for e in engine.prefix_store._entries.values())  # its prefixes went with it
    with pytest.raises(AdapterError, match="no adapter named 'a'"):
        engine.unload_adapter("a")
    bad_type = engine.decide_batch([{**_requests(None, 0)[0], "adapter": 3}])[0]
    assert not bad_type.ok and "adapter must be a non-blank string" in bad_type.error["message"]


def test_an_adapter_for_another_base_is_refused_naming_both(tiny_llama, tiny_tokenizer, adapter_dirs, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from noulengine.models.loading import ModelIdentity

    torch.manual_seed(0)
    narrower = LlamaForCausalLM(LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=2048)).eval()
    with pytest.raises(AdapterError, match="made for another base"):  # a plain PEFT folder: the shapes tell
        Engine.from_model(narrower, tiny_tokenizer, adapters={"x": adapter_dirs["ranks4"]})
    folder = tmp_path / "trained"
    folder.mkdir()
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        (folder / f).write_bytes((adapter_dirs["ranks2"] / f).read_bytes())
    (folder / "training.json").write_text(json.dumps({"base_model": {"spec": "SmolLM2-135M-Instruct",
                                                                     "sha256": "b179c9523d0e" + "0" * 52}}))
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer)
    engine.identity = ModelIdentity("tiny-llama", "/x", "f" * 64)
    with pytest.raises(AdapterError) as info:
        engine.load_adapter("t", folder)
    assert "'SmolLM2-135M-Instruct'" in str(info.value) and "'tiny-llama'" in str(info.value)


def test_a_shipped_name_serves_its_folder_only_when_it_matches_its_pin(tiny_llama, tiny_tokenizer, monkeypatch):
    """``load_adapter(name, "noul-smollm2-135m-v2")`` reads the shipped folder; a folder that no longer
    matches its pin is refused before anything is read (here the real v2 adapter would also be
    refused by the tiny model's base check: the pin comes first, naming the file)."""
    from noulengine.models import loading

    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer)
    monkeypatch.setitem(loading.SHIPPED_ADAPTER_SHA256, loading.DEFAULT_DECISION_MODEL, "0" * 64)
    with pytest.raises(AdapterError, match=f"adapter 'v2': .*adapter_model.safetensors has sha256 .*not the pinned"):
        engine.load_adapter("v2", loading.DEFAULT_DECISION_MODEL)
    monkeypatch.undo()
    # past the pin, the folder is read: the tiny model lacks the real adapter's layers
    with pytest.raises(AdapterError, match=rf"decision_models/{loading.DEFAULT_DECISION_MODEL}\): module .* is not in"):
        engine.load_adapter("v2", loading.DEFAULT_DECISION_MODEL)


def test_unsupported_peft_features_are_refused_by_name(adapter_dirs, tmp_path):
    folder = tmp_path / "dora"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes((adapter_dirs["ranks2"] / "adapter_model.safetensors").read_bytes())
    config = json.loads((adapter_dirs["ranks2"] / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(AdapterError, match="'use_dora'"):
        read_adapter("d", folder)
    with pytest.raises(AdapterError, match="needs adapter_config.json"):
        read_adapter("none", tmp_path / "missing")
    a = read_adapter("r8", adapter_dirs["ranks8"])
    assert a.ranks == {8} and all(s == pytest.approx(16 / 8 ** 0.5) for _, _, s in a.modules.values())  # rsLoRA


@pytest.mark.default_model
@pytest.mark.slow
def test_the_shipped_adapter_served_unmerged_equals_the_merged_default():
    """The real default model: SmolLM2-135M-Instruct with the shipped v2 adapter loaded unmerged,
    beside base rows in the same batch, answers the README's request as the merged default does
    (within 1e-5), with the adapter's own calibration; the base row does not."""
    from noulengine.models.loading import DEFAULT_DECISION_MODEL, ModelNotFoundError

    try:  # the shipped adapter by its name (its folder, checked against its pin)
        multi = Engine.from_pretrained("SmolLM2-135M-Instruct", adapters={"v2": DEFAULT_DECISION_MODEL})
        merged = Engine.from_pretrained()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    request = {"state": {"ticket": "My card was charged twice for order 4471."}, "questions": {
        "route": {"type": "choice", "instructions": "Which team handles this?", "criteria": {
            "billing": "Payments and refunds", "shipping": "Delivery problems", "tech": "Website or app errors"}},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}}
    adapted, base = multi.decide_batch([{**request, "adapter": "v2"}, request])
    want = merged.decide(request)
    assert _max_diff(_probs(adapted), _probs(want)) <= 1e-5
    assert all(adapted.answers[f].temperature == want.answers[f].temperature for f in want.answers)
    assert _max_diff(_probs(base), _probs(want)) > 0.05


# -- the HTTP server (issue #47 item 3) ---------------------------------------------------------

def test_the_server_serves_adapters_by_name_loads_under_its_root_and_evicts_lru(tiny_llama, tiny_tokenizer,
                                                                               adapter_dirs, tmp_path):
    pytest.importorskip("fastapi")
    import shutil

    from fastapi.testclient import TestClient

    from noulengine.serve.app import create_app
    from noulengine.serve.config import ServeConfig

    root = tmp_path / "root"
    for name in ("ranks2", "ranks8"):
        shutil.copytree(adapter_dirs[name], root / name)
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer)
    cfg = ServeConfig(model_name="tiny", adapters={"r4": str(adapter_dirs["ranks4"])}, adapter_root=str(root),
                      max_loaded_adapters=2)
    request = _requests(None, 0)[0]
    merged = {n: _merged(tiny_llama, tiny_tokenizer, adapter_dirs[f], readout=engine.config.readout).decide(request)
              for n, f in (("r4", "ranks4"), ("r2", "ranks2"), ("r8", "ranks8"))}
    with TestClient(create_app(engine, cfg)) as c:
        listing = c.get("/v1/adapters").json()
        assert [a["name"] for a in listing["adapters"]] == ["r4"] and listing["max_loaded"] == 2
        r = c.post("/v1/decide", json={**request, "adapter": "r4"})
        assert r.status_code == 200 and r.json()["adapter"] == "r4"
        got = {f: a["probabilities"] for f, a in r.json()["answers"].items()}
        assert _max_diff(got, _probs(merged["r4"])) <= 1e-5
        assert c.post("/v1/decide", json=request).json()["adapter"] is None
        streamed = c.post("/v1/decide", json={**request, "adapter": "r4", "stream": True}).text
        assert '"adapter": "r4"' in streamed.split("event: done")[1]  # the stream's closing event names it too
        unknown = c.post("/v1/decide", json={**request, "adapter": "nope"})
        assert unknown.status_code == 404 and unknown.json()["detail"]["error_type"] == "adapter_not_found"
        # run-time loads: only under the root
        assert c.post("/v1/adapters", json={"name": "x", "path": str(adapter_dirs["ranks4"])}).status_code == 403
        assert c.post("/v1/adapters", json={"name": "y", "path": "../../etc"}).status_code == 403
        assert c.post("/v1/adapters", json={"name": "r2", "path": "ranks2"}).status_code == 200
        assert c.post("/v1/adapters", json={"name": "r2", "path": "ranks2"}).status_code == 409
        assert c.post("/v1/adapters", json={"name": "r8", "path": "ranks8"}).status_code == 200  # evicts r4
        state = {a["name"]: a["loaded"] for a in c.get("/v1/adapters").json()["adapters"]}
        assert state == {"r4": False, "r2": True, "r8": True}
        # an evicted adapter is loaded again when named, and still answers as itself
        again = c.post("/v1/decide", json={**request, "adapter": "r4"}).json()
        assert _max_diff({f: a["probabilities"] for f, a in again["answers"].items()}, _probs(merged["r4"])) <= 1e-5
        # /v1/systemone: the request's model chooses the adapter
        jev = c.post("/v1/systemone", json={"model": "r8", "state": request["state"], "questions": {
            "flag": {"type": "noul", "instructions": "Is it urgent?"}}})
        assert jev.status_code == 200 and jev.json()["model"] == "r8"
        metrics = c.get("/metrics").text
        assert 'noulengine_adapter_loaded{adapter="r4"} 1' in metrics and "noulengine_adapter_evictions_total 2" in metrics
        assert c.delete("/v1/adapters/r2").status_code == 200 and c.delete("/v1/adapters/r2").status_code == 404
        assert c.post("/v1/decide", json={**request, "adapter": "r2"}).status_code == 404


@pytest.mark.default_model
@pytest.mark.slow
def test_the_adapters_bench_checks_every_variant_against_the_merged_model(tmp_path):
    """`noulengine bench --adapters` (a benchmark, not a timing test): it runs, every variant's
    answers equal the merged model's within the tolerance, and it writes its table."""
    from noulengine.bench.cli import main as bench_main

    out = tmp_path / "adapters.json"
    assert bench_main(["--adapters", "--quick", "--reps", "1", "--workloads", "tickets_3q", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    (wl,) = result["workloads"]
    assert [v["variant"] for v in wl["variants"]] == ["merged", "1 adapter", "2 adapters", "4 adapters"]
    assert all(v["ok"] and v["max_prob_diff_vs_merged"] <= 1e-4 for v in wl["variants"])
    assert result["memory"]["adapters_loaded"] == 4 and result["memory"]["adapter_bytes"] > 0
    assert "| tickets_3q (12 requests) | 4 adapters |" in out.with_suffix(".md").read_text()


def test_eval_with_an_adapter_answers_every_row_with_it(tiny_llama, tiny_tokenizer, adapter_dirs, tmp_path,
                                                        monkeypatch):
    """`noulengine eval --adapter NAME=PATH`: the rows are answered by the adapter served unmerged
    (as the adapter merged would answer them), and the run key names it."""
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "jevbench" / "easy.jsonl").is_file():
        pytest.skip("shared data not present")
    from noulengine import cli
    from noulengine.eval.__main__ import main

    monkeypatch.setattr(cli, "engine_from_args", lambda args, adapters=None, unmerged=None: Engine.from_model(
        copy.deepcopy(tiny_llama), tiny_tokenizer, adapters=adapters))
    out = tmp_path / "run"
    args = ["--tasks", "jevbench_easy", "--limit", "3", "--no-plots", "--no-progress", "--output", str(out)]
    assert main([*args, "--adapter", f"r4={adapter_dirs['ranks4']}"]) == 0
    assert json.loads((out / "run_key.json").read_text())["adapter"] == "r4"
    merged = _merged(tiny_llama, tiny_tokenizer, adapter_dirs["ranks4"])
    monkeypatch.setattr(cli, "engine_from_args", lambda args, adapters=None, unmerged=None: merged)
    ref = tmp_path / "ref"
    assert main(["--tasks", "jevbench_easy", "--limit", "3", "--no-plots", "--no-progress", "--output", str(ref)]) == 0
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    want = [json.loads(x) for x in (ref / "predictions.jsonl").read_text().splitlines()]
    for a, b in zip(rows, want):
        for f in b["answers"]:
            pa, pb = a["answers"][f]["probabilities"], b["answers"][f]["probabilities"]
            assert max(abs(pa[k] - pb[k]) for k in pb) <= 1e-5
    # the same folder without the adapter is another run: refused, naming the difference
    monkeypatch.setattr(cli, "engine_from_args", lambda args, adapters=None, unmerged=None: Engine.from_model(
        copy.deepcopy(tiny_llama), tiny_tokenizer, adapters=adapters))
    assert main(args) == 2
    assert main([*args, "--adapter", "a=x", "--adapter", "b=y"]) == 2
