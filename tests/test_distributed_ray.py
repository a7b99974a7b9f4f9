"""Ray Data on a local cluster (issue #12): two actors, a tiny model saved to disk, bit-identical
answers, order and error rows kept, and a killed actor retried without lost or duplicated rows;
and on a two-node cluster started with the ``ray`` CLI (issue #34), one actor on each node."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


# -- two nodes ------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_TOKEN = secrets.token_hex(32)


def _ray_env() -> dict:
    """The environment of the nodes and the drivers: this checkout first on the path (each node's
    workers import noulengine from it), no inherited cluster address, and a token of this
    cluster's own. Ray >= 2.5x turns token authentication on by itself when it finds a token
    (``~/.ray/auth_token``, which a local ``ray.init()`` writes), so without one shared token a
    node or driver could join with authentication off and be refused."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=_TOKEN)
    return env


def _start_node(args: list, temp_dir: Path, log: Path) -> subprocess.Popen:
    """``ray start ... --block`` in a new session: the ``ray start`` process owns every process of
    its node (Ray ties their fate to it), so the node stops with that one process, which this test
    started; ``ray stop`` would stop every Ray process on the machine, other people's included."""
    ray_cli = Path(sys.executable).with_name("ray")  # the CLI of the ray this interpreter imports
    if not ray_cli.is_file():
        ray_cli = Path(shutil.which("ray") or "ray")
    cmd = [str(ray_cli), "start", *args, "--block", "--num-cpus", "1", "--object-store-memory", str(80 * 2**20),
           "--temp-dir", str(temp_dir), "--disable-usage-stats", "--include-log-monitor", "false",
           # ports picked free now: a second node on this machine, or another user's Ray, would
           # otherwise meet this one on Ray's fixed 52365 (dashboard agent)
           "--dashboard-agent-listen-port", str(_free_port()), "--metrics-export-port", str(_free_port()),
           "--runtime-env-agent-port", str(_free_port())]
    # SIGTERM stops the node at once: no 30 s drain (Ray >= 2.5x waits for leased workers to go)
    env = {**_ray_env(), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop_node(proc: subprocess.Popen) -> None:
    """SIGTERM to the node's ``ray start`` process (it stops its node's processes; their workers
    exit with the raylet), then SIGKILL to its process group if anything is left after 20 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session this test created for it: nobody else's processes
    except ProcessLookupError:
        pass


def _wait_started(proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text()
        if "block forever" in text:  # printed once the node's processes run
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"ray start did not bring the node up (rc {proc.poll()}):\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def two_nodes(request):
    """A head node ("node_a") and a second node ("node_b") on this machine, one CPU each, each with
    its own temp dir (short: Ray's socket paths must fit 107 bytes) and free ports, as
    docs/evaluation.md#two-nodes-as-tested runs them. Returns ``(GCS address, {node id hex:
    "node_a" | "node_b"})``; the finalizer stops both nodes and removes the temp dir."""
    tmp = Path(tempfile.mkdtemp(prefix="nr-", dir="/tmp"))
    port = _free_port()
    address = f"127.0.0.1:{port}"
    procs = []

    def stop():
        for proc in reversed(procs):  # the second node first, then the head
            _stop_node(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    request.addfinalizer(stop)
    head_args = ["--head", "--port", str(port), "--node-ip-address", "127.0.0.1", "--include-dashboard", "false",
                 "--dashboard-port", str(_free_port()), "--resources", json.dumps({"node_a": 1})]
    procs.append(_start_node(head_args, tmp / "a", tmp / "a.log"))
    _wait_started(procs[0], tmp / "a.log")
    b_args = ["--address", address, "--node-ip-address", "127.0.0.1", "--resources", json.dumps({"node_b": 1})]
    procs.append(_start_node(b_args, tmp / "b", tmp / "b.log"))
    _wait_started(procs[1], tmp / "b.log")
    nodes = {nid: name for nid, resources in _cluster_state(address)["nodes"].items()
             for name in ("node_a", "node_b") if name in resources}
    assert sorted(nodes.values()) == ["node_a", "node_b"], nodes  # the second node registered before it said so
    return address, nodes


_STATE_SCRIPT = """
import json, sys, ray
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)
nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
actors = [(a["ActorClassName"], a["Address"]["NodeID"]) for a in ray._private.state.actors().values()]
print(json.dumps({"nodes": nodes, "actors": actors}))
"""


def _cluster_state(address: str) -> dict:
    """``{"nodes": {node id hex: resources}, "actors": [(class name, node id hex), ...]}``: the live
    nodes and every actor the cluster has held (dead ones included), from the GCS, read by a
    driver of its own (this process may be a driver of the local cluster above already, and a
    process joins one cluster; the subprocess also gets this cluster's token, see _ray_env)."""
    done = subprocess.run([sys.executable, "-c", _STATE_SCRIPT, address], env=_ray_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_eval_on_a_two_node_cluster_writes_what_a_local_run_writes(two_nodes, model_dir, tmp_path):
    """``python -m noulengine.eval --ray --ray-address`` against a cluster of two ``ray start``
    nodes: two one-CPU actors on two one-CPU nodes, so one on each (checked in the GCS actor table),
    and the rows, answers and metrics equal a single-process run's (one thread, one request per
    pass, as in each actor). procedural-v1 needs no data folder, so this runs anywhere."""
    from noulengine.eval.__main__ import main

    address, nodes = two_nodes
    common = ["--suite", "procedural-v1", "--limit", "16", "--model", str(model_dir), "--max-batch-size", "1",
              "--no-progress", "--no-plots"]
    cmd = [sys.executable, "-m", "noulengine.eval", *common, "--output", str(tmp_path / "ray"), "--ray",
           "--ray-address", address, "--actors", "2", "--cpus-per-actor", "1", "--ray-batch-size", "2"]
    done = subprocess.run(cmd, env=_ray_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    deciders = [node for name, node in _cluster_state(address)["actors"] if "RayDecider" in name]
    assert sorted(nodes[n] for n in deciders) == ["node_a", "node_b"], deciders  # one actor on each node

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in each one-CPU actor
    try:
        assert main(common + ["--output", str(tmp_path / "local")]) == 0
    finally:
        torch.set_num_threads(threads)
    read = lambda d: {(r["suite"], r["row"]): r["answers"] for r in map(json.loads, (d / "predictions.jsonl").read_text().splitlines())}  # noqa: E731
    local, on_ray = read(tmp_path / "local"), read(tmp_path / "ray")
    assert len(on_ray) == 16 and on_ray == local
    assert json.loads((tmp_path / "ray" / "metrics.json").read_text()) == json.loads((tmp_path / "local" / "metrics.json").read_text())
    run = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert run["ray"]["address"] == address and run["ray"]["actors"] == 2
