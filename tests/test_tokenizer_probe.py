"""A tokenizer that reads another protocol is refused (issue #13, item 2).

The case: the default model's tokenizer minus the BPE merge ``["y", "es"]``, so "yes" becomes the
two tokens 105, 266. Every readout that reads the word must refuse it with the ids, and loading
must refuse a tokenizer that does not reproduce the pinned probe.
"""

from __future__ import annotations

import json
import shutil

import pytest

from noulengine.compile import Compiler, CompilerConfig
from noulengine.models.embedded import GEMMA3_270M, SMOLLM2
from noulengine.models.loading import load_model
from noulengine.models.tokenizer_probe import PROBE_TEXT, check_probe, probe_ids
from noulengine.records import TokenizerError

WEIGHT_AND_CONFIG = ("config.json", "generation_config.json", "model.safetensors", "noulengine_conversion.json")


@pytest.fixture(scope="module")
def broken_dir(smollm2_dir, tmp_path_factory):
    """SmolLM2's directory (weights linked, not copied) with "yes" split in two."""
    out = tmp_path_factory.mktemp("no-yes-merge")
    for name in WEIGHT_AND_CONFIG:
        (out / name).symlink_to(smollm2_dir / name)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_dir / name).is_file():
            shutil.copy(smollm2_dir / name, out / name)
    tok = json.loads((smollm2_dir / "tokenizer.json").read_text(encoding="utf-8"))
    merges = tok["model"]["merges"]
    tok["model"]["merges"] = [m for m in merges if m not in (["y", "es"], "y es")]
    assert len(tok["model"]["merges"]) == len(merges) - 1
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def broken_tokenizer(broken_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(broken_dir), local_files_only=True)
    assert tok("yes", add_special_tokens=False)["input_ids"] == [105, 266]
    return tok


@pytest.mark.parametrize("readout", ["auto", "label-token", "symbols"])
def test_two_token_yes_is_refused_with_its_ids(broken_tokenizer, readout):
    with pytest.raises(TokenizerError) as err:
        Compiler(broken_tokenizer, CompilerConfig(readout=readout))
    message = str(err.value)
    assert "'yes'" in message and "[105, 266]" in message and readout in message
    assert str(broken_tokenizer.name_or_path) in message


def test_label_sequence_does_not_need_the_word(broken_tokenizer):
    Compiler(broken_tokenizer, CompilerConfig(readout="label-sequence"))  # reads label text, no single token


def test_smollm2_tokenizer_reproduces_its_pin(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)
    assert probe_ids(tok) == list(SMOLLM2.probe_ids)
    check_probe(tok, list(SMOLLM2.probe_ids))


def test_gemma_tokenizer_reproduces_its_pin(gemma_tokenizer):
    assert probe_ids(gemma_tokenizer) == list(GEMMA3_270M.probe_ids)


def test_probe_names_the_first_differing_position(broken_tokenizer):
    with pytest.raises(TokenizerError) as err:
        check_probe(broken_tokenizer, list(SMOLLM2.probe_ids), where="for the test")
    expected = list(SMOLLM2.probe_ids)
    got = probe_ids(broken_tokenizer)
    at = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
    assert f"position {at}" in str(err.value) and str(expected[at]) in str(err.value)
    assert "yes" in PROBE_TEXT


def test_loading_refuses_a_tokenizer_off_the_pin(broken_dir):
    """The directory carries the default base's conversion marker (so its sha256 is the pinned
    one) but a tokenizer that merges differently: loading stops before reading weights."""
    with pytest.raises(TokenizerError, match="probe pinned for SmolLM2-135M-Instruct"):
        load_model(str(broken_dir))


def test_training_json_probe_is_checked(broken_dir, tmp_path, smollm2_dir):
    """A trained model's recorded probe is checked on load, whatever its base."""
    from transformers import AutoTokenizer

    good = AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)
    model_dir = tmp_path / "trained"
    model_dir.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (model_dir / name).symlink_to(broken_dir / name)
    shutil.copy(broken_dir / "tokenizer.json", model_dir / "tokenizer.json")
    (model_dir / "training.json").write_text(json.dumps({"name": "t", "tokenizer_probe": {
        "text": PROBE_TEXT, "ids": probe_ids(good)}}), encoding="utf-8")
    with pytest.raises(TokenizerError, match="training.json"):
        load_model(str(model_dir))
