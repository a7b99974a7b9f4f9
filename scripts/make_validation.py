#!/usr/bin/env python
"""Build the validation-v1 calibration/selection sets from TRAIN-side data.

Two canonical JSONL files, each holding ``validation_role`` "calibration" and "selection" rows in
the exact record layout and question wording of the matching accuracy-v1 test suite:

* ``agnews.jsonl`` from ``shared/data/agnews_train/`` (8,833 distinct AG News train rows). The
  116 train indices that SOURCE.md lists as near-duplicate stories of test rows are dropped.
  Default: 400 calibration + 400 selection, stratified: 100 per topic per role.
* ``wildjailbreak.jsonl`` from ``shared/data/wildjailbreak_train/``: vanilla-benign prompts
  (label benign) and adversarial-harmful prompts (label harmful; the vanilla seed of each
  adversarial row is not used). Default: 300 calibration + 300 selection, 150 per label per role
  (balanced; the test split is 2,000 harmful / 210 benign, so report priors separately).

Sampling uses ``random.Random(seed)`` over pools sorted by source row index. Every row is checked
against the test suite's rows (exact text after collapsing whitespace and lower-casing), and no id
or text is shared between the two roles. Output goes to the git-ignored
``benchmarks/validation-v1/prepared/``; ``benchmarks/validation-v1/manifest.json`` pins the source
and output sha256.

Usage::

    python scripts/make_validation.py [--source DIR] [--out DIR] [--seed N] [--write-manifest | --check]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from noulengine.eval.suites import get_suite, resolve_data_dir  # noqa: E402
from noulengine.eval.suites.errors import PreparedFileChangedError, SourceFileChangedError  # noqa: E402
from noulengine.eval.suites.hashing import check_hash, count_lines, file_entry, short_id, write_jsonl  # noqa: E402
from noulengine.train.contamination import normalize_text  # noqa: E402

VERSION = "validation-v1"
DEFAULT_SEED = 20240601
VALIDATION_DIR = REPO / "benchmarks" / VERSION
DEFAULT_OUT = VALIDATION_DIR / "prepared"
MANIFEST = VALIDATION_DIR / "manifest.json"
ROLES = ("calibration", "selection")

AGNEWS_FILES = ("agnews_train/metarepicl_ag_news_train_5000.csv",
                "agnews_train/vicrudakov_agnews_train_4000_indexed.csv", "agnews_train/SOURCE.md")
WJB_FILES = ("wildjailbreak_train/train_vanilla_benign_1k.json",
             "wildjailbreak_train/train_harmful_lift_holdout_1k.json")
# Per role and per label.
DEFAULT_PER_LABEL = {"agnews": 100, "wildjailbreak": 150}
AGNEWS_FLOAT_LABELS = {"0.0": "world", "1.0": "sports", "2.0": "business", "3.0": "sci_tech"}
LICENCES = {
    "agnews": "AG corpus terms: \"provided by the academic community for research purposes ... and any other "
              "non-commercial activity\" (Hugging Face: \"unknown\"); the MetaRepICL copy's repository is MIT. "
              "Treat as research/non-commercial use.",
    "wildjailbreak": "ODC-BY (allenai/wildjailbreak dataset card), access gated behind the AI2 Responsible Use "
                     "Guidelines; calibration and evaluation use only.",
}


class OverlapError(ValueError):
    """A validation row shares text with a test row, or an id/text is shared between roles."""


# Text as compared for overlap (whitespace collapsed, lower-cased): the rule `noulengine train`
# applies against every evaluation suite too.
normalize = normalize_text


# -- AG News -----------------------------------------------------------------------------------

def agnews_near_duplicates(source_md: Path) -> set[int]:
    """The train indices SOURCE.md lists as near-duplicate stories of test rows (116)."""
    text = source_md.read_text(encoding="utf-8")
    found: set[int] = set()
    for block in re.findall(r"Train indices:\s*\n\s*([0-9, ]+)", text):
        found.update(int(x) for x in block.replace(" ", "").split(",") if x)
    if len(found) != 116:
        raise ValueError(f"expected 116 near-duplicate train indices in {source_md}, found {len(found)}")
    return found


def agnews_pool(source_dir: Path) -> dict[int, tuple[str, str]]:
    """``train_index -> (text, label)`` over both AG News train files (identical where they overlap)."""
    import numpy as np

    pool: dict[int, tuple[str, str]] = {}

    def add(idx: int, text: str, label: str) -> None:
        if idx in pool and pool[idx] != (text, label):
            raise ValueError(f"AG News train row {idx}: the two copies disagree")
        pool[idx] = (text, label)

    perm = np.random.RandomState(42).permutation(120000)[:5000]
    with (source_dir / AGNEWS_FILES[0]).open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        if next(reader) != ["text", "label"]:
            raise ValueError(f"{AGNEWS_FILES[0]}: unexpected header")
        rows = list(reader)
    if len(rows) != len(perm):
        raise ValueError(f"{AGNEWS_FILES[0]}: expected {len(perm)} rows, got {len(rows)}")
    for j, (text, label) in enumerate(rows):
        add(int(perm[j]), text, AGNEWS_FLOAT_LABELS[label])
    with (source_dir / AGNEWS_FILES[1]).open(encoding="utf-8", newline="") as fh:
        for idx, text, label in csv.reader(fh):
            add(int(idx), text, label)
    return pool


def build_agnews(source_dir: Path, seed: int, per_label: int, test_texts: set[str]) -> tuple[list[dict], dict]:
    """AG News validation records (calibration first, then selection) and build stats."""
    module = get_suite("agnews").module
    pool = agnews_pool(source_dir)
    dropped = agnews_near_duplicates(source_dir / AGNEWS_FILES[2]) & set(pool)
    rng = random.Random(seed)
    chosen: dict[str, list[int]] = {r: [] for r in ROLES}
    for label in module.CRITERIA:
        candidates = sorted(i for i, (t, lab) in pool.items()
                            if lab == label and i not in dropped and normalize(t) not in test_texts)
        picked = rng.sample(candidates, 2 * per_label)
        chosen["calibration"] += picked[:per_label]
        chosen["selection"] += picked[per_label:]
    records = []
    for role in ROLES:
        for idx in sorted(chosen[role]):
            text, label = pool[idx]
            rec = module.make_record(short_id(f"agnews_train:{idx}"), text, label)
            rec["validation_role"] = role
            rec["source_row"] = idx
            records.append(rec)
    return records, {"pool_rows": len(pool), "dropped_near_duplicates": len(dropped)}


# -- WildJailbreak -----------------------------------------------------------------------------

def wildjailbreak_pool(source_dir: Path) -> dict[str, list[tuple[int, str]]]:
    """``label -> [(train row index, prompt)]``: vanilla benign, and adversarial harmful."""
    benign = json.loads((source_dir / WJB_FILES[0]).read_text(encoding="utf-8"))
    harmful = json.loads((source_dir / WJB_FILES[1]).read_text(encoding="utf-8"))
    pool = {"harmful": [], "benign": []}
    for rec in benign:
        if rec["source_type"] == "vanilla_benign":
            pool["benign"].append((int(rec["wildjailbreak_row_index"]), rec["instruction"]))
    for rec in harmful:
        if rec["source_type"] == "adversarial_harmful":
            pool["harmful"].append((int(rec["wildjailbreak_row_index"]), rec["instruction"]))
    return pool


def build_wildjailbreak(source_dir: Path, seed: int, per_label: int, test_texts: set[str]) -> tuple[list[dict], dict]:
    """WildJailbreak validation records (calibration first, then selection) and build stats."""
    module = get_suite("wildjailbreak").module
    pool = wildjailbreak_pool(source_dir)
    rng = random.Random(seed)
    chosen: dict[str, list[tuple[int, str, str]]] = {r: [] for r in ROLES}
    for label in module.CRITERIA:
        seen: set[str] = set()
        candidates = []
        for idx, prompt in sorted(pool[label]):
            key = normalize(prompt)
            if key in test_texts or key in seen:
                continue
            seen.add(key)
            candidates.append((idx, prompt, label))
        picked = rng.sample(candidates, 2 * per_label)
        chosen["calibration"] += picked[:per_label]
        chosen["selection"] += picked[per_label:]
    records = []
    for role in ROLES:
        for idx, prompt, label in sorted(chosen[role], key=lambda r: (r[0], r[2])):
            rec = module.make_record(short_id(f"wildjailbreak_train:{label}:{idx}"), prompt, label)
            rec["validation_role"] = role
            rec["source_row"] = idx
            records.append(rec)
    return records, {"pool_rows": sum(len(v) for v in pool.values())}


# -- checks, build, manifest -------------------------------------------------------------------

def test_texts(name: str, source_dir: Path) -> set[str]:
    """Normalized texts of every row of the matching test suite, read from its raw source."""
    module = get_suite(name).module
    if name == "agnews":
        return {normalize(text) for text, _ in module.read_test_rows(source_dir)}
    return {normalize(prompt) for _, prompt, _ in module.read_eval_rows(source_dir)}


def record_text(rec: dict) -> str:
    """The evidence text of a validation record (AG News ``text``, WildJailbreak ``prompt``)."""
    state = rec["state"]
    return state.get("text", state.get("prompt", ""))


def check_records(records: list[dict], test: set[str]) -> dict:
    """Overlap checks; returns counts.

    Raises:
        OverlapError: a row's text is in the test set, or an id or text occurs in both roles
            (or twice).
    """
    ids, texts = {}, {}
    for rec in records:
        text = normalize(record_text(rec))
        if text in test:
            raise OverlapError(f"validation row {rec['id']} repeats a test row's text")
        for key, seen in ((rec["id"], ids), (text, texts)):
            if key in seen:
                raise OverlapError(f"validation row {rec['id']}: id or text already used "
                                   f"(role {seen[key]} and {rec['validation_role']})")
            seen[key] = rec["validation_role"]
    counts: dict[str, dict[str, int]] = {}
    for rec in records:
        by_label = counts.setdefault(rec["validation_role"], {})
        label = rec["targets"]["decision"]["label"]
        by_label[label] = by_label.get(label, 0) + 1
    return {role: dict(sorted(c.items())) for role, c in counts.items()}


BUILDERS = {"agnews": (build_agnews, AGNEWS_FILES), "wildjailbreak": (build_wildjailbreak, WJB_FILES)}


def build(source_dir: str | Path | None = None, out_dir: str | Path = DEFAULT_OUT, seed: int = DEFAULT_SEED,
          per_label: dict[str, int] | None = None) -> dict:
    """Build every validation file under ``out_dir``; returns the manifest content.

    Raises:
        FileNotFoundError: no raw data root was found.
        OverlapError: a check failed (nothing is written for that set).
    """
    data = resolve_data_dir(source_dir)
    if data is None:
        raise FileNotFoundError("no raw data root found (set NOULENGINE_DATA or pass --source)")
    per_label = {**DEFAULT_PER_LABEL, **(per_label or {})}
    out_dir = Path(out_dir)
    manifest = {"version": VERSION, "seed": seed, "protocol_version": 1,
                "overlap_rule": "exact text after collapsing whitespace and lower-casing, against every test-suite row",
                "sets": {}}
    for name, (builder, files) in BUILDERS.items():
        test = test_texts(name, data)
        records, stats = builder(data, seed, per_label[name], test)
        counts = check_records(records, test)
        path = write_jsonl(out_dir / f"{name}.jsonl", records)
        entry = file_entry(path, path.name)
        entry["rows"] = count_lines(path)
        manifest["sets"][name] = {
            "test_suite": name, "licence": LICENCES[name], "per_label_per_role": per_label[name],
            "source_files": [file_entry(data / rel, rel) for rel in files],
            "prepared_files": [entry], "label_distribution": counts, "test_overlap": 0, **stats}
    return manifest


def verify(out_dir: str | Path = DEFAULT_OUT, manifest_path: str | Path = MANIFEST,
           source_dir: str | Path | None = None) -> None:
    """Re-hash the built files (and, when found, the sources) against the committed manifest.

    Raises:
        PreparedFileChangedError / SourceFileChangedError: naming the file, expected and actual sha256.
    """
    manifest = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
    data = resolve_data_dir(source_dir)
    for entry in manifest["sets"].values():
        for f in entry["prepared_files"]:
            check_hash(Path(out_dir) / f["path"], f["sha256"], PreparedFileChangedError)
        if data is not None:
            for f in entry["source_files"]:
                check_hash(data / f["path"], f["sha256"], SourceFileChangedError)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", help="raw data root (default: $NOULENGINE_DATA, else <repo>/../shared/data)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: the git-ignored prepared/)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write-manifest", action="store_true", help="rewrite benchmarks/validation-v1/manifest.json")
    mode.add_argument("--check", action="store_true", help="fail unless the build matches the committed manifest")
    args = ap.parse_args(argv)
    manifest = build(args.source, args.out, args.seed)
    if args.write_manifest:
        MANIFEST.parent.mkdir(parents=True, exist_ok=True)
        MANIFEST.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    elif args.check:
        verify(args.out, MANIFEST, args.source)
    for name, entry in manifest["sets"].items():
        f = entry["prepared_files"][0]
        print(f"{name}: {f['rows']} rows sha256 {f['sha256']} {entry['label_distribution']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
