"""Ray Data on a local cluster (issue #12): two actors, a tiny model saved to disk, bit-identical
answers, order and error rows kept, and a killed actor retried without lost or duplicated rows."""

from __future__ import annotations

import json
import os
import signal

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
pytest.importorskip("ray.data")

from noulengine import Engine  # noqa: E402
from noulengine.distributed import RayConfig, decide_dataset, decide_requests  # noqa: E402
from tests.conftest import three_question_request  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    return tiny_llama_dir


def _requests(n):
    out = []
    for i in range(n):
        req = three_question_request(state=f"Event {i}: {'login from a new country ' * (i % 5)}")
        out.append({"id": f"r{i}", **req})
    out[3] = {"id": "bad", "state": "x", "questions": {"q": {"type": "choice", "criteria": {"only": None}}}}
    return out


def _reference(model_dir, requests):
    """The single-process engine, one thread as in each one-CPU actor (GEMM summation order
    depends on the thread count), one request per pass as the actors are configured."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = Engine.from_pretrained(str(model_dir), max_batch_size=1)
        return [d.to_dict() for d in engine.decide_batch(requests)]
    finally:
        torch.set_num_threads(threads)


def _strip(d):
    return {k: v for k, v in d.items() if k != "latency_s"}


def test_two_actors_answer_bit_identically_in_order_with_error_rows(cluster, model_dir):
    requests = _requests(24)
    config = RayConfig(actors=2, num_cpus=1, batch_size=4, model=str(model_dir), engine_kwargs={"max_batch_size": 1})
    got = decide_requests(requests, config)
    want = _reference(model_dir, requests)
    assert len(got) == len(requests)
    assert [g["id"] for g in got] == [r["id"] for r in requests]  # input order
    assert got[3]["error"] is not None and got[3]["error"]["record_id"] == "bad"  # an error row, not a lost row
    assert [_strip(g) for g in got] == [_strip(w) for w in want]  # float32, bit for bit


def test_a_killed_actor_is_retried_without_losing_or_duplicating_rows(cluster, model_dir):
    import pickle

    requests = _requests(40)
    config = RayConfig(actors=2, num_cpus=1, batch_size=2, model=str(model_dir), engine_kwargs={"max_batch_size": 1})
    items = [{"index": i, "request": pickle.dumps(r)} for i, r in enumerate(requests)]
    ds = ray.data.from_items(items, override_num_blocks=20)
    seen, killed = [], None
    for batch in decide_dataset(ds, config).iter_batches(batch_size=None, batch_format="numpy"):
        seen += [(int(i), json.loads(t)) for i, t in zip(batch["index"], batch["decision"])]
        if killed is None:  # the first results are back, the rest are in flight: kill one actor
            actors = [a for a in ray._private.state.actors().values()
                      if "RayDecider" in a["ActorClassName"] and a["State"] == "ALIVE"]
            killed = actors[0]["ActorID"]
            os.kill(actors[0]["Pid"], signal.SIGKILL)
    assert killed is not None
    assert ray._private.state.actors()[killed]["NumRestarts"] >= 1  # Ray restarted it
    indices = [i for i, _ in seen]
    assert sorted(indices) == list(range(len(requests)))  # none lost, none twice
    want = _reference(model_dir, requests)
    assert [_strip(d) for _, d in sorted(seen, key=lambda x: x[0])] == [_strip(w) for w in want]


def test_decide_cli_on_ray_keeps_input_order_and_error_rows(cluster, model_dir, tmp_path):
    from noulengine.cli import main

    lines = [json.dumps(r) for r in _requests(10)]
    lines[6] = "{not json"
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    rc = main(["decide", "--input", str(src), "--output", str(dst), "--model", str(model_dir), "--max-batch-size", "1",
               "--ray", "--actors", "2", "--ray-batch-size", "3", "--no-progress"])
    assert rc == 1  # two error rows (a bad record, a bad line), every row still written
    rows = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [r["line"] for r in rows] == list(range(1, 11))
    assert rows[3]["error"]["record_id"] == "bad" and rows[6]["error"] is not None
    assert all(r["error"] is None for i, r in enumerate(rows) if i not in (3, 6))
    want = _reference(model_dir, [json.loads(x) for i, x in enumerate(lines) if i not in (3, 6)])
    got = [r for i, r in enumerate(rows) if i not in (3, 6)]
    assert [r["answers"] for r in got] == [w["answers"] for w in want]


@pytest.mark.parametrize("probe", [[], ["--probe", "reverse"]], ids=["plain", "probe"])
def test_eval_on_ray_writes_what_a_local_run_writes(cluster, model_dir, tmp_path, capsys, probe):
    """... with --probe reverse too: the reversed requests join the same Dataset and every row is
    written with its probe's answers."""
    from noulengine.eval.__main__ import main
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "agnews" / "test.csv").is_file():
        pytest.skip("shared data not present")
    common = ["--tasks", "agnews,jevbench_easy", "--limit", "6", "--model", str(model_dir), "--max-batch-size", "1",
              "--no-progress", "--no-plots", *probe]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in each one-CPU actor
    try:
        assert main(common + ["--output", str(tmp_path / "local")]) == 0
    finally:
        torch.set_num_threads(threads)
    assert main(common + ["--output", str(tmp_path / "ray"), "--ray", "--actors", "2", "--ray-batch-size", "2"]) == 0
    read = lambda d: {(r["suite"], r["row"]): (r["answers"], r.get("probe")) for r in map(json.loads, (d / "predictions.jsonl").read_text().splitlines())}  # noqa: E731
    local, on_ray = read(tmp_path / "local"), read(tmp_path / "ray")
    assert len(on_ray) == 12 and on_ray == local
    if probe:
        assert all(p["reverse"]["answers"] for _, p in on_ray.values())  # every row here has a choice question
    a = json.loads((tmp_path / "local" / "metrics.json").read_text())
    b = json.loads((tmp_path / "ray" / "metrics.json").read_text())
    assert a == b
    run = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert run["ray"]["actors"] == 2


def test_ray_flags_are_checked_before_anything_starts(tmp_path, capsys):
    from noulengine.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "r0", **three_question_request()}) + "\n")
    out = tmp_path / "out.jsonl"
    for extra, message in ((["--model", str(tmp_path / "nope")], "not found"),
                           (["--cpus-per-actor", "0"], "--cpus-per-actor must be > 0"),
                           (["--gpus-per-actor", "-1"], "--gpus-per-actor >= 0")):
        with pytest.raises(SystemExit) as exit_:
            main(["decide", "--input", str(src), "--output", str(out), "--ray", *extra])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
        assert not out.exists()
