"""validation-v1 (scripts/make_validation.py): pinned, deterministic, disjoint from the test
suites and between roles, same layout and wording as the matching test suite."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from noulengine.eval.suites import PreparedFileChangedError, get_suite, resolve_data_dir
from noulengine.records.loader import load_records

REPO = Path(__file__).resolve().parents[1]
DATA = resolve_data_dir()
NEEDED = ("agnews/test.csv", "agnews/classes.txt", "agnews_train/SOURCE.md",
          "agnews_train/metarepicl_ag_news_train_5000.csv", "agnews_train/vicrudakov_agnews_train_4000_indexed.csv",
          "wildjailbreak/raw/wildjailbreak_eval.jsonl", "wildjailbreak/raw/wildjailbreak_adv_benign_eval.jsonl",
          "wildjailbreak_train/train_vanilla_benign_1k.json", "wildjailbreak_train/train_harmful_lift_holdout_1k.json")


def _load_script():
    spec = importlib.util.spec_from_file_location("make_validation", REPO / "scripts" / "make_validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if DATA is None:
        pytest.skip("shared data not found: set NOULENGINE_DATA or place it at <repo>/../shared/data")
    missing = [rel for rel in NEEDED if not (DATA / rel).is_file()]
    if missing:
        pytest.skip(f"validation source data absent: {', '.join(missing)}")
    mv = _load_script()
    out = tmp_path_factory.mktemp("validation")
    return mv, out, mv.build(DATA, out)


def test_build_matches_committed_manifest(built):
    mv, out, manifest = built
    committed = json.loads(mv.MANIFEST.read_text())
    assert manifest == committed
    mv.verify(out, mv.MANIFEST, DATA)


def test_changed_validation_file_is_refused(built, tmp_path):
    mv, out, manifest = built
    f = tmp_path / "agnews.jsonl"
    f.write_bytes((out / "agnews.jsonl").read_bytes().replace(b'"label":"world"', b'"label":"sports"', 1))
    (tmp_path / "wildjailbreak.jsonl").write_bytes((out / "wildjailbreak.jsonl").read_bytes())
    with pytest.raises(PreparedFileChangedError):
        mv.verify(tmp_path, mv.MANIFEST)


@pytest.mark.parametrize("name,sizes", [("agnews", (400, 400)), ("wildjailbreak", (300, 300))])
def test_roles_disjoint_and_no_test_overlap(built, name, sizes):
    mv, out, manifest = built
    result = load_records(out / f"{name}.jsonl")
    result.raise_if_errors()  # parses, and no duplicate id
    recs = result.records
    by_role = {r: [x for x in recs if x.validation_role == r] for r in ("calibration", "selection")}
    assert (len(by_role["calibration"]), len(by_role["selection"])) == sizes
    assert len(recs) == sum(sizes)
    ids = {r: {x.id for x in v} for r, v in by_role.items()}
    texts = {r: {mv.normalize(next(iter(x.request.state.values()))) for x in v} for r, v in by_role.items()}
    assert not ids["calibration"] & ids["selection"]
    assert not texts["calibration"] & texts["selection"]
    test = mv.test_texts(name, DATA)
    assert not (texts["calibration"] | texts["selection"]) & test
    # same question wording and layout as the test suite
    test_question = get_suite(name).module.question()
    raw = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
    test_keys = list(get_suite(name).module.make_record("x", "t", next(iter(test_question["criteria"]))))
    for obj in raw:
        assert obj["questions"] == {"decision": test_question}
        assert list(obj)[:len(test_keys)] == test_keys


def test_agnews_drops_listed_near_duplicates(built):
    mv, out, manifest = built
    listed = mv.agnews_near_duplicates(DATA / "agnews_train" / "SOURCE.md")
    rows = [json.loads(line)["source_row"] for line in (out / "agnews.jsonl").read_text().splitlines()]
    assert not set(rows) & listed
    assert manifest["sets"]["agnews"]["dropped_near_duplicates"] == 116


def test_overlap_check_detects_a_leak(built):
    mv, out, manifest = built
    rec = json.loads((out / "agnews.jsonl").read_text().splitlines()[0])
    with pytest.raises(mv.OverlapError):
        mv.check_records([rec], {mv.normalize(rec["state"]["text"].upper() + "  ")})
    other = dict(rec, validation_role="selection")
    with pytest.raises(mv.OverlapError):
        mv.check_records([rec, other], set())
