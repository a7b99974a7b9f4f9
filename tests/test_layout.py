"""Layering rules of the package, checked on the source (AST), imports inside functions included.

* No two modules import each other (issue #25: ``eval/runner`` <-> ``eval/shards``,
  ``eval/suites/manifest`` <-> ``eval/suites/suite``, ``records/images`` <-> ``records/schema``).
* The engine does not reach up into the layers built on it (calibration fitting, evaluation,
  training, serving, the CLI, the bench): it receives temperatures, it does not read files.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "noulengine"
ABOVE_ENGINE = ("noulengine.calibrate", "noulengine.eval", "noulengine.train", "noulengine.serve",
                "noulengine.cli", "noulengine.bench", "noulengine.distributed")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``noulengine`` module a file imports (absolute or relative), at any depth, except
    imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    type_only = {id(n) for block in ast.walk(tree)
                 if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                 for stmt in block.body for n in ast.walk(stmt)}  # annotations only, never executed
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("noulengine"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("noulengine"):
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


@functools.lru_cache(maxsize=1)
def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in files and m != name} for name, path in files.items()}


def test_the_scan_sees_the_package():
    graph = _graph()
    assert "noulengine.engine.engine" in graph and "noulengine.compile" in graph["noulengine.engine.engine"]


def test_no_two_modules_import_each_other():
    graph = _graph()
    pairs = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                    if a in graph.get(b, ()) and not (a.startswith(b + ".") or b.startswith(a + "."))})
    assert pairs == [], f"two-module import cycles: {pairs}"


@pytest.mark.parametrize("module", sorted(m for m in _graph() if m.startswith("noulengine.engine")))
def test_engine_does_not_import_the_layers_above_it(module):
    upward = sorted(m for m in _graph()[module] if m.startswith(ABOVE_ENGINE))
    assert upward == [], f"{module} imports {upward}"


def test_type_checking_imports_are_not_counted():
    src = PACKAGE / "eval" / "suites" / "families" / "__init__.py"
    assert "TYPE_CHECKING" in src.read_text(encoding="utf-8")
    assert "noulengine.eval.suites.suite" not in _imports(src)


@pytest.mark.parametrize("module", sorted(m for m in _graph() if m.startswith("noulengine.train")))
def test_the_training_loop_never_imports_a_curriculum(module):
    """Issue #46 item 11: ``noulengine/train/`` is the loop (trainer, loss, methods, checkpoint,
    numerics, config, selection, the training file's checks and overlap guard); the generators of
    training rows live in ``noulengine/curricula/``, which the loop never imports."""
    generators = sorted(m for m in _graph()[module] if m.startswith("noulengine.curricula"))
    assert generators == [], f"{module} imports {generators}"


def test_scripts_holds_what_a_user_or_ci_runs_and_experiments_the_rest():
    """scripts/: set-up, the default model's recipe and the chains that decide its next version
    (candidate chain, merge selection and merge chain, adoption verdict), doc examples, GPU check and recipe, conformance,
    validation files, load test. experiments/: each a table's source in docs/, its first docstring
    (or comment) line naming that section and the command that reproduces it."""
    repo = PACKAGE.parent
    def files(folder):  # files only: imports leave __pycache__/ behind
        return sorted(p for p in (repo / folder).iterdir() if p.is_file())

    assert [p.name for p in files("scripts")] == [
        "adoption_verdict.py", "candidate_chain.py", "ci_serve_conformance.sh", "doc_examples.py", "gpu_check.sh", "gpu_recipe.sh", "install_model_wheel.py",
        "load_test.py", "make_validation.py", "merge_chain.py", "merge_selection.py", "setup.sh", "setup_chromium.sh",
        "train_default.py"]
    for path in files("experiments"):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":
            first = ast.get_docstring(ast.parse(text)).splitlines()[0]
        else:
            first = text.splitlines()[1].lstrip("# ")
        assert first.startswith("Experiment behind docs/") and "reproduce: `" in first, path.name
        doc, _, anchor = first.split()[2].partition("#")
        assert (repo / doc).is_file() and anchor, path.name
