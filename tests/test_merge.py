"""``noulengine merge`` (issue #54 item 1): LoRA adapters of one base merged into one.

The rules: a one-source merge at weight 1 answers as the source; a linear merge is exactly
Σ w_i · s_i B_i A_i (checked against the deltas computed by hand, within 1e-5, and through the
engine against the base with those deltas added to its weights); svd at the summed rank equals
linear; ties and dare_ties are deterministic for a seed and keep the requested rank; sources on
another base, readout or layout are refused naming both; the output folder records its sources."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from noulengine import Engine
from noulengine.models.merge import (MergeError, delta_weights, main, merge_adapters, parse_source,
                                     resolve_sources)
from tests.conftest import three_question_request, write_peft_adapter

peft = pytest.importorskip("peft")

SPECS = {  # name: (rank, target modules)
    "a": (4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "b": (2, ["q_proj", "v_proj", "down_proj"]),
    "c": (4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
}
TRAINING = {"format": "noulengine-training", "version": 1, "base_model": {"name": "tiny", "spec": "tiny",
            "sha256": "0" * 64}, "method": "lora", "readout": "auto", "loss": "full",
            "prompt_version": "noul-prompt-3", "layout": "state-first"}


@pytest.fixture(scope="module")
def sources(tiny_llama, tmp_path_factory):
    """Three PEFT LoRA folders (random non-zero B) with a noulengine training.json each."""
    root = tmp_path_factory.mktemp("merge-sources")
    out = {}
    for k, (name, (r, targets)) in enumerate(SPECS.items()):
        write_peft_adapter(tiny_llama, root / name, r=r, targets=targets, seed=200 + k)
        (root / name / "training.json").write_text(json.dumps({**TRAINING, "name": f"tiny-{name}"}))
        out[name] = root / name
    return out


def _merge(tiny_llama, pairs, out, **kw):
    return merge_adapters(pairs, out, base=copy.deepcopy(tiny_llama), **kw)


def _max_delta_diff(got: dict, want: dict) -> float:
    assert set(got) == set(want)
    return max((got[m] - want[m]).abs().max().item() for m in want)


def _expected(sources, weights: dict[str, float]) -> dict:
    deltas = {n: delta_weights(sources[n]) for n in weights}
    modules = set().union(*deltas.values())
    return {m: sum(w * deltas[n][m] for n, w in weights.items() if m in deltas[n]) for m in modules}


def test_a_one_source_merge_at_weight_one_answers_as_the_source(tiny_llama, tiny_tokenizer, sources, tmp_path):
    out = _merge(tiny_llama, [(str(sources["a"]), 1.0)], tmp_path / "one")
    assert _max_delta_diff(delta_weights(out), delta_weights(sources["a"])) < 1e-6
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, readout="auto")
    engine.load_adapter("source", sources["a"])
    engine.load_adapter("merged", out)
    request = three_question_request(state={"ticket": "My card was charged twice for order 4471."})
    got = engine.decide({**request, "adapter": "merged"})
    want = engine.decide({**request, "adapter": "source"})
    base = engine.decide(request)
    for field, answer in want.answers.items():
        for label, p in answer.probabilities.items():
            assert abs(got.answers[field].probabilities[label] - p) < 1e-5
    # and the adapter does something: the test would pass trivially on a no-op adapter otherwise
    assert max(abs(base.answers[f].probabilities[lab] - p) for f, a in want.answers.items()
               for lab, p in a.probabilities.items()) > 1e-3


def test_a_linear_merge_is_the_weighted_sum_of_the_deltas(tiny_llama, sources, tmp_path):
    # ranks 4 and 2, different target modules, a negative weight (task arithmetic's subtraction)
    weights = {"a": 0.7, "b": -0.4, "c": 0.3}
    out = _merge(tiny_llama, [(str(sources[n]), w) for n, w in weights.items()], tmp_path / "lin")
    assert _max_delta_diff(delta_weights(out), _expected(sources, weights)) < 1e-5
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 10 and config["lora_alpha"] == 10  # the summed rank, scale 1


def test_a_linear_merge_served_equals_the_deltas_added_to_the_base_by_hand(tiny_llama, tiny_tokenizer, sources,
                                                                          tmp_path):
    weights = {"a": 0.5, "c": 0.5}
    out = _merge(tiny_llama, [(str(sources[n]), w) for n, w in weights.items()], tmp_path / "soup")
    by_hand = copy.deepcopy(tiny_llama)
    modules = dict(by_hand.named_modules())
    with torch.no_grad():
        for path, delta in _expected(sources, weights).items():
            modules[path].weight += delta
    reference = Engine.from_model(by_hand, tiny_tokenizer, readout="auto")
    engine = Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer, readout="auto")
    engine.load_adapter("soup", out)
    request = three_question_request(state={"log": [f"event {j}" for j in range(20)]})
    got, want = engine.decide({**request, "adapter": "soup"}), reference.decide(request)
    assert got.ok and want.ok
    for field, answer in want.answers.items():
        for label, p in answer.probabilities.items():
            assert abs(got.answers[field].probabilities[label] - p) < 1e-5


def test_svd_at_the_summed_rank_equals_linear(tiny_llama, sources, tmp_path):
    pairs = [(str(sources["a"]), 0.5), (str(sources["c"]), 0.5)]
    svd = _merge(tiny_llama, pairs, tmp_path / "svd", method="svd")
    assert json.loads((svd / "adapter_config.json").read_text())["r"] == 8
    assert _max_delta_diff(delta_weights(svd), _expected(sources, {"a": 0.5, "c": 0.5})) < 1e-4
    low = _merge(tiny_llama, pairs, tmp_path / "svd2", method="svd", svd_rank=2)
    assert json.loads((low / "adapter_config.json").read_text())["r"] == 2
    assert _max_delta_diff(delta_weights(low), _expected(sources, {"a": 0.5, "c": 0.5})) > 1e-3  # truncated


def test_ties_and_dare_ties_keep_the_rank_record_the_density_and_are_seeded(tiny_llama, sources, tmp_path):
    pairs = [(str(sources["a"]), 0.5), (str(sources["c"]), 0.5)]
    ties = _merge(tiny_llama, pairs, tmp_path / "ties", method="ties")
    record = json.loads((ties / "training.json").read_text())["merge"]
    assert record["density"] == 0.2 and record["rank"] == 8 and record["peft_combination"] == "ties_svd"
    # TIES trims 80% of each delta: not the plain average
    assert _max_delta_diff(delta_weights(ties), _expected(sources, {"a": 0.5, "c": 0.5})) > 1e-3
    d1 = _merge(tiny_llama, pairs, tmp_path / "d1", method="dare_ties", density=0.5, seed=1)
    d1b = _merge(tiny_llama, pairs, tmp_path / "d1b", method="dare_ties", density=0.5, seed=1)
    d2 = _merge(tiny_llama, pairs, tmp_path / "d2", method="dare_ties", density=0.5, seed=2)
    assert _max_delta_diff(delta_weights(d1), delta_weights(d1b)) == 0.0
    assert _max_delta_diff(delta_weights(d1), delta_weights(d2)) > 1e-4


def test_the_output_records_each_source_and_drops_their_temperatures(tiny_llama, sources, tmp_path):
    out = _merge(tiny_llama, [(str(sources["a"]), 0.3), (str(sources["c"]), 0.7)], tmp_path / "rec", name="soup-1")
    record = json.loads((out / "training.json").read_text())
    assert record["name"] == "soup-1" and record["readout"] == "auto" and record["layout"] == "state-first"
    assert record["base_model"] == TRAINING["base_model"]
    assert [(s["name"], s["weight"], s["rank"]) for s in record["merge"]["sources"]] == [("tiny-a", 0.3, 4),
                                                                                          ("tiny-c", 0.7, 4)]
    assert all(len(s["adapter_sha256"]) == 64 for s in record["merge"]["sources"])
    assert not (out / "calibration.json").exists()
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                     "training.json"]
    assert all((p.stat().st_mode & 0o777) == 0o644 for p in out.iterdir())


@pytest.mark.parametrize("field,value,words", [
    ("base_model", {"name": "other", "spec": "other", "sha256": "1" * 64}, "other bases"),
    ("readout", "symbols", "differ in readout"),
    ("layout", "schema-first", "differ in layout"),
    ("prompt_version", "noul-prompt-2", "differ in prompt_version"),
])
def test_sources_read_another_way_are_refused_naming_both(sources, tmp_path, field, value, words):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(sources["c"], other)
    training = json.loads((other / "training.json").read_text())
    (other / "training.json").write_text(json.dumps({**training, field: value}))
    with pytest.raises(MergeError) as exc:
        resolve_sources([(str(sources["a"]), 0.5), (str(other), 0.5)])
    assert words in str(exc.value) and str(sources["a"]) in str(exc.value) and str(other) in str(exc.value)


def test_bad_arguments_are_refused_before_any_model_loads(sources, tmp_path):
    pairs = [(str(sources["a"]), 1.0)]
    with pytest.raises(MergeError, match="method 'mean'"):
        merge_adapters(pairs, tmp_path / "x", method="mean")
    with pytest.raises(MergeError, match="--density applies to ties"):
        merge_adapters(pairs, tmp_path / "x", method="linear", density=0.5)
    with pytest.raises(MergeError, match="--svd-rank applies"):
        merge_adapters(pairs, tmp_path / "x", svd_rank=4)
    with pytest.raises(MergeError, match=r"--density must be in \(0, 1\]"):
        merge_adapters(pairs, tmp_path / "x", method="ties", density=1.5)
    with pytest.raises(MergeError, match="needs adapter_config.json"):
        merge_adapters([(str(tmp_path), 1.0)], tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(MergeError, match="exists and is not empty"):
        merge_adapters(pairs, tmp_path / "full")
    for out in (sources["a"], sources["a"].parent):  # the output is a source, or holds one: never overwritten
        with pytest.raises(MergeError, match="would destroy the source"):
            merge_adapters(pairs, out, overwrite=True)
    assert (sources["a"] / "adapter_model.safetensors").is_file()
    with pytest.raises(MergeError, match="above the sources' summed rank 4"):
        merge_adapters(pairs, tmp_path / "x", method="svd", svd_rank=5)
    assert parse_source("a:b:0.25") == ("a:b", 0.25) and parse_source("v2") == ("v2", 1.0)
    for bad in ("x:nan", "x:abc", ":1"):
        with pytest.raises(MergeError):
            parse_source(bad)


def test_a_weight_that_overflows_float32_writes_nothing(tiny_llama, sources, tmp_path):
    with pytest.raises(MergeError, match="non-finite values .*nothing was written"):
        _merge(tiny_llama, [(str(sources["a"]), 1e308)], tmp_path / "inf")
    assert not (tmp_path / "inf").exists()


def test_a_config_peft_cannot_read_is_one_error_naming_the_sources(tiny_llama, sources, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(sources["a"], bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "r": "x"}))
    with pytest.raises(MergeError, match=r"PEFT could not load or combine the sources .*bad"):
        _merge(tiny_llama, [(str(bad), 1.0)], tmp_path / "o")


def test_the_command_line_refuses_in_one_line_with_exit_2(sources, tmp_path, capsys):
    assert main([f"{sources['a']}:0.5", f"{tmp_path}:0.5", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: merge: source") and "adapter_config.json" in err[0]


@pytest.mark.default_model
@pytest.mark.slow
def test_the_shipped_default_merged_alone_answers_as_itself(tmp_path):
    """On the real base: ``noulengine merge noul-smollm2-135m-v2:1`` loads by path and answers as v2
    (uncalibrated on both sides: the merged folder has no temperatures until calibrated)."""
    from noulengine.models.loading import SHIPPED_ADAPTER_SHA256

    if "noul-smollm2-135m-v2" not in SHIPPED_ADAPTER_SHA256:
        pytest.skip("v2 is not shipped")
    out = tmp_path / "v2-alone"
    assert main(["noul-smollm2-135m-v2:1", "--output", str(out)]) == 0
    request = {"state": {"ticket": "I returned the shoes last week, please send my money back."}, "questions": {
        "route": {"type": "choice", "instructions": "Which team handles this?", "criteria": {
            "billing": "Payments and refunds", "shipping": "Delivery problems", "tech": "Website or app errors"}},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}}
    merged = Engine.from_pretrained(str(out), calibration="none").decide(request)
    v2 = Engine.from_pretrained("noul-smollm2-135m-v2", calibration="none").decide(request)
    for field, answer in v2.answers.items():
        for label, p in answer.probabilities.items():
            assert abs(merged.answers[field].probabilities[label] - p) < 1e-4
