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


def test_each_committed_checkpoint_is_pinned_by_its_readme_section():
    readme = (FOLDER / "README.md").read_text(encoding="utf-8")
    runs = sorted(p.parent for p in FOLDER.glob("*/checkpoint.json"))
    assert runs, "no committed checkpoint: remove this test with the folder"
    for run in runs:
        head = f"## `{run.name}/`"
        assert head in readme, f"README.md has no section {head}"
        section = readme.split(head, 1)[1].split("\n## ", 1)[0]
        pins = re.findall(r"`state\.pt` sha256 `([0-9a-f]{64})`", section)
        assert pins == [_sha256(run / "state.pt")], f"{run.name}: README pins {pins}"
        meta = json.loads((run / "checkpoint.json").read_text(encoding="utf-8"))
        assert meta["format"] == "noulengine-checkpoint" and 0 < meta["step"] < meta["total"]
        assert f"update {meta['step']:,} of {meta['total']:,}" in section
        data = re.findall(r"sha256 `([0-9a-f]{64})`", section.split("Data:", 1)[1].split("\n- ", 1)[0])
        assert data == [meta["data_sha256"]["train"]], f"{run.name}: the README's data sha256 is not the checkpoint's"
