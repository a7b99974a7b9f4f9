"""Benchmark suites: reproduction of published hashes, pinned manifests, refusal of changed files,
determinism, the registry, the jevbench adapter and the known-distribution pilot contract."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from noulengine.eval.suites import (PreparedFileChangedError, SourceFileChangedError, Suite, SuiteUnavailableError,
                                    UnknownSuiteError, canonical_from_jevbench, default_tasks, expand_tasks,
                                    get_suite, limit_rows, list_suites, parse_jevbench, resolve_data_dir,
                                    sample_rows, sha256_file)
from noulengine.eval.suites.refresh import computed_fields
from noulengine.records.schema import canonical_json, parse_record

DATA = resolve_data_dir()
needs_data = pytest.mark.skipif(DATA is None, reason="shared data not found: set NOULENGINE_DATA or place it at "
                                                     "<repo>/../shared/data")
ALL = ["agnews", "jevbench_easy", "jevbench_hard", "jevbench_original", "known-distribution-pilot", "procedural",
       "shapes", "toolace", "typed_decisions", "wildjailbreak", "zh-decision-bench"]
JEVALKIT = ["decisionbench", "jevalt-bench", "procedural-typed-decisions", "decision-index",
            "visual-decision-bench"]  # local copies of public releases (jevalkit-v1)
ALL = sorted(ALL + JEVALKIT)
NOT_ACCURACY_V1 = ("known-distribution-pilot", "procedural", "shapes", "zh-decision-bench", *JEVALKIT)  # own collections


def _require_sources(suite: Suite) -> None:
    missing = [rel for rel in suite.source_files if not (DATA / rel).is_file()]
    if missing:
        pytest.skip(f"suite {suite.name}: source data absent ({', '.join(missing)})")


def _copy(suite: Suite, tmp_path: Path) -> Suite:
    """The suite's prepare.py + manifest in a temp folder, so tests never touch the repo's prepared/."""
    dst = tmp_path / suite.directory.name
    shutil.copytree(suite.directory, dst, ignore=shutil.ignore_patterns("prepared", "__pycache__"))
    return Suite(dst)


# -- published hashes --------------------------------------------------------------------------

@needs_data
def test_agnews_reproduces_published_hash(tmp_path):
    suite = get_suite("agnews")
    _require_sources(suite)
    out = suite.module.prepare(DATA, tmp_path)
    assert sha256_file(out) == "4ff1cad1531f29cbfce572e3ddb73666626fd19663691ea3cb4093f46e1edd08"
    assert suite.manifest["published_sha256"] == suite.manifest["prepared_files"][0]["sha256"]
    assert suite.manifest["differs_from_published"] is False


@needs_data
def test_wildjailbreak_reproduces_local_ids_file(tmp_path):
    suite = get_suite("wildjailbreak")
    _require_sources(suite)
    out = suite.module.prepare(DATA, tmp_path)
    assert sha256_file(out) == "bb54a70a606b2c7f22b1aee5aeac546c1f16d67c8fc910f1a1b876f7e031fe74"
    local = DATA / "wildjailbreak" / "test.local_ids.jsonl"
    if local.is_file():
        assert out.read_bytes() == local.read_bytes()
    m = suite.manifest
    assert m["differs_from_published"] is True and m["published_sha256"] != m["sha256"]


def test_typed_decisions_manifest_flags_published_difference():
    m = get_suite("typed_decisions").manifest
    assert m["differs_from_published"] is True
    assert m["published_sha256"] == "fa43c0389d9dbdf18cf1afe75c73f320d7620f3bb2a8be19e7cca7df5e78588f"
    assert m["sha256"] == "ebe5f277639e54010243b8d8300609131dd07cb620280c6f91b6498c9a656cdd"
    assert any("differs from the published" in n for n in get_suite("typed_decisions").report_notes())
    assert m["counts"]["rows"] == 400 and m["counts"]["decisions"] == 2000


def test_toolace_manifest_records_duplicates():
    m = get_suite("toolace").manifest
    assert m["counts"]["rows"] == 310 and m["counts"]["duplicate_ids"] == 3
    assert m["differs_from_published"] is False


# -- manifests ---------------------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("name", ALL)
def test_every_manifest_verifies(name, tmp_path):
    suite = _copy(get_suite(name), tmp_path)
    _require_sources(suite)
    path = suite.prepare(DATA)
    assert suite.verify() == path
    assert suite.available(DATA).state == "ready"
    m = suite.manifest
    for key in ("name", "suite_version", "protocol_version", "licence", "origin", "source_files",
                "prepared_files", "counts"):
        if key == "source_files" and not suite.source_files:  # a procedural suite reads no data
            assert m.get(key) == [], f"{name}: a procedural suite pins no source files"
            continue
        assert m.get(key), f"{name}: manifest lacks {key}"
    fresh = computed_fields(suite, DATA)
    assert fresh["counts"] == m["counts"]
    assert fresh["source_files"] == m["source_files"]
    assert fresh["prepared_files"] == m["prepared_files"]
    if "published_sha256" in m:
        assert m["differs_from_published"] == (m["published_sha256"] != m["prepared_files"][0]["sha256"])


def test_collection_manifest_lists_defaults():
    top = json.loads((get_suite("agnews").directory.parent / "manifest.json").read_text())
    assert top["suite_version"] == "accuracy-v1"
    assert default_tasks() == top["suites"]
    assert default_tasks() == ["agnews", "wildjailbreak", "typed_decisions", "toolace",
                               "jevbench_easy", "jevbench_original", "jevbench_hard"]
    assert "known-distribution-pilot" not in default_tasks()


# -- refusal of changed files and unavailable data ---------------------------------------------

@needs_data
def test_modified_prepared_file_is_refused(tmp_path):
    suite = _copy(get_suite("jevbench_easy"), tmp_path)
    _require_sources(suite)
    path = suite.prepare(DATA)
    expected = sha256_file(path)
    path.write_bytes(path.read_bytes().replace(b"package", b"parcel", 1))
    with pytest.raises(PreparedFileChangedError) as info:
        suite.verify()
    err = info.value
    assert err.path == path and err.expected == expected and err.actual == sha256_file(path)
    assert str(path) in str(err) and expected in str(err) and err.actual in str(err)
    with pytest.raises(PreparedFileChangedError):
        suite.load()
    with pytest.raises(PreparedFileChangedError):
        suite.prepare(DATA)  # without force an existing changed file is refused, not rebuilt
    assert suite.available(DATA).state == "changed" and not suite.available(DATA)
    suite.prepare(DATA, force=True)
    assert suite.verify() == path


@needs_data
def test_changed_source_file_is_refused(tmp_path):
    suite = _copy(get_suite("toolace"), tmp_path / "suite")
    _require_sources(suite)
    src = tmp_path / "data" / "toolace" / "test.jsonl"
    src.parent.mkdir(parents=True)
    src.write_bytes((DATA / "toolace" / "test.jsonl").read_bytes() + b"\n")
    with pytest.raises(SourceFileChangedError) as info:
        suite.prepare(tmp_path / "data")
    assert info.value.path == src


def test_missing_data_is_unavailable_not_zero(tmp_path):
    suite = _copy(get_suite("agnews"), tmp_path / "suite")
    empty = tmp_path / "empty"
    empty.mkdir()
    status = suite.available(empty)
    assert status.state == "unavailable" and status.available is False and not status
    assert "agnews/test.csv" in status.reason
    with pytest.raises(SuiteUnavailableError):
        suite.load(source=empty)
    with pytest.raises(SuiteUnavailableError):
        suite.verify()


def test_data_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("NOULENGINE_DATA", str(tmp_path))
    assert resolve_data_dir() == tmp_path
    other = tmp_path / "x"
    other.mkdir()
    assert resolve_data_dir(other) == other  # an explicit --source wins
    assert resolve_data_dir(tmp_path / "missing") is None  # and is never silently replaced


def test_a_missing_noulengine_data_is_never_replaced_by_shared_data(tmp_path, monkeypatch, capsys):
    """Issue #46 item 4: NOULENGINE_DATA naming no folder was silently replaced by ../shared/data."""
    from noulengine.eval.__main__ import main as eval_main
    from noulengine.eval.score import main as score_main
    from noulengine.eval.suites.paths import explicit_data_error

    missing = tmp_path / "no-such-data"
    monkeypatch.setenv("NOULENGINE_DATA", str(missing))
    assert resolve_data_dir() is None
    assert f"NOULENGINE_DATA={missing}" in explicit_data_error(None)
    assert explicit_data_error(tmp_path) is None  # an existing --source is used as given
    assert eval_main(["--suite", "agnews", "--limit", "1", "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: NOULENGINE_DATA={missing}: the folder") and "does not exist" in err[0]
    assert not (tmp_path / "run").exists()  # refused before the model loads or a folder is made
    assert score_main(["--suite", "agnews", "--predictions", str(tmp_path / "p.jsonl")]) == 2
    assert "NOULENGINE_DATA=" in capsys.readouterr().err
    monkeypatch.delenv("NOULENGINE_DATA")
    assert explicit_data_error(None) is None


# -- determinism -------------------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("name", ALL)
def test_preparation_is_deterministic(name, tmp_path):
    suite = get_suite(name)
    _require_sources(suite)
    a = suite.module.prepare(DATA, tmp_path / "a")
    b = suite.module.prepare(DATA, tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()


# -- registry ----------------------------------------------------------------------------------

def test_registry_lists_and_suggests():
    assert list_suites() == ALL
    assert list_suites("accuracy-v1") == [n for n in ALL if n not in NOT_ACCURACY_V1]
    assert list_suites("vision-v1") == ["shapes"]
    assert list_suites("procedural-v1") == default_tasks("procedural-v1") == ["procedural"]
    with pytest.raises(UnknownSuiteError) as info:
        get_suite("agnew")
    assert "did you mean 'agnews'" in str(info.value)
    with pytest.raises(UnknownSuiteError) as info:
        get_suite("known_distribution_pilot")
    assert "known-distribution-pilot" in str(info.value)
    with pytest.raises(LookupError):
        expand_tasks(["wildjailbrake"])
    assert expand_tasks(["jevbench", "agnews"]) == ["jevbench_easy", "jevbench_original", "jevbench_hard", "agnews"]
    s = get_suite("agnews")
    assert s.name == "agnews" and s.version == "accuracy-v1" and s.manifest["name"] == "agnews"


@needs_data
def test_load_returns_row_index_and_records(tmp_path):
    suite = _copy(get_suite("toolace"), tmp_path)
    _require_sources(suite)
    rows = suite.load(source=DATA)
    assert [i for i, _ in rows] == list(range(310))
    ids = [r.id for _, r in rows]
    assert ids.count("a570fc8eef4c9147f44d5fd2") == 2
    assert all(r.targets["decision"].label in r.request.questions[0].labels for _, r in rows)


# -- sampling ----------------------------------------------------------------------------------

def test_sample_rows_is_seeded_and_sorted():
    rows = [(i, f"r{i}") for i in range(100)][::-1]
    a = sample_rows(rows, 10, seed=3)
    assert a == sample_rows(rows, 10, seed=3)
    assert a == sample_rows(list(reversed(rows)), 10, seed=3)  # independent of input order
    assert a != sample_rows(rows, 10, seed=4)
    assert [i for i, _ in a] == sorted(i for i, _ in a) and len(a) == 10
    assert sample_rows(rows, None, seed=0) == sorted(rows)
    assert sample_rows(rows, 500, seed=0) == sorted(rows)
    assert limit_rows(rows, 3) == [(0, "r0"), (1, "r1"), (2, "r2")]
    with pytest.raises(ValueError):
        sample_rows(rows, -1, seed=0)


# -- jevbench adapter --------------------------------------------------------------------------

ITEM = {"expected": 2, "family": "ordinal", "group": "g1", "id": "x-1", "labels": ["0", "1", "2", "3"],
        "question": {"criteria": ["none", "low", "mid", "high"], "instructions": "How bad?", "type": "score"},
        "split": "public", "state": "The pump leaks.", "gold_probs": {"0": 0.05, "1": 0.15, "2": 0.6, "3": 0.2}}


def test_jevbench_adapter_builds_canonical_record():
    rec = parse_jevbench(ITEM, tier="original")
    assert rec.request.state == "The pump leaks."
    assert [q.field for q in rec.request.questions] == ["decision"]
    assert rec.targets["decision"].label == "2"
    assert rec.targets["decision"].probabilities == {"0": 0.05, "1": 0.15, "2": 0.6, "3": 0.2}
    assert rec.category == "ordinal" and rec.metadata["tier"] == "original"
    seen = canonical_json({"state": rec.request.state, "questions": [q.spec() for q in rec.request.questions]})
    assert "gold_probs" not in seen and "0.6" not in seen and "0.15" not in seen
    raw = canonical_from_jevbench(ITEM)
    assert "gold_probs" not in json.dumps(raw["state"]) + json.dumps(raw["questions"])


def test_jevbench_choice_order_follows_labels():
    item = {"expected": "b", "family": "f", "id": "c", "labels": ["c", "a", "b"],
            "question": {"criteria": {"a": "A", "b": "B", "c": "C"}, "instructions": "Pick", "type": "choice"},
            "state": "s"}
    rec = parse_jevbench(item)
    assert rec.request.questions[0].labels == ("c", "a", "b")
    noul = {"expected": "yes", "family": "f", "id": "n", "labels": ["no", "yes"],
            "question": {"criteria": {"false": "No", "true": "Yes"}, "instructions": "Is it?", "type": "noul"},
            "state": "s"}
    assert parse_jevbench(noul).targets["decision"].label == "yes"


@needs_data
@pytest.mark.parametrize("tier", ["easy", "original", "hard"])
def test_jevbench_tiers_load_and_validate(tier, tmp_path):
    suite = _copy(get_suite(f"jevbench_{tier}"), tmp_path)
    _require_sources(suite)
    rows = suite.load(source=DATA)
    assert len(rows) == {"easy": 48, "original": 72, "hard": 111}[tier]
    raw = [json.loads(line) for line in suite.prepared_path.read_text().splitlines()]
    for (i, rec), item in zip(rows, raw):
        again = parse_record(canonical_from_jevbench(item))
        assert again.request == rec.request
        assert list(rec.request.questions[0].labels) == [str(x) for x in item["labels"]]
        assert rec.targets["decision"].label == str(item["expected"])
        assert rec.category == item["family"]
        assert "gold_probs" not in canonical_json(rec.request.state) + canonical_json(
            [q.spec() for q in rec.request.questions])
    if tier == "hard":
        assert all(r.targets["decision"].probabilities is None for _, r in rows)
    tvd = suite.metric_availability()["tvd"]
    assert tvd.startswith("unavailable")  # no gold_probs in these copies: TVD unavailable, never zero


# -- known-distribution pilot ------------------------------------------------------------------

@needs_data
def test_pilot_references_are_targets_only(tmp_path):
    suite = _copy(get_suite("known-distribution-pilot"), tmp_path)
    _require_sources(suite)
    rows = suite.load(source=DATA)
    inputs = [json.loads(line) for line in (DATA / "known_distribution_pilot" / "inputs.jsonl").read_text().splitlines()]
    refs = [json.loads(line) for line in (DATA / "known_distribution_pilot" / "references.jsonl").read_text().splitlines()]
    assert len(rows) == len(inputs) == len(refs) == 96
    for (i, rec), inp, ref in zip(rows, inputs, refs):
        assert rec.id == inp["id"] and rec.request.state == inp["state"]
        q = rec.request.questions[0]
        assert q.instructions == inp["questions"]["decision"]["instructions"]
        assert list(q.labels) == list(inp["questions"]["decision"]["criteria"])
        t = rec.targets["decision"]
        assert t.label is None  # no hard label from the reference argmax
        assert t.probabilities == pytest.approx(ref["gold_probs"])
        prompt = canonical_json(rec.request.state) + canonical_json([q.spec() for q in rec.request.questions])
        for leak in ("gold_probs", "gold_fractions", "derivation", ref["derivation"]):
            assert leak not in prompt
    assert suite.metric_availability()["accuracy"].startswith("unavailable")
    assert suite.metric_availability()["tvd"] == "available"
    assert "no licence" in suite.licence


def test_register_suite_outside_benchmarks(tmp_path):
    from noulengine.eval.suites import register_suite
    from noulengine.eval.suites import registry

    dst = _copy(get_suite("toolace"), tmp_path).directory
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["name"] = "my-toolace"
    (dst / "manifest.json").write_text(json.dumps(manifest))
    try:
        suite = register_suite(dst)
        assert get_suite("my-toolace") is suite and "my-toolace" in list_suites()
        assert "my-toolace" not in default_tasks()
    finally:
        registry._extra.pop("my-toolace", None)


# -- procedural-v1 -----------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _recipe_streams() -> tuple[tuple[int, int], ...]:
    """(seed, records) of the procedural streams scripts/train_default.py trains and selects on."""
    import re

    text = (REPO / "scripts" / "train_default.py").read_text()
    found = {name: re.search(pattern, text, re.M) for name, pattern in (
        ("seed", r"^SEED = (\d+)"), ("rows", r"^PROCEDURAL_ROWS = (\d+)"),
        ("selection", r"^SELECTION = \{[^}]*\"procedural\": (\d+)"),
        ("train_call", r"procedural\.generate\(PROCEDURAL_ROWS, seed=PROCEDURAL_SEED\)"),
        ("train_seed", r"^PROCEDURAL_SEED = SEED\b"),
        ("selection_call", r"procedural\.generate\(SELECTION\[\"procedural\"\], seed=SEED \+ 1\)"))}
    missing = [name for name, m in found.items() if m is None]
    assert not missing, (f"scripts/train_default.py no longer draws its procedural rows as procedural-v1 assumes "
                         f"({missing}): update TRAINING_STREAMS in benchmarks/procedural-v1/procedural/prepare.py "
                         "(a new suite version) so that the guard refuses no training row")
    seed = int(found["seed"].group(1))
    return (seed, int(found["rows"].group(1))), (seed + 1, int(found["selection"].group(1)))


@pytest.fixture(scope="module")
def procedural_suite(tmp_path_factory):
    suite = _copy(get_suite("procedural"), tmp_path_factory.mktemp("procedural"))
    suite.prepare()  # reads no data; checked against the pinned sha256
    return suite


def test_procedural_suite_is_held_out_from_the_recipe(procedural_suite):
    """The default recipe's procedural training and selection rows all pass the real guard."""
    from noulengine.curricula import procedural
    from noulengine.train.contamination import EvaluationIndex, index_suite

    module = procedural_suite.module
    assert module.TRAINING_STREAMS == _recipe_streams()
    assert module.SEED not in {seed for seed, _ in module.TRAINING_STREAMS}
    index = EvaluationIndex()
    index_suite(index, procedural_suite, procedural_suite.prepared_path)
    assert index.suites["procedural"] == {"rows": 1969, "path": str(procedural_suite.prepared_path),
                                          "leaf_strings": False}
    refused = [rec["id"] for seed, n in module.TRAINING_STREAMS for rec in procedural.generate(n, seed=seed)
               if index.overlap(rec["id"], rec["state"]) is not None]
    assert refused == []
    # the suite's own rows are refused, by id and by state
    rows = [json.loads(line) for line in procedural_suite.prepared_path.read_text().splitlines()]
    assert index.overlap(rows[0]["id"], {})[0] == "id"
    assert index.overlap("other-id", rows[0]["state"])[0] == "state"
    # by whole state only: a template sentence shared with the training worlds is not evidence
    bag = next(r for r in rows if r["task"] == "partial_observation_calibration" and "bag" in r["state"])
    assert index.overlap("other-id", {"note": bag["state"]["procedure"]}) is None
    _, stats = module.build()
    assert stats["excluded_training_state"] == 179 and stats["repeated_state"] == 52


def test_procedural_suite_records(procedural_suite):
    rows = procedural_suite.load()
    assert len(rows) == procedural_suite.manifest["counts"]["rows"] == 1969
    tasks, levels = Counter(), Counter()
    for _, rec in rows:
        tasks[rec.metadata["task"]] += 1
        levels[rec.metadata["level"]] += 1
        assert rec.category == f"procedural:{rec.metadata['task']}"
        for fld, t in rec.targets.items():
            if t.probabilities is not None:  # posteriors: exact probabilities, the argmax label unless 1/2
                p_yes = t.probabilities["yes"]
                assert t.label == (None if p_yes == 0.5 else "yes" if p_yes > 0.5 else "no")
            else:
                assert t.label is not None
    assert len(tasks) == 13 and min(tasks.values()) >= 48 and set(levels) == {0, 1, 2, 3, 4}
    assert procedural_suite.slices == ("level",)
    assert procedural_suite.metric_availability() == {"accuracy": "available", "tvd": "available"}
    assert list(procedural_suite.manifest["counts"]["slices"]["level"]) == ["0", "1", "2", "3", "4"]


def test_procedural_suite_is_scored_by_level_and_against_its_posteriors(procedural_suite, tmp_path):
    """Perfect answers (gold labels, exact posteriors) score 100% with TVD 0, sliced by level and
    task (category); report.md shows the level table."""
    from noulengine.eval.report import write_outputs
    from noulengine.eval.runner import TaskResult
    from noulengine.eval.score import score_file
    from noulengine.eval.suites import register_suite
    from noulengine.eval.suites import registry

    rows = procedural_suite.load()
    lines = []
    for i, rec in rows:
        answers = {}
        for q in rec.request.questions:
            t = rec.targets[q.field]
            probs = dict(t.probabilities) if t.probabilities else {lab: float(lab == t.label) for lab in q.labels}
            answers[q.field] = {"probabilities": probs}
        lines.append(json.dumps({"row": i, "answers": answers}))
    pred = tmp_path / "predictions.jsonl"
    pred.write_text("\n".join(lines) + "\n")
    register_suite(procedural_suite.directory)  # the temp copy stands in for the registered suite
    try:
        report = score_file("procedural", pred)
    finally:
        registry._extra.pop("procedural", None)
    assert report["accuracy"] == 1.0 and report["counts"]["decisions"] == 5029
    assert report["distribution"]["n"] == 48 and report["distribution"]["tvd"] == pytest.approx(0.0, abs=1e-9)
    levels = report["slices"]["level"]
    assert list(levels) == ["0", "1", "2", "3", "4"] and sum(v["counts"]["decisions"] for v in levels.values()) == 5029
    assert len(report["slices"]["category"]) == 13
    res = TaskResult(name="procedural", status="ready", rows=len(rows), metrics=report)
    write_outputs([res], tmp_path, {"suite": "procedural-v1", "git_revision": None, "selection": {}, "engine": {}})
    text = (tmp_path / "report.md").read_text()
    assert "| level | decisions | accuracy | NLL | ECE |" in text and "| procedural:table_lookup |" in text
    assert "| 4 | 1002 | 100.0% |" in text
