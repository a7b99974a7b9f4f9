"""The committed training checkpoints (training-checkpoints/): each one's hashes in the README are
the files' own, so a replaced checkpoint cannot keep an old pin, and what the checkpoint says it
was trained on is what the README's resume command rebuilds."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[1] / "training-checkpoints"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _section(run: Path) -> str:
    readme = (FOLDER / "README.md").read_text(encoding="utf-8")
    head = f"## `{run.name}/`"
    assert head in readme, f"README.md has no section {head}"
    return readme.split(head, 1)[1].split("\n## ", 1)[0]


def test_each_committed_checkpoint_is_pinned_by_its_readme_section():
    runs = sorted(p.parent for p in FOLDER.glob("*/checkpoint.json"))
    assert runs or list(FOLDER.glob("*/training.json")), "nothing committed: remove these tests with the folder"
    for run in runs:
        section = _section(run)
        pins = re.findall(r"`state\.pt` sha256 `([0-9a-f]{64})`", section)
        assert pins == [_sha256(run / "state.pt")], f"{run.name}: README pins {pins}"
        meta = json.loads((run / "checkpoint.json").read_text(encoding="utf-8"))
        assert meta["format"] == "noulengine-checkpoint" and 0 < meta["step"] < meta["total"]
        assert f"update {meta['step']:,} of {meta['total']:,}" in section
        data = re.findall(r"sha256 `([0-9a-f]{64})`", section.split("Data:", 1)[1].split("\n- ", 1)[0])
        assert data == [meta["data_sha256"]["train"]], f"{run.name}: the README's data sha256 is not the checkpoint's"


def test_each_committed_finished_model_is_pinned_and_is_not_also_a_checkpoint():
    """A finished run kept because a paused one starts from it (``--init-adapter``, which the
    trainer checks by content on ``--resume``) or because its evaluations are still to run."""
    for run in sorted(p.parent for p in FOLDER.glob("*/training.json")):
        assert not (run / "state.pt").exists(), f"{run.name}: a finished model and a checkpoint in one folder"
        section = _section(run)
        pins = re.findall(r"`adapter_model\.safetensors` sha256 `([0-9a-f]{64})`", section)
        assert pins == [_sha256(run / "adapter_model.safetensors")], f"{run.name}: README pins {pins}"
        meta = json.loads((run / "training.json").read_text(encoding="utf-8"))
        assert f"`{meta['name']}`" in section, f"{run.name}: the README does not name the run {meta['name']!r}"
