"""A suite manifest's computed fields (source and prepared hashes, counts), and refreshing them.

:func:`computed_fields` derives them from the source and prepared files; :func:`refresh_manifest`
re-prepares a suite and writes them back beside the hand-written fields
(:mod:`noulengine.eval.suites.manifest`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from noulengine.eval.suites.hashing import count_lines, file_entry
from noulengine.eval.suites.manifest import MANIFEST, write_manifest
from noulengine.eval.suites.suite import Suite


def record_counts(rows, slices=()) -> dict:
    """Counts over loaded ``(row_index, Record)`` rows: decisions, labels, types, categories, ids,
    and, per metadata key in ``slices`` (a suite manifest's ``"slices"``), rows and decisions by value."""
    labels: dict[str, Counter] = {}
    types: Counter = Counter()
    categories: Counter = Counter()
    ids: Counter = Counter()
    decisions = hard = probs = 0
    for _, rec in rows:
        ids[rec.id] += 1
        categories[rec.category or "none"] += 1
        for q in rec.request.questions:
            decisions += 1
            types[q.type] += 1
            t = rec.targets.get(q.field)
            if t is not None and t.label is not None:
                hard += 1
                labels.setdefault(q.field, Counter())[t.label] += 1
            if t is not None and t.probabilities is not None:
                probs += 1
    return {
        "rows": len(rows),
        "decisions": decisions,
        "distinct_ids": len(ids),
        "duplicate_ids": sum(1 for c in ids.values() if c > 1),
        "duplicate_rows": sum(c - 1 for c in ids.values() if c > 1),
        "hard_label_decisions": hard,
        "probability_target_decisions": probs,
        "question_types": dict(sorted(types.items())),
        "categories": dict(sorted(categories.items())),
        "label_distribution": {f: dict(sorted(c.items())) for f, c in sorted(labels.items())},
        **({"slices": {key: _slice_counts(rows, key) for key in slices}} if slices else {}),
    }


def _slice_counts(rows, key: str) -> dict:
    out: dict[str, dict] = {}
    for _, rec in rows:
        value = rec.metadata.get(key)
        entry = out.setdefault("<none>" if value is None else str(value), {"rows": 0, "decisions": 0})
        entry["rows"] += 1
        entry["decisions"] += len(rec.request.questions)
    return dict(sorted(out.items()))


def computed_fields(suite: Suite, data_dir: Path) -> dict:
    """The manifest fields derived from files: source/prepared hashes, counts, published flag."""
    sources = [file_entry(data_dir / rel, rel) for rel in suite.source_files]
    prepared = []
    for rel in suite.output_files:
        entry = file_entry(suite.prepared_dir / rel, rel)
        if rel.endswith(".jsonl"):
            entry["rows"] = count_lines(suite.prepared_dir / rel)
        prepared.append(entry)
    out = {"source_files": sources, "prepared_files": prepared,
           "counts": record_counts(suite.load(auto_prepare=False, verify=False), slices=suite.slices)}
    published = suite.manifest.get("published_sha256")
    if published:
        out["sha256"] = prepared[0]["sha256"]
        out["differs_from_published"] = prepared[0]["sha256"] != published
    return out


def refresh_manifest(suite: Suite, source: str | Path | None = None) -> dict:
    """Re-prepare ``suite`` from the raw data (ignoring pinned hashes) and rewrite its manifest."""
    data_dir = suite.source_dir(source)
    suite.prepare(source=data_dir, force=True, check_pins=False)
    manifest = dict(suite.manifest)
    manifest.update(computed_fields(suite, data_dir))
    write_manifest(suite.directory / MANIFEST, manifest)
    suite.manifest = manifest
    return manifest
