"""``scripts/doc_examples.py``: every example answer in README.md and docs/ is what the code answers now.

The marker and diff logic runs on a temporary docs tree (no model); the ``default_model`` test runs
``--check`` on the real docs with the real default model, so a model change that moves an
example's answer fails here until ``python scripts/doc_examples.py`` rewrites the blocks.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import doc_examples  # noqa: E402

CHEAP = [name for name, ex in doc_examples.EXAMPLES.items() if ex.cheap]


def _tree(tmp_path: Path, body: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n", encoding="utf-8")
    (tmp_path / "docs" / "calibration.md").write_text(
        f"before\n<!-- doc-example: calibration-default -->\n{body}<!-- /doc-example -->\nafter\n", encoding="utf-8")
    return tmp_path


def test_check_fails_on_a_stale_block_and_rewrite_makes_it_current(tmp_path):
    root = _tree(tmp_path, "| all | 700 | stale numbers |\n")
    out = io.StringIO()
    assert doc_examples.run(check=True, root=root, out=out) == 1
    assert "stale numbers" in out.getvalue() and "docs/calibration.md" in out.getvalue()
    assert "stale numbers" in (root / "docs" / "calibration.md").read_text()  # --check writes nothing
    assert doc_examples.run(check=False, root=root, out=io.StringIO()) == 0
    text = (root / "docs" / "calibration.md").read_text()
    assert "stale numbers" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert "| all | 700 |" in text
    assert doc_examples.run(check=True, root=root, out=io.StringIO()) == 0


def test_unknown_example_and_unclosed_marker_are_named(tmp_path):
    root = _tree(tmp_path, "")
    bad = "a\n<!-- doc-example: no-such -->\nb\n<!-- /doc-example -->\n"
    (root / "docs" / "x.md").write_text(bad, encoding="utf-8")
    with pytest.raises(doc_examples.DocExampleError, match=r"x.md:2: unknown doc example 'no-such'"):
        doc_examples.run(check=True, root=root)
    (root / "docs" / "x.md").write_text("<!-- doc-example: serve-curl -->\nnever closed\n", encoding="utf-8")
    with pytest.raises(doc_examples.DocExampleError, match="needs a '<!-- /doc-example -->'"):
        doc_examples.run(check=True, root=root)
    with pytest.raises(doc_examples.DocExampleError, match="unknown example"):
        doc_examples.run(check=True, only=["nope"], root=root)


def test_rounding_hides_float_noise_and_drops_timings():
    a = doc_examples.rounded({"p": 0.71004, "latency_s": 0.87, "xs": [0.2462237, 1e-9]})
    b = doc_examples.rounded({"p": 0.71001, "latency_s": 3.1, "xs": [0.2462241, 2e-9]})
    assert a == b == {"p": 0.71, "xs": [0.25, 0.0]}


@pytest.mark.default_model
def test_docs_examples_are_current(default_engine):
    out = io.StringIO()
    rc = doc_examples.run(check=True, only=CHEAP, engine=default_engine, out=out)
    assert rc == 0, "doc examples are stale; run `python scripts/doc_examples.py` and commit:\n" + out.getvalue()
