"""The default model's recipe scripts: ``scripts/train_default.py`` (its flags, the install guard)
and ``experiments/compare_bases.py`` (subset, evaluation reading, report), without training."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts"), str(REPO / "experiments")]

import compare_bases  # noqa: E402
import train_default  # noqa: E402


def test_train_args_keep_the_recipe_and_swap_only_model_and_name():
    assert train_default.train_args() == train_default.TRAIN_ARGS
    args = train_default.train_args("some/base.gguf", "candidate")
    assert args[-2:] == ["--model", "some/base.gguf"]
    assert args[args.index("--name") + 1] == "candidate"
    rest = list(train_default.TRAIN_ARGS)
    rest[rest.index("--name") + 1] = "candidate"
    assert args[:-2] == rest  # every other setting is the recipe's
    assert train_default.TRAIN_ARGS[train_default.TRAIN_ARGS.index("--name") + 1] == "noul-smollm2-135m-v2"
    # a continuation mix's LR replaces the recipe's: one --lr, never two with the last one winning
    cont = train_default.train_args(lr=train_default.CONTINUE["lr"])
    assert cont.count("--lr") == 1 and cont[cont.index("--lr") + 1] == train_default.CONTINUE["lr"]


def test_install_refuses_another_base(tmp_path, capsys):
    before = (REPO / "noulengine" / "models" / "decision_models" / "shipped.json").read_bytes()
    with pytest.raises(SystemExit) as exc:
        train_default.main(["--steps", "install", "--model", "x.gguf", "--work", str(tmp_path)])
    assert exc.value.code == 2
    assert "must be an embedded base" in capsys.readouterr().err
    assert (REPO / "noulengine" / "models" / "decision_models" / "shipped.json").read_bytes() == before


def test_install_is_only_run_when_named_and_unknown_steps_are_refused(tmp_path, capsys, monkeypatch):
    """Leaving out --steps never replaces the shipped default (an experiment's mix, base or work
    folder would otherwise be installed); a misspelt step is refused instead of running nothing."""
    ran = []
    monkeypatch.setattr(train_default, "build_data", lambda *a, **k: ran.append("data") or
                        {"train": {"sha256": "0" * 64}})
    monkeypatch.setattr(train_default, "run", lambda cmd, **k: ran.append(cmd[3]) or 0)  # python -m noulengine <step>
    monkeypatch.setattr(train_default, "learning_curve", lambda *a: None)
    monkeypatch.setattr(train_default, "compare_with", lambda *a, **k: [])
    before = (REPO / "noulengine" / "models" / "decision_models" / "shipped.json").read_bytes()
    train_default.main(["--work", str(tmp_path / "work"), "--source", str(tmp_path)])
    assert ran == ["data", "train", "calibrate"]
    assert (REPO / "noulengine" / "models" / "decision_models" / "shipped.json").read_bytes() == before
    with pytest.raises(SystemExit) as exc:
        train_default.main(["--steps", "data,instal", "--work", str(tmp_path / "work")])
    assert exc.value.code == 2 and "unknown step(s) 'instal'" in capsys.readouterr().err
    assert ran == ["data", "train", "calibrate"]  # refused before anything ran


def test_install_refuses_a_model_whose_base_is_a_path(tmp_path):
    """An adapter whose training.json names its base by a path would not load on another machine."""
    before = (REPO / "noulengine" / "models" / "decision_models" / "shipped.json").read_bytes()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "training.json").write_text(json.dumps({"base_model": {"spec": "/root/x.gguf"}}))
    with pytest.raises(SystemExit, match="names base '/root/x.gguf', not an embedded base"):
        train_default.main(["--steps", "install", "--model", "gemma-3-270m", "--work", str(tmp_path)])
    assert (REPO / "noulengine" / "models" / "decision_models" / "shipped.json").read_bytes() == before


def test_subset_is_fixed_by_its_seed(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(50)))
    monkeypatch.setattr(compare_bases, "DATA", data)
    a = compare_bases.make_subset(tmp_path / "a", 10, seed=3)
    b = compare_bases.make_subset(tmp_path / "b", 10, seed=3)
    c = compare_bases.make_subset(tmp_path / "c", 10, seed=4)
    assert a["sha256"] == b["sha256"] != c["sha256"]
    ids = [json.loads(x)["id"] for x in (tmp_path / "a" / "subset.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 10
    with pytest.raises(SystemExit, match="exceeds"):
        compare_bases.make_subset(tmp_path / "d", 51, seed=0)


def _training_json(name: str, accuracy: float, flip: float) -> dict:
    sel = {"decisions": 616, "accuracy": accuracy, "nll": 0.8, "brier": 0.4, "ece": 0.05, "x_mass_median": 0.96}
    return {"base_model": {"name": name}, "trainable_parameters": 1000, "steps": 112, "train_s": 1000.0,
            "examples_per_s": 0.75, "epochs": [{"epoch": 1, "selection": sel}],
            "final": {"permutation": {"decisions": 200, "accuracy": 0.9, "flip_rate": flip}}}


def test_report_reads_training_and_probe_metrics(tmp_path):
    for base, acc, flip in (("smollm2", 0.628, 0.243), ("gemma3", 0.644, 0.052)):
        (tmp_path / base).mkdir()
        (tmp_path / base / "training.json").write_text(json.dumps(_training_json(base.upper(), acc, flip)))
    metrics = {"procedural": {"metrics": {"counts": {"decisions": 519}, "accuracy": 0.514,
                                          "baselines": {"chance": 0.369, "majority": 0.497},
                                          "reversal_change_share": 0.247, "order_probe": {"items": 190}}},
               "skipped_suite": {"status": "missing", "metrics": {}}}
    (tmp_path / "eval-proc-gemma3").mkdir()
    (tmp_path / "eval-proc-gemma3" / "metrics.json").write_text(json.dumps(metrics))
    rows = compare_bases.report(tmp_path, ["smollm2", "gemma3"])
    assert rows["gemma3"]["flip_rate"] == 0.052 and rows["smollm2"]["eval"] == {}
    assert rows["gemma3"]["eval"]["procedural"]["reversal_change_share"] == 0.247
    text = (tmp_path / "comparison.md").read_text()
    assert "| GEMMA3 | 1,000 | 112 |" in text and "| 64.4% |" in text and "| 0.052 |" in text
    assert "| procedural | 519 | 36.9% | 49.7% | - | 51.4% / 0.247 |" in text
    assert json.loads((tmp_path / "comparison.json").read_text())["smollm2"]["flip_rate"] == 0.243


def test_continuation_mix_needs_its_adapter_and_only_it_takes_one(tmp_path, capsys):
    """v5 continues a v4 model: without --init-adapter (a resume included: the checkpoint pins the
    adapter's sha256) it is refused; a mix trained from the base refuses --init-adapter, never
    silently dropping it."""
    for argv in (["--mix", "v5", "--steps", "train"], ["--mix", "v5", "--steps", "train", "--resume"],
                 ["--mix", "v4", "--steps", "train", "--init-adapter", str(tmp_path)]):
        with pytest.raises(SystemExit) as exc:
            train_default.main([*argv, "--work", str(tmp_path / "w")])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--mix v5 continues a trained v4 model: give --init-adapter" in err
    assert "--init-adapter: --mix v4 trains from the base; only a continuation mix (v5, v6, v7)" in err
    assert not (tmp_path / "w").exists()


def test_continuation_data_is_the_base_mix_plus_scenarios_and_a_replay(tmp_path):
    """v5's data: v4's files rebuilt under data/base (the sha256 v4 pins), then CONTINUE's scenario
    records and a replay sample of v4's own train rows; selection and calibration extend v4's."""
    from noulengine.eval.suites import resolve_data_dir

    data_dir = resolve_data_dir(None)
    if data_dir is None:
        pytest.skip("no raw data root (../shared/data or $NOULENGINE_DATA)")
    info = train_default.build_continuation_data(data_dir, tmp_path / "v5", "v5")
    c = train_default.CONTINUE
    assert info["continues"] == "v4" and info["base"]["mix"] == "v4"
    assert info["train"]["rows"] == c["scenarios"] + c["replay"]
    assert info["train"]["sources"]["scenarios"] == c["scenarios"]
    base_rows = {json.loads(x)["id"] for x in (tmp_path / "v5" / "base" / "train.jsonl").read_text().splitlines()}
    rows = [json.loads(x) for x in (tmp_path / "v5" / "train.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in rows}) == len(rows)
    replay = [r for r in rows if r["id"] in base_rows]
    assert len(replay) == c["replay"] and sum(str(r.get("category", "")).startswith("scenario:") for r in rows) == c["scenarios"]
    assert info["selection"]["rows"] == info["base"]["selection"]["rows"] + c["scenario_selection"]
    sel_ids = {json.loads(x)["id"] for x in (tmp_path / "v5" / "selection.jsonl").read_text().splitlines()}
    assert not sel_ids & {r["id"] for r in rows}  # selection never trains
    again = train_default.build_continuation_data(data_dir, tmp_path / "again", "v5")
    assert again["train"]["sha256"] == info["train"]["sha256"]


def test_v7_replays_v2s_mix_and_a_share_of_tools_and_nouls_without_new_scenarios(tmp_path):
    """v7 (issue #54 item 4) continues a merge on a replay only: MIXES["v7"]["replay"] rows per group
    drawn from v4's train rows (v2's own mix, and v4's tool and yes/no rows), no scenario records;
    its selection and calibration rows are v6's, so its learning curve reads like the merge's."""
    from noulengine.eval.suites import resolve_data_dir

    data_dir = resolve_data_dir(None)
    if data_dir is None:
        pytest.skip("no raw data root (../shared/data or $NOULENGINE_DATA)")
    info = train_default.build_continuation_data(data_dir, tmp_path / "v7", "v7")
    want = train_default.MIXES["v7"]["replay"]
    rows = [json.loads(x) for x in (tmp_path / "v7" / "train.jsonl").read_text().splitlines()]
    assert info["train"]["rows"] == len(rows) == sum(want.values()) and info["train"]["sources"]["scenarios"] == 0
    kinds = [str(r.get("category", "")).split(":")[0] for r in rows]
    assert sum(k in train_default.TOOLS_AND_NOULS for k in kinds) == want["tools_and_nouls"]
    assert not any(k == "scenario" for k in kinds) and len({r["id"] for r in rows}) == len(rows)
    base_ids = {json.loads(x)["id"] for x in (tmp_path / "v7" / "base" / "train.jsonl").read_text().splitlines()}
    assert {r["id"] for r in rows} <= base_ids  # a replay: nothing new
    v6 = train_default.build_continuation_data(data_dir, tmp_path / "v6", "v6")
    for name in ("selection", "calibration_procedural"):
        assert info[name]["sha256"] == v6[name]["sha256"]


def test_a_continuation_takes_its_init_adapters_rank_and_alpha(tmp_path):
    """A merge of two rank-16 adapters is rank 32: the continuation's --lora-r/--lora-alpha are the
    adapter's (the trainer refuses any other), one flag each, everything else the recipe's."""
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 32, "lora_alpha": 32}))
    args = train_default.train_args(lr="5e-4", init_adapter=str(tmp_path))
    assert args.count("--lora-r") == 1 and args[args.index("--lora-r") + 1] == "32"
    assert args.count("--lora-alpha") == 1 and args[args.index("--lora-alpha") + 1] == "32"
    rest = train_default.train_args(lr="5e-4")
    assert [a for i, a in enumerate(args) if args[i - 1] not in ("--lora-r", "--lora-alpha")] == \
        [a for i, a in enumerate(rest) if rest[i - 1] not in ("--lora-r", "--lora-alpha")]


def test_data_mixes_rebuild_the_installed_data_and_v3_adds_its_rows(tmp_path):
    """The installed default's mix rebuilds byte for byte the train.jsonl its training.json pins
    (adding the v3 mix changed none of it); v3 adds workflow scenarios and framed prompts."""
    from noulengine.eval.suites import resolve_data_dir
    from noulengine.models.loading import DEFAULT_ADAPTER_DIR

    data_dir = resolve_data_dir(None)
    if data_dir is None:
        pytest.skip("no raw data root (../shared/data or $NOULENGINE_DATA)")
    installed = json.loads((DEFAULT_ADAPTER_DIR / "training.json").read_text())
    mix = next(k for k, v in train_default.MIXES.items() if v["name"] == installed["name"])
    built = train_default.build_data(data_dir, tmp_path / mix, mix)
    assert built["train"]["sha256"] == installed["data"]["train"]["sha256"]
    assert built["selection"]["sha256"] == installed["data"]["selection"]["sha256"]
    v3 = train_default.build_data(data_dir, tmp_path / "v3", "v3")
    src = v3["train"]["sources"]
    assert (src["scenarios"], src["wildjailbreak_benign_framed"], src["wildjailbreak_vanilla_harmful_framed"],
            src["procedural"]) == (600, 120, 60, 1300)
    rows = [json.loads(x) for x in (tmp_path / "v3" / "train.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in rows}) == len(rows) == v3["train"]["rows"]
    assert sum(str(r.get("category", "")).startswith("scenario:") for r in rows) == 600


def test_compare_with_says_matches_only_for_the_same_bytes(tmp_path, capsys):
    """The recipe's reproduction check: a copy of the installed default matches on data, adapter and
    temperatures; one changed adapter byte or one changed temperature is reported, not hidden."""
    import shutil

    from noulengine.models.loading import DEFAULT_ADAPTER_DIR

    run = tmp_path / "model"
    shutil.copytree(DEFAULT_ADAPTER_DIR, run)
    lines = train_default.compare_with(run)
    assert lines == capsys.readouterr().out.splitlines()
    assert "train.jsonl sha256" in lines[0] and " matches " in lines[0]
    assert "adapter_model.safetensors sha256" in lines[1] and " matches " in lines[1]
    assert "largest relative difference 0.00e+00" in lines[2] and "one only" not in lines[2]
    blob = bytearray((run / "adapter_model.safetensors").read_bytes())
    blob[-1] ^= 1
    (run / "adapter_model.safetensors").write_bytes(bytes(blob))
    cal = json.loads((run / "calibration.json").read_text())
    group = sorted(cal["groups"])[0]
    cal["groups"][group]["temperature"] *= 1.5
    del cal["groups"][sorted(cal["groups"])[-1]]
    (run / "calibration.json").write_text(json.dumps(cal))
    lines = train_default.compare_with(run)
    assert " matches " in lines[0] and "DIFFERS FROM" in lines[1]
    assert "largest relative difference 5.00e-01" in lines[2] and "groups in one only" in lines[2]
    record = json.loads((run / "training.json").read_text())
    installed = train_default._kernels(json.loads((DEFAULT_ADAPTER_DIR / "training.json").read_text()))
    for numerics, said in (({"mode": "portable", "cpu_capability": "DEFAULT", "cpu": "X"}, "portable"),
                           ({"mode": "native", "cpu_capability": "AVX512", "cpu": "AuthenticAMD AMD EPYC"},
                            "native AVX512 (AuthenticAMD AMD EPYC)")):
        (run / "training.json").write_text(json.dumps({**record, "cpu_capability": numerics["cpu_capability"],
                                                       "numerics": numerics}))
        lines = train_default.compare_with(run)
        if said == installed:  # the same kernels explain nothing: no line
            assert not any("CPU kernels" in line for line in lines)
        else:
            assert lines[2] == (f"  CPU kernels: this run {said}, the installed adapter's {installed}; float32 "
                                "results depend on them (only --numerics portable is the same on every x86-64 CPU)")
    assert installed == "portable"  # the shipped adapter is the portable run, so both branches ran
    # records written before numerics were recorded
    assert train_default._kernels({"cpu_capability": "AVX2"}) == "native AVX2"
    assert train_default._kernels({}) == "not recorded"
    assert train_default.compare_with(tmp_path / "empty") == []


def test_compare_with_names_a_candidate_folder(tmp_path, capsys):
    """--compare-with DIR: a run is checked against a committed candidate (not installed yet), and
    the lines name that folder; a folder without an adapter is refused before anything runs."""
    import shutil

    from noulengine.models.loading import DEFAULT_ADAPTER_DIR

    run, candidate = tmp_path / "model", tmp_path / "candidate"
    shutil.copytree(DEFAULT_ADAPTER_DIR, run)
    shutil.copytree(DEFAULT_ADAPTER_DIR, candidate)
    lines = train_default.compare_with(run, candidate)
    assert lines[1].endswith(f"matches {candidate}'s ({train_default.sha256_file(candidate / 'adapter_model.safetensors')})")
    with pytest.raises(SystemExit) as exit_:
        train_default.main(["--steps", "data", "--work", str(tmp_path / "work"), "--compare-with", str(tmp_path / "none")])
    assert exit_.value.code == 2
    assert f"--compare-with {tmp_path / 'none'}: no adapter_model.safetensors there" in capsys.readouterr().err


def test_selection_by_kind_scores_each_model_on_the_same_rows(tmp_path, tiny_llama, tiny_tokenizer, capsys):
    """experiments/selection_by_kind.py: per-kind metrics of each --model on the kept kinds only, the
    yes/no kind with its P(yes) AUC, equal to the engine's own answers on those rows."""
    import selection_by_kind

    from noulengine.engine.engine import Engine
    from tests.test_train import save_tiny, toy_rows, write

    model = save_tiny(tmp_path, tiny_llama, tiny_tokenizer)
    rows = toy_rows(12, 5, role="selection")
    for i, r in enumerate(rows):
        r["category"] = ["noul:toy", "tool:toy", "other"][i % 3]
    sel = write(tmp_path / "sel.jsonl", rows)
    out = tmp_path / "sel.json"
    assert selection_by_kind.main(["--selection", str(sel), "--model", str(model), "--model", str(model),
                                   "--kinds", "noul:,tool:", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert list(res) == [str(model)]  # one key per distinct model
    kinds = res[str(model)]["kinds"]
    assert set(kinds) == {"noul:toy", "tool:toy"} and kinds["noul:toy"]["decisions"] == 8  # 4 rows x 2 questions
    # the AUC of P(yes) over the kind's yes/no questions, recomputed from the engine's answers
    from noulengine.metrics.functional import binary_auc

    engine = Engine.from_pretrained(str(model))
    kept = [r for r in rows if r["category"] == "noul:toy"]
    ans = engine.decide_batch([{"state": r["state"], "questions": r["questions"]} for r in kept])
    gold = [r["targets"]["n"]["label"] == "yes" for r in kept]
    if any(gold) and not all(gold):
        import torch

        want = binary_auc(torch.tensor([a.answers["n"].probabilities["yes"] for a in ans]), torch.tensor(gold))
        assert kinds["noul:toy"]["yes_auc"] == pytest.approx(float(want), abs=1e-9)
    assert "| noul:toy | 8 |" in capsys.readouterr().out


def test_recipe_trains_and_calibrates_with_portable_numerics_on_pinned_threads(tmp_path, monkeypatch, capsys):
    """The recipe's default: train and calibrate run with the portable CPU kernels and the pinned
    thread count, so its adapter bytes do not depend on the host; ``--numerics native`` adds nothing."""
    from noulengine.train import numerics

    calls = []
    monkeypatch.setattr(train_default, "run", lambda cmd, ok=(0,), env=None: calls.append((cmd, env)) or 0)
    monkeypatch.setattr(train_default, "resolve_data_dir", lambda source: tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("NOULENGINE_THREADS", "1")
    train_default.main(["--steps", "train,calibrate", "--work", str(tmp_path / "work")])
    assert "train and calibrate run 2 threads, not NOULENGINE_THREADS=1" in capsys.readouterr().out
    (train, train_env), (calibrate, calibrate_env) = calls
    assert train[2:4] == ["noulengine", "train"] and calibrate[2:4] == ["noulengine", "calibrate"]
    assert train[train.index("--numerics") + 1] == "portable"
    want = {**numerics.PORTABLE_ENV, "NOULENGINE_THREADS": str(train_default.PORTABLE_THREADS)}
    assert train_env == want and calibrate_env == want
    calls.clear()
    train_default.main(["--steps", "train,calibrate", "--work", str(tmp_path / "work"), "--numerics", "native"])
    assert [env for _, env in calls] == [{}, {}] and calls[0][0][calls[0][0].index("--numerics") + 1] == "native"


def test_install_from_a_candidate_folder_copies_it_and_pins_its_sha(tmp_path, monkeypatch, capsys):
    """--steps install --install-from DIR: a committed candidate is installed as it is (its four
    files copied into decision_models/<its name>/, its adapter's sha256 pinned in shipped.json and
    made the default, the previous default kept), with no raw data folder needed; other steps with
    it, a folder missing a file, a shipped folder itself, or a shipped name with another adapter are
    refused before anything is written."""
    import shutil

    from noulengine.models.loading import DEFAULT_ADAPTER_DIR, DEFAULT_DECISION_MODEL, SHIPPED_FILE, read_shipped

    candidate, models = tmp_path / "candidate", tmp_path / "decision_models"
    shutil.copytree(DEFAULT_ADAPTER_DIR, candidate)
    blob = bytearray((candidate / "adapter_model.safetensors").read_bytes())
    blob[-1] ^= 1  # another adapter than the shipped one: a new pin
    (candidate / "adapter_model.safetensors").write_bytes(bytes(blob))
    models.mkdir()
    shutil.copy2(SHIPPED_FILE, models / "shipped.json")
    shutil.copytree(DEFAULT_ADAPTER_DIR, models / DEFAULT_DECISION_MODEL)
    shipped_before = (models / "shipped.json").read_text()
    monkeypatch.setattr(train_default, "DECISION_MODELS_DIR", models)
    monkeypatch.setattr(train_default, "resolve_data_dir", lambda source: None)  # installing reads no raw data
    with pytest.raises(SystemExit) as exc:
        train_default.main(["--steps", "train,install", "--work", str(tmp_path / "work"), "--install-from",
                            str(candidate)])
    assert exc.value.code == 2 and "only with --steps install" in capsys.readouterr().err
    (tmp_path / "partial").mkdir()
    shutil.copy2(candidate / "adapter_model.safetensors", tmp_path / "partial")
    with pytest.raises(SystemExit):
        train_default.main(["--steps", "install", "--work", str(tmp_path / "work"), "--install-from",
                            str(tmp_path / "partial")])
    assert "no adapter_config.json, training.json, calibration.json there" in capsys.readouterr().err
    # the candidate still carries the shipped default's name: that name keeps meaning its adapter
    with pytest.raises(SystemExit, match=f"{DEFAULT_DECISION_MODEL} is shipped already \\(adapter sha256"):
        train_default.main(["--steps", "install", "--work", str(tmp_path / "work"), "--install-from", str(candidate)])
    assert (models / "shipped.json").read_text() == shipped_before and sorted(p.name for p in models.iterdir()) == [
        DEFAULT_DECISION_MODEL, "shipped.json"]
    training = json.loads((candidate / "training.json").read_text())
    (candidate / "training.json").write_text(json.dumps({**training, "name": "noul-test-v9"}))
    assert train_default.main(["--steps", "install", "--work", str(tmp_path / "work"),
                               "--install-from", str(candidate)]) == 0
    digest = train_default.sha256_file(candidate / "adapter_model.safetensors")
    shipped = read_shipped(models / "shipped.json")
    assert shipped["default"] == "noul-test-v9" and shipped["models"]["noul-test-v9"] == {"adapter_sha256": digest}
    assert shipped["models"][DEFAULT_DECISION_MODEL] == read_shipped(SHIPPED_FILE)["models"][DEFAULT_DECISION_MODEL]
    for name in train_default.ADAPTER_FILES:
        assert (models / "noul-test-v9" / name).read_bytes() == (candidate / name).read_bytes()
    assert f"(was {DEFAULT_DECISION_MODEL}, still loadable by name)" in capsys.readouterr().out
    # the same adapter again under its name: allowed (a reproduction), nothing changes
    assert train_default.main(["--steps", "install", "--work", str(tmp_path / "work"),
                               "--install-from", str(candidate)]) == 0
    assert read_shipped(models / "shipped.json") == shipped
    with pytest.raises(SystemExit):
        train_default.main(["--steps", "install", "--work", str(tmp_path / "work"), "--install-from",
                            str(models / "noul-test-v9")])
    assert "that is the default itself (noul-test-v9)" in capsys.readouterr().err
    # a rollback: the previous default's own folder makes it the default again, copying nothing
    assert train_default.main(["--steps", "install", "--work", str(tmp_path / "work"), "--install-from",
                               str(models / DEFAULT_DECISION_MODEL)]) == 0
    assert read_shipped(models / "shipped.json")["default"] == DEFAULT_DECISION_MODEL
    assert (models / "noul-test-v9" / "adapter_model.safetensors").read_bytes() == bytes(blob)
    # the same name again with another calibration: a shipped name keeps meaning its files
    (candidate / "calibration.json").write_text("{}")
    with pytest.raises(SystemExit, match="noul-test-v9 is shipped already"):
        train_default.main(["--steps", "install", "--work", str(tmp_path / "work"), "--install-from", str(candidate)])
    for reserved in ("base", "gemma-3-270m", "SmolLM2-135M-Instruct".lower()):
        (candidate / "training.json").write_text(json.dumps({**training, "name": reserved}))
        with pytest.raises(SystemExit, match="is not a shipped model's name"):
            train_default.main(["--steps", "install", "--work", str(tmp_path / "work"), "--install-from",
                                str(candidate)])
    (candidate / "training.json").write_text(json.dumps({**training, "name": "../escape"}))
    with pytest.raises(SystemExit, match="is not a shipped model's name"):
        train_default.main(["--steps", "install", "--work", str(tmp_path / "work"), "--install-from", str(candidate)])