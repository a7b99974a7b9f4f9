"""The shipped decision models (noulengine/models/decision_models/): their pins, loading by name."""

from __future__ import annotations

import json

import pytest

from noulengine.models import loading
from noulengine.models.loading import (DECISION_MODELS_DIR, DEFAULT_ADAPTER_DIR, DEFAULT_DECISION_MODEL,
                                       SHIPPED_ADAPTER_SHA256, SHIPPED_FILE, ModelNotFoundError, read_shipped,
                                       sha256_file, shipped_model_dir)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "training.json", "calibration.json")


def test_every_shipped_model_is_whole_and_matches_its_pin():
    shipped = read_shipped(SHIPPED_FILE)
    assert shipped["default"] == DEFAULT_DECISION_MODEL and DEFAULT_ADAPTER_DIR == DECISION_MODELS_DIR / DEFAULT_DECISION_MODEL
    folders = sorted(p.name for p in DECISION_MODELS_DIR.iterdir() if p.is_dir())
    assert folders == sorted(shipped["models"])  # no unpinned folder, no pin without its folder
    for name, pin in SHIPPED_ADAPTER_SHA256.items():
        folder = DECISION_MODELS_DIR / name
        assert all((folder / f).is_file() for f in ADAPTER_FILES), name
        assert sha256_file(folder / "adapter_model.safetensors") == pin, name
        training = json.loads((folder / "training.json").read_text())
        assert training["name"] == name  # the name the engine reports is the name it is loaded by
        assert training["base_model"]["spec"] and len(training["base_model"]["sha256"]) == 64


def test_a_shipped_name_resolves_to_its_folder_and_never_shadows_a_path(tmp_path, monkeypatch):
    assert shipped_model_dir(DEFAULT_DECISION_MODEL) == DEFAULT_ADAPTER_DIR
    assert shipped_model_dir("noul-smollm2-135m-v0") is None and shipped_model_dir(None) is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_DECISION_MODEL).mkdir()  # a user's own folder of that name wins
    assert shipped_model_dir(DEFAULT_DECISION_MODEL) is None


def test_a_shipped_folder_with_another_adapter_is_refused_before_loading(monkeypatch):
    monkeypatch.setitem(loading.SHIPPED_ADAPTER_SHA256, DEFAULT_DECISION_MODEL, "0" * 64)
    for spec in (DEFAULT_DECISION_MODEL, str(DEFAULT_ADAPTER_DIR), None):
        with pytest.raises(ModelNotFoundError, match=f"not the pinned {'0' * 64} of {DEFAULT_DECISION_MODEL}"):
            loading.load_model(spec)


@pytest.mark.parametrize("text, rule", [
    ('{"default": "a", "models": {"b": {"adapter_sha256": "00"}}}', "default 'a' is not one of its models"),
    ('{"default": "a", "models": {"a": {}}}', "models: want"),
    ('[]', "models: want"),
])
def test_a_malformed_shipped_file_is_refused_naming_the_rule(tmp_path, text, rule):
    (tmp_path / "shipped.json").write_text(text)
    with pytest.raises(ValueError, match=rule):
        read_shipped(tmp_path / "shipped.json")


def test_a_shipped_folder_missing_its_adapter_is_refused_naming_the_file(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(DEFAULT_ADAPTER_DIR, tmp_path / DEFAULT_DECISION_MODEL)
    (tmp_path / DEFAULT_DECISION_MODEL / "adapter_model.safetensors").unlink()
    monkeypatch.setattr(loading, "DECISION_MODELS_DIR", tmp_path)
    with pytest.raises(ModelNotFoundError, match=f"adapter_model.safetensors: missing, and {DEFAULT_DECISION_MODEL} "
                                                 "is pinned"):
        loading.check_shipped_pin(tmp_path / DEFAULT_DECISION_MODEL)
