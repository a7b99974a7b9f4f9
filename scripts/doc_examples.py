"""Regenerate (or check) every example answer shown in the docs from the code that answers it.

A doc states an example's output between two markers::

    <!-- doc-example: NAME -->
    ...generated text: the example and what the code answers today...
    <!-- /doc-example -->

This script runs each example named in ``EXAMPLES`` (Python API calls on the real embedded default
model, the HTTP routes through FastAPI's ``TestClient`` around that same engine with the settings
``noulengine serve`` uses by default, the default model's shipped calibration file) and rewrites the
marked blocks in README.md and docs/*.md. With ``--check`` nothing is written: it exits 1 and prints
a diff for every block that differs from what the code answers now, so a model change cannot leave
the docs stale (``tests/test_doc_examples.py`` runs ``--check``).

Numbers are rounded (probabilities to 2 decimals) so float noise across machines, thread counts
and BLAS builds does not change a block; latencies are never shown.

Usage::

    .venv/bin/python scripts/doc_examples.py            # rewrite the blocks
    .venv/bin/python scripts/doc_examples.py --check    # exit 1 when a block is stale
    .venv/bin/python scripts/doc_examples.py --check --only calibration-default
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = ("README.md", "docs/*.md")
BLOCK_RE = re.compile(r"(<!-- doc-example: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /doc-example -->)", re.S)


class DocExampleError(Exception):
    """A marked block or an example that cannot be matched (unknown name, unclosed marker)."""


# --------------------------------------------------------------------------------------------
# the examples
# --------------------------------------------------------------------------------------------

# Shown verbatim in the README and executed verbatim here: what a reader copies is what ran.
PYTHON_EXAMPLE = '''\
from noulengine import Engine

engine = Engine.from_pretrained()   # the default decision model (base + trained LoRA adapter)
decision = engine.decide({"state": {"ticket": "My card was charged twice for order 4471."}, "questions": {
    "route": {"type": "choice", "instructions": "Which team handles this?", "criteria": {
        "billing": "Payments and refunds", "shipping": "Delivery problems", "tech": "Website or app errors"}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]},
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}})
for field, answer in decision.answers.items():
    print(field, answer.label, {k: round(p, 2) for k, p in answer.probabilities.items()})
'''

DECIDE_BODY = {
    "state": {"headline": "Stocks rally as the central bank holds rates"},
    "questions": {
        "topic": {"type": "choice", "instructions": "Which section?",
                  "criteria": {"world": "World news", "sports": "Sports", "business": "Business and markets",
                               "sci_tech": "Science and technology"}},
        "breaking": {"type": "noul", "instructions": "Is this breaking news?"},
    },
}
SYSTEMONE_BODY = {
    "model": "jev-latest",
    "state": {"ticket": "My card was charged twice for order 4471."},
    "questions": {
        "route": {"type": "choice", "instructions": "Which team handles this?",
                  "criteria": {"billing": "Payments and refunds", "shipping": "Delivery problems"}},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]},
    },
}
# timing and per-process fields: never in a doc block
VOLATILE_KEYS = frozenset({"latency_s", "created", "id", "x_latency_s", "x_queue_s", "x_batch_size"})


def rounded(obj, digits: int = 2):
    """``obj`` with every float rounded to ``digits`` decimals and volatile keys dropped (recursive)."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items() if k not in VOLATILE_KEYS}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    return obj


def compact_json(obj: dict) -> str:
    """``obj`` as JSON, one line per top-level key and per answer or question (short enough to read in a doc)."""
    lines = []
    for key, value in obj.items():
        if key in ("answers", "questions") and isinstance(value, dict):
            inner = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in value.items())
            lines.append(f' "{key}": {{\n{inner}}}')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(lines) + "}"


def _curl(route: str, body: dict | None) -> str:
    if body is None:
        return f"curl -s http://127.0.0.1:8000{route}"
    text = compact_json(body)
    return f"curl -s http://127.0.0.1:8000{route} -H 'Content-Type: application/json' -d '{text}'"


class Context:
    """Lazily loaded shared state: one default engine and one test client for every example."""

    def __init__(self, engine=None):
        self._engine = engine
        self._client = None
        self._stack = contextlib.ExitStack()

    @property
    def engine(self):
        """The embedded default :class:`~noulengine.Engine`, loaded on first use (the slow part)."""
        if self._engine is None:
            from noulengine import Engine

            self._engine = Engine.from_pretrained()
        return self._engine

    @property
    def client(self):
        """A ``TestClient`` around :attr:`engine`, configured as ``noulengine serve`` is by default."""
        if self._client is None:
            from fastapi.testclient import TestClient

            from noulengine.serve.__main__ import build_parser, config_from_args
            from noulengine.serve.app import create_app

            config = config_from_args(build_parser().parse_args([]), self.engine)
            self._client = self._stack.enter_context(TestClient(create_app(self.engine, config)))
        return self._client

    def post(self, route: str, body: dict) -> dict:
        """POST ``body`` to ``route``; the JSON answer, or :class:`DocExampleError` on a non-200 status."""
        resp = self.client.post(route, json=body)
        if resp.status_code != 200:
            raise DocExampleError(f"{route} answered {resp.status_code}: {resp.text}")
        return resp.json()

    def close(self) -> None:
        """Stop the test client's app (its batch worker thread)."""
        self._stack.close()


def example_python(ctx: Context) -> str:
    """The README's Python example: the code, executed, and what it printed."""
    out = io.StringIO()
    namespace: dict = {}
    from noulengine import Engine

    class _Shared:  # from_pretrained() returns the already loaded default engine (loading it is the slow part)
        @staticmethod
        def from_pretrained(*args, **kwargs):
            if args or kwargs:
                return Engine.from_pretrained(*args, **kwargs)
            return ctx.engine

    code = PYTHON_EXAMPLE.replace("from noulengine import Engine\n", "")
    namespace["Engine"] = _Shared
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md python example", "exec"), namespace)  # noqa: S102 - our own snippet
    return f"```python\n{PYTHON_EXAMPLE}```\n\nprints\n\n```text\n{out.getvalue()}```\n"


def example_serve_curl(ctx: Context) -> str:
    """docs/serving.md: the three curl commands and what the default model's server answers."""
    decide = rounded(ctx.post("/v1/decide", DECIDE_BODY))
    systemone = rounded(ctx.post("/v1/systemone", SYSTEMONE_BODY))
    limits = ctx.client.get("/v1/limits").json()
    parts = ["```bash", "# the engine's own format: every answer with probabilities, logprobs, x_mass, readout, "
             "temperature", _curl("/v1/decide", DECIDE_BODY),
             "# the Jev contract: \"model\" is the served name, jev-latest or noul",
             _curl("/v1/systemone", SYSTEMONE_BODY), _curl("/v1/limits", None), "```", "",
             "answer (floats rounded to 2 decimals, timing fields left out), `/v1/decide`:", "",
             "```json", compact_json(decide), "```", "", "`/v1/systemone`:", "",
             "```json", compact_json(systemone), "```", "", "`/v1/limits`:", "",
             "```json", json.dumps(limits, ensure_ascii=False), "```", ""]
    return "\n".join(parts)


def example_calibration_default(ctx: Context) -> str:
    """docs/calibration.md: the default model's shipped calibration file, as a table (no model run)."""
    from noulengine.models.loading import DEFAULT_ADAPTER_DIR

    cal = json.loads((DEFAULT_ADAPTER_DIR / "calibration.json").read_text(encoding="utf-8"))
    rows = ["| selection rows | n | NLL before → after | Brier before → after | ECE(15) before → after | "
            "accuracy (unchanged) |", "|---|---:|---|---|---|---:|"]
    for name, m in cal["metrics"]["selection"].items():
        b, a = m["before"], m["after"]
        rows.append(f"| {name} | {b['n']} | {b['nll']:.3f} → {a['nll']:.3f} | "
                    f"{b['brier']:.3f} → {a['brier']:.3f} | {b['ece']:.3f} → {a['ece']:.3f} | "
                    f"{100 * b['accuracy']:.1f}% |")
    temps = ", ".join(f"`{k}` {g['temperature']:.2f}" for k, g in cal["groups"].items() if g["source"] == k)
    files = ", ".join(Path(f).name for f in cal["validation_files"])
    return (f"Readout `{cal['readout']}`, debias `{cal['debias']}`, groups `{cal['group_by']}`; fitted on "
            f"{cal['rows']['calibration_decisions']} calibration decisions ({files}), scored on "
            f"{cal['rows']['selection_decisions']} selection decisions never fitted on; argmax changed: "
            f"{cal['argmax_changed']}.\n\n" + "\n".join(rows)
            + f"\n\nFitted temperatures (groups with their own fit; the others fall back to these): {temps}.\n")


@dataclass(frozen=True)
class Example:
    """One regenerable doc block: ``run(ctx)`` returns the block's text; ``cheap`` ones run in the tests."""

    run: Callable[[Context], str]
    cheap: bool


EXAMPLES: dict[str, Example] = {
    "python-decide": Example(example_python, cheap=True),
    "serve-curl": Example(example_serve_curl, cheap=True),
    "calibration-default": Example(example_calibration_default, cheap=True),
}


# --------------------------------------------------------------------------------------------
# the docs
# --------------------------------------------------------------------------------------------

def doc_paths(root: Path = ROOT) -> list[Path]:
    """README.md and docs/*.md under ``root``, sorted."""
    paths: list[Path] = []
    for pattern in DOC_FILES:
        paths.extend(sorted(root.glob(pattern)))
    return paths


def find_blocks(text: str, path: Path) -> list[re.Match]:
    """Every marked block in ``text``; raises :class:`DocExampleError` for an unknown name or unclosed marker."""
    blocks = list(BLOCK_RE.finditer(text))
    opened = text.count("<!-- doc-example: ")
    if opened != len(blocks) or text.count("<!-- /doc-example -->") != len(blocks):
        raise DocExampleError(f"{path}: {opened} opening doc-example markers, {len(blocks)} complete blocks: "
                              "every '<!-- doc-example: NAME -->' needs a '<!-- /doc-example -->' after it")
    for m in blocks:
        if m["name"] not in EXAMPLES:
            line = text[:m.start()].count("\n") + 1
            raise DocExampleError(f"{path}:{line}: unknown doc example {m['name']!r}; known: {', '.join(EXAMPLES)}")
    return blocks


def run(check: bool, only: list[str] | None = None, root: Path = ROOT, engine=None, out=sys.stdout) -> int:
    """Regenerate (``check=False``) or compare (``check=True``) the marked blocks.

    Args:
        check: compare only; nothing is written.
        only: example names to run (default: all that appear in the docs).
        root: the repository root holding README.md and docs/.
        engine: an already loaded default :class:`~noulengine.Engine` (tests pass theirs), else loaded once.

    Returns:
        0 when every block is current (or was rewritten), 1 when ``check`` found a stale block.

    Raises:
        DocExampleError: an unknown example name (in ``only`` or a doc) or a malformed marker.
    """
    unknown = sorted(set(only or ()) - set(EXAMPLES))
    if unknown:
        raise DocExampleError(f"unknown example(s) {unknown}; known: {', '.join(EXAMPLES)}")
    docs = {p: p.read_text(encoding="utf-8") for p in doc_paths(root)}
    used = {m["name"] for p, t in docs.items() for m in find_blocks(t, p)}
    wanted = [n for n in EXAMPLES if n in used and (only is None or n in only)]
    missing = sorted(set(only or ()) - used)
    if missing:
        raise DocExampleError(f"example(s) {missing} have no block in README.md or docs/*.md")
    ctx = Context(engine)
    try:
        generated = {name: EXAMPLES[name].run(ctx) for name in wanted}
    finally:
        ctx.close()
    stale = 0
    for path, text in docs.items():
        def replace(m: re.Match) -> str:
            return m.group(1) + generated[m["name"]] + m.group(4) if m["name"] in generated else m.group(0)

        new = BLOCK_RE.sub(replace, text)
        if new == text:
            continue
        rel = path.relative_to(root)
        if check:
            stale += 1
            out.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                f"{rel} (in the doc)", f"{rel} (what the code answers now)"))
        else:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {rel}", file=out)
    if stale:
        print(f"{stale} doc file(s) hold stale examples: run `python scripts/doc_examples.py` and commit", file=out)
        return 1
    print(f"{len(wanted)} example(s) current: {', '.join(wanted)}", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``[--check] [--only NAME[,NAME]]``; exit 0 current/rewritten, 1 stale, 2 bad marker or name."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a block differs")
    parser.add_argument("--only", help=f"comma-separated example names (of: {', '.join(EXAMPLES)})")
    args = parser.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    try:
        return run(args.check, only)
    except DocExampleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
