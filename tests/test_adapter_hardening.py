"""The adapter endpoints secured and bounded (issue #57 item 1).

Adapters are real folders on a tiny random Llama (``adapter_config.json`` + a safetensors file
written here, PEFT's key names); servers are the real app (``TestClient`` or uvicorn on loopback).
Each test names the defect it pins: operator-named adapters deleted over HTTP; files of a folder
read through links out of the root; hostile ``path`` values answered 500 and the keep-alive
connection reset; ``--max-loaded-adapters`` exceeded after a batch; a deleted adapter answered 400;
``PUT`` answered ``Allow: GET``; deletions counted as route ``other``; ``serve --adapter`` with a bad
folder printing a traceback; malformed folders answered 500, and a folder that went bad between an
eviction and its reload failing its whole batch; no cap on one adapter's size or on loaded adapters.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import struct
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from noulengine import Engine  # noqa: E402
from noulengine.engine.lora import AdapterError  # noqa: E402
from noulengine.records.schema import request_from_json  # noqa: E402
from noulengine.serve.app import create_app  # noqa: E402
from noulengine.serve.config import ServeConfig  # noqa: E402
from tests.conftest import three_question_request  # noqa: E402

PREFIX = "base_model.model.model.layers"


def write_adapter(folder: Path, *, rank: int = 2, seed: int = 0, modules=("q_proj", "v_proj"), layers=(0, 1),
                  hidden: int = 64, config: dict | None = None) -> Path:
    """A PEFT LoRA folder for the tiny Llama (hidden 64): ``lora_A`` (r, 64), ``lora_B`` (64, r) per
    module, B non-zero so the adapter changes answers."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    out_dims = {"q_proj": hidden, "v_proj": 32, "k_proj": 32, "o_proj": hidden}
    tensors = {}
    for layer in layers:
        for m in modules:
            key = f"{PREFIX}.{layer}.self_attn.{m}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.3
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_dims[m], rank, generator=gen) * 0.3
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(modules), "bias": "none",
           "base_model_name_or_path": "tiny-llama"}
    (folder / "adapter_config.json").write_text(json.dumps(config if config is not None else cfg))
    return folder


def _safetensors(path: Path, header: dict, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.fixture()
def new_engine(tiny_llama, tiny_tokenizer):
    """A fresh engine on a copy of the tiny Llama each call (loaded adapters wrap the model's layers)."""
    return lambda: Engine.from_model(copy.deepcopy(tiny_llama), tiny_tokenizer)


@pytest.fixture()
def engine(new_engine):
    return new_engine()


def _request(adapter=None, state="The server rejected 3 logins from a new country.") -> dict:
    body = three_question_request(state=state)
    return {**body, "adapter": adapter} if adapter else body


# -- malformed folders: 400 adapter_refused naming the file, the field and the rule --------------

def _malformed(root: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """name -> (folder, words the refusal must contain: the file and the field or rule)."""
    cases = {}

    def case(name, *words, **kw):
        folder = write_adapter(root / name, **kw)
        cases[name] = (folder, words)
        return folder

    case("alpha-text", "adapter_config.json", "lora_alpha", "finite number",
         config={"peft_type": "LORA", "lora_alpha": "sixteen"})
    case("config-list", "adapter_config.json", "JSON object", config=[])
    case("rslora-text", "adapter_config.json", "use_rslora", config={"peft_type": "LORA", "use_rslora": "yes"})
    case("peft-type-list", "adapter_config.json", "peft_type", config={"peft_type": ["LORA"]})
    f = case("config-not-json", "adapter_config.json", "not valid JSON")
    (f / "adapter_config.json").write_text("{lora_alpha: 8")
    f = case("truncated", "adapter_model.safetensors", "truncated")
    raw = (f / "adapter_model.safetensors").read_bytes()
    (f / "adapter_model.safetensors").write_bytes(raw[:-100])
    f = case("corrupt-header", "adapter_model.safetensors", "header")
    (f / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"\xff" * 40)
    f = case("empty-weights", "adapter_model.safetensors", "too short")
    (f / "adapter_model.safetensors").write_bytes(b"")
    f = case("int-dtype", "adapter_model.safetensors", "dtype", "I64")
    _safetensors(f / "adapter_model.safetensors",
                 {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": {"dtype": "I64", "shape": [2, 64],
                                                                  "data_offsets": [0, 1024]}}, b"\0" * 1024)
    f = case("three-d", "adapter_model.safetensors", "shape", "2-D")
    _safetensors(f / "adapter_model.safetensors",
                 {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": {"dtype": "F32", "shape": [2, 8, 4],
                                                                  "data_offsets": [0, 256]}}, b"\0" * 256)
    case("wrong-width", "q_proj", "is 64 -> 64 in this base", hidden=48)  # another base's shapes
    f = case("non-finite", "adapter_model.safetensors", "non-finite")
    from safetensors.torch import load_file, save_file
    t = load_file(str(f / "adapter_model.safetensors"))
    next(iter(t.values()))[0, 0] = float("nan")
    save_file(t, str(f / "adapter_model.safetensors"))
    f = case("training-list", "training.json", "JSON object")
    (f / "training.json").write_text("[1, 2]")
    f = case("training-base-text", "training.json", "base_model")
    (f / "training.json").write_text(json.dumps({"base_model": "tiny"}))
    return cases


def test_malformed_folders_are_400_adapter_refused_by_post_and_refused_at_start(engine, new_engine, tmp_path):
    """Issue #57: a non-numeric lora_alpha (ValueError), a JSON list config (AttributeError), a
    truncated or corrupt safetensors file (SafetensorError) answered 500 internal_error."""
    root = tmp_path / "root"
    cases = _malformed(root)
    write_adapter(root / "good")
    with TestClient(create_app(engine, ServeConfig(model_name="tiny", adapter_root=str(root)))) as c:
        for name, (_, words) in cases.items():
            r = c.post("/v1/adapters", json={"name": name, "path": name})
            assert r.status_code == 400, (name, r.status_code, r.text)
            detail = r.json()["detail"]
            assert detail["error_type"] == "adapter_refused", (name, detail)
            for word in words:
                assert word in detail["message"], (name, word, detail["message"])
        assert [a["name"] for a in c.get("/v1/adapters").json()["adapters"]] == []  # nothing half-registered
        assert c.post("/v1/adapters", json={"name": "good", "path": "good"}).status_code == 200
        assert c.post("/v1/decide", json=_request("good")).status_code == 200
    for name, (folder, words) in cases.items():  # the same folders named at start: refused, an AdapterError
        with pytest.raises(AdapterError, match=words[0].replace(".", r"\.")):
            create_app(new_engine(), ServeConfig(model_name="tiny", adapters={name: str(folder)}))


def test_serve_with_a_malformed_adapter_folder_exits_2_with_one_line(tmp_path, capsys):
    """Issue #57: `noulengine serve --adapter x=FOLDER` with a malformed folder printed a traceback
    and exited 1; now the refusal, one line, exit 2, before any model loads."""
    from noulengine.cli import main

    bad = write_adapter(tmp_path / "bad", config={"peft_type": "LORA", "lora_alpha": "abc"})
    assert main(["serve", "--adapter", f"x={bad}", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --adapter: adapter 'x'") and "lora_alpha" in err[0]
    big = write_adapter(tmp_path / "big", rank=64)
    assert main(["serve", "--adapter", f"x={big}", "--max-adapter-bytes", "1000", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over this server's --max-adapter-bytes 1000" in err[0]


# -- security: operator-named adapters, files confined to the root ---------------------------------

def test_operator_named_adapters_are_deleted_only_with_runtime_loading_and_the_key(engine, new_engine, tmp_path):
    """Issue #57: without --adapter-root and without a key, DELETE removed an adapter the operator
    named on the command line (it could not be loaded back until a restart)."""
    named = write_adapter(tmp_path / "named")
    with TestClient(create_app(engine, ServeConfig(model_name="tiny", adapters={"v6": str(named)}))) as c:
        r = c.delete("/v1/adapters/v6")
        assert r.status_code == 403 and "--adapter-root" in r.json()["detail"]["message"]
        assert [a["name"] for a in c.get("/v1/adapters").json()["adapters"]] == ["v6"]
        assert c.post("/v1/decide", json=_request("v6")).status_code == 200
        assert c.delete("/v1/adapters/nope").status_code == 404
    root = tmp_path / "root"
    root.mkdir()
    cfg = ServeConfig(model_name="tiny", adapters={"v6": str(named)}, adapter_root=str(root), api_key="k")
    with TestClient(create_app(new_engine(), cfg)) as c:
        assert c.delete("/v1/adapters/v6").status_code == 401
        assert c.delete("/v1/adapters/v6", headers={"Authorization": "Bearer k"}).status_code == 200


def test_a_file_linked_out_of_the_root_is_refused_and_nothing_of_it_echoed(engine, tmp_path):
    """Issue #57: a config linked to a JSON file outside the root was read, its peft_type echoed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({"peft_type": "SECRET-TOKEN-1234"}))
    good = write_adapter(outside / "good")
    root = tmp_path / "root"
    folder = write_adapter(root / "linked")
    (folder / "adapter_config.json").unlink()
    (folder / "adapter_config.json").symlink_to(outside / "secret.json")
    weights = write_adapter(root / "weights-out")
    (weights / "adapter_model.safetensors").unlink()
    (weights / "adapter_model.safetensors").symlink_to(good / "adapter_model.safetensors")
    (root / "inside").mkdir()
    write_adapter(root / "real")
    (root / "inside" / "alias").symlink_to(root / "real")  # a link that stays inside the root is fine
    with TestClient(create_app(engine, ServeConfig(model_name="tiny", adapter_root=str(root)))) as c:
        for path in ("linked", "weights-out"):
            r = c.post("/v1/adapters", json={"name": path, "path": path})
            assert r.status_code == 403, (path, r.text)
            assert "SECRET-TOKEN" not in r.text and str(outside) not in r.text
            assert "outside the adapter root" in r.json()["detail"]["message"]
        assert c.post("/v1/adapters", json={"name": "alias", "path": "inside/alias"}).status_code == 200


# -- robustness: hostile paths, keep-alive, the limit, 404 for a deleted adapter -----------------

def test_hostile_paths_get_4xx_and_no_error_resets_a_keep_alive_connection(engine, tmp_path):
    """Issue #57: a NUL byte in `path`, a component over 255 bytes or a symlink loop answered 500,
    and after a 500 the keep-alive connection was reset."""
    from tests.live_server import live_server

    root = tmp_path / "root"
    root.mkdir()
    (root / "loop").symlink_to(root / "loop")
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    app = create_app(engine, ServeConfig(model_name="tiny", adapter_root=str(root)))

    @app.get("/test-only/raise")
    async def _raise():  # an internal error: the last-resort 500 must keep the connection too
        raise RuntimeError("boom")

    bodies = [{"name": "n", "path": "a\x00b"}, {"name": "n", "path": "x" * 300}, {"name": "n", "path": "loop"},
              {"name": "n", "path": "a/adapter"}, {"name": "n", "path": "ok/" + "é" * 200},
              {"name": "n", "path": "\ud800"}]
    with live_server(app) as url:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        conn.connect()
        sock = conn.sock
        for body in bodies:
            conn.request("POST", "/v1/adapters", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            text = r.read().decode()
            assert 400 <= r.status < 500, (body["path"][:20], r.status, text)
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() and conn.sock is sock  # the same connection answers on
        conn.request("GET", "/test-only/raise")
        r = conn.getresponse()
        assert r.status == 500 and json.loads(r.read())["detail"]["error_type"] == "internal_error"
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        assert r.status == 200 and r.read() and conn.sock is sock
        conn.close()


def _parsed(adapter=None, state="s"):
    return request_from_json(_request(adapter, state=state))


def test_max_loaded_adapters_holds_after_a_batch_naming_two(engine, tmp_path):
    """Issue #57: with --max-loaded-adapters 1, one concurrent batch naming two adapters left both
    loaded indefinitely. Now the worker splits such a batch into passes of at most one adapter."""
    a, b = write_adapter(tmp_path / "a", seed=1), write_adapter(tmp_path / "b", seed=2)
    app = create_app(engine, ServeConfig(model_name="tiny", adapters={"a": str(a), "b": str(b)},
                                         max_loaded_adapters=1, max_wait_ms=50))
    worker, registry = app.state.worker, app.state.metrics.adapters  # the registry /metrics reads
    seen = []
    real = engine.decide_batch

    def watched(requests, **kw):  # the real engine, observed: how many adapters are loaded in each pass
        seen.append(len(engine.adapters.slots))
        return real(requests, **kw)

    engine.decide_batch = watched
    futures = [worker.submit(_parsed(n)) for n in ("a", "b", None, "b", "a")]  # queued before the thread starts
    worker.start()
    try:
        decisions = [f.result(timeout=120) for f in futures]
    finally:
        worker.stop()
    assert all(d.error is None for d in decisions)
    assert len(registry.loaded) == 1 and len(engine.adapters.slots) == 1
    assert seen and max(seen) <= 1, seen


def test_a_request_waiting_for_a_deleted_adapter_gets_404(engine, tmp_path):
    """Issue #57: a request waiting for an adapter that is deleted got 400 bad_request, not the
    documented 404 adapter_not_found."""
    root = tmp_path / "root"
    write_adapter(root / "x")
    cfg = ServeConfig(model_name="tiny", adapter_root=str(root), max_wait_ms=3000, max_batch_requests=8)
    with TestClient(create_app(engine, cfg)) as c:
        assert c.post("/v1/adapters", json={"name": "x", "path": "x"}).status_code == 200
        worker = c.app.state.worker
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", c.post("/v1/decide", json=_request("x"))))
        t.start()
        deadline = time.monotonic() + 20
        while worker.depth == 0 and time.monotonic() < deadline:  # queued: the worker gathers for 3 s
            time.sleep(0.01)
        assert worker.depth == 1
        assert c.delete("/v1/adapters/x").status_code == 200
        t.join(60)
        r = out["r"]
        assert r.status_code == 404 and r.json()["detail"]["error_type"] == "adapter_not_found", r.text


def test_a_folder_that_goes_bad_between_eviction_and_reload_fails_only_its_requests(engine, new_engine, tmp_path):
    """Issue #57: an evicted adapter whose config became `[]` on disk was reloaded when a request
    named it, and the AttributeError failed the whole batch (6 of 9 answered 500). Now only the
    requests naming it are refused (400 adapter_refused, naming the file and the rule)."""
    a, b = write_adapter(tmp_path / "a", seed=1), write_adapter(tmp_path / "b", seed=2)
    app = create_app(engine, ServeConfig(model_name="tiny", adapters={"a": str(a), "b": str(b)},
                                         max_loaded_adapters=1, max_wait_ms=50))
    worker, registry = app.state.worker, app.state.metrics.adapters  # the registry /metrics reads
    assert list(registry.loaded) == ["b"]  # loading b at start evicted a
    (a / "adapter_config.json").write_text("[]")  # a goes bad on disk while evicted
    names = ["a"] + [None] * 5 + ["b"] * 3
    futures = [worker.submit(_parsed(n, state=f"ticket {i}")) for i, n in enumerate(names)]  # one burst
    worker.start()
    try:
        for n, f in zip(names, futures):
            if n == "a":
                with pytest.raises(AdapterError, match=r"adapter_config\.json must hold a JSON object, got a list"):
                    f.result(timeout=120)
            else:
                assert f.result(timeout=120).error is None, n
    finally:
        worker.stop()
    with TestClient(create_app(new_engine(), ServeConfig(
            model_name="tiny", adapters={"b": str(b)}, adapter_root=str(tmp_path), max_loaded_adapters=1))) as c:
        good = write_adapter(tmp_path / "c", seed=3)
        assert c.post("/v1/adapters", json={"name": "c", "path": "c"}).status_code == 200  # evicts b
        (b / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "lora_alpha": "x"}))
        r = c.post("/v1/decide", json=_request("b"))
        assert r.status_code == 400 and r.json()["detail"]["error_type"] == "adapter_refused"
        assert "lora_alpha" in r.json()["detail"]["message"]
        assert c.post("/v1/decide", json=_request("c")).status_code == 200 and good.is_dir()


def test_put_adapters_answers_405_naming_get_and_post(engine):
    """Issue #57: `PUT /v1/adapters` answered 405 with `Allow: GET` (POST is served too)."""
    with TestClient(create_app(engine, ServeConfig(model_name="tiny"))) as c:
        r = c.put("/v1/adapters", json={})
        assert r.status_code == 405 and r.json()["detail"]["error_type"] == "method_not_allowed"
        assert sorted(m.strip() for m in r.headers["allow"].split(",")) == ["GET", "POST"]
        r = c.get("/v1/adapters/x")
        assert r.status_code == 405 and r.headers["allow"] == "DELETE"


def test_metrics_count_adapter_deletions_under_their_own_route(engine, tmp_path):
    """Issue #57: `/metrics` counted adapter deletions as route `other`, with unknown paths."""
    root = tmp_path / "root"
    write_adapter(root / "x")
    with TestClient(create_app(engine, ServeConfig(model_name="tiny", adapter_root=str(root)))) as c:
        assert c.post("/v1/adapters", json={"name": "x", "path": "x"}).status_code == 200
        assert c.delete("/v1/adapters/x").status_code == 200
        assert c.delete("/v1/adapters/x").status_code == 404
        assert c.get("/no/such/path").status_code == 404
        text = c.get("/metrics").text
    assert 'noulengine_requests_total{route="/v1/adapters/{name}",status="200"} 1' in text
    assert 'noulengine_requests_total{route="/v1/adapters/{name}",status="404"} 1' in text
    assert 'noulengine_requests_total{route="other",status="404"} 1' in text


# -- bounds: one adapter's size, the number loaded, memory after unloading ------------------------

def test_max_adapter_bytes_refuses_from_the_header_before_the_weights_are_read(engine, tmp_path):
    """Issue #57: a rank-262,144 adapter (1.2 GB of factors) loaded and answered. Here a rank-262,144
    pair on one module, 128 MiB in a sparse file (a valid header, zeros on no disk): refused at once
    from its header, naming both sizes; finite defaults apply without the flags."""
    root = tmp_path / "root"
    folder = write_adapter(root / "huge")
    rank = 262_144
    n = rank * 64 * 4
    header = {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": {"dtype": "F32", "shape": [rank, 64],
                                                             "data_offsets": [0, n]},
              f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": {"dtype": "F32", "shape": [64, rank],
                                                             "data_offsets": [n, 2 * n]}}
    raw = json.dumps(header).encode()
    with open(folder / "adapter_model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + 2 * n)  # sparse: 128 MiB declared, no blocks written
    write_adapter(root / "small")
    cfg = ServeConfig(model_name="tiny", adapter_root=str(root), max_adapter_bytes=64 * 2**20)
    t0 = time.perf_counter()
    with TestClient(create_app(engine, cfg)) as c:
        r = c.post("/v1/adapters", json={"name": "huge", "path": "huge"})
        assert r.status_code == 400 and r.json()["detail"]["error_type"] == "adapter_refused"
        assert f"holds {2 * n} bytes of factors, over this server's --max-adapter-bytes {64 * 2**20}" in r.text
        assert c.post("/v1/adapters", json={"name": "small", "path": "small"}).status_code == 200
        assert c.get("/v1/adapters").json()["max_adapter_bytes"] == 64 * 2**20
    assert time.perf_counter() - t0 < 30
    default = ServeConfig()
    assert default.max_adapter_bytes == 256 * 2**20 and default.max_loaded_adapters == 8
    from noulengine.serve.__main__ import build_parser

    args = build_parser().parse_args([])
    assert (args.max_loaded_adapters, args.max_adapter_bytes) == (8, 256 * 2**20)


def _rss_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


RSS_MARGIN_MB = 16  # what may stay after unloading, or come on top of the factors: allocator pools, objects


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm (Linux)")
def test_many_registrations_stay_within_the_default_limit_and_memory_returns(engine, tmp_path):
    """Issue #57: 200 registrations of one folder under 200 names all loaded (RSS 420 -> 1,752 MB,
    1,057 MB after deleting them all). Now at most the default 8 are loaded (RSS grows by at most
    their factors plus RSS_MARGIN_MB), and after deleting them all the resident set is back within
    RSS_MARGIN_MB of where it started.

    Each adapter here is 3.5 MiB of factors (rank 2048 on q_proj and v_proj of two layers): 40
    registrations would hold 140 MiB without the limit; with it, 8 x 3.5 = 28 MiB."""
    root = tmp_path / "root"
    write_adapter(root / "big", rank=2048)
    with TestClient(create_app(engine, ServeConfig(model_name="tiny", adapter_root=str(root)))) as c:
        assert c.post("/v1/decide", json=_request()).status_code == 200  # warm-up
        before = _rss_mb()
        for i in range(40):
            assert c.post("/v1/adapters", json={"name": f"n{i}", "path": "big"}).status_code == 200
            if i % 5 == 0:
                assert c.post("/v1/decide", json=_request(f"n{i}")).status_code == 200
        listing = c.get("/v1/adapters").json()
        loaded = [a for a in listing["adapters"] if a["loaded"]]
        peak = _rss_mb()
        for i in range(40):
            assert c.delete(f"/v1/adapters/n{i}").status_code == 200
        after = _rss_mb()
    held = sum(a["bytes"] for a in loaded) / 2**20
    print(f"RSS before {before:.1f} MB; 40 registered, {len(loaded)} loaded ({held:.1f} MiB of factors): "
          f"{peak:.1f} MB; after deleting all: {after:.1f} MB (margin {RSS_MARGIN_MB} MB)")
    assert len(loaded) == 8 and listing["max_loaded"] == 8 and listing["evictions"] == 32
    assert peak - before < held + RSS_MARGIN_MB, (before, peak, held)  # bounded by the limit, not the registrations
    assert after - before < RSS_MARGIN_MB, (before, peak, after)


# -- friction: the trained adapter's file mode ---------------------------------------------------

def test_train_writes_the_adapter_weights_with_the_mode_of_the_other_files(tiny_llama, tmp_path):
    """Issue #57 item 3: `noulengine train` wrote adapter_model.safetensors 0600 and the folder's
    other files 0644 (safetensors writes through a private temporary file)."""
    peft = pytest.importorskip("peft")
    from noulengine.train.methods import save_trained

    model = peft.get_peft_model(copy.deepcopy(tiny_llama), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    files = save_trained(model, None, tmp_path / "out", method="lora")
    modes = {f: oct((tmp_path / "out" / f).stat().st_mode & 0o777) for f in files}
    assert "adapter_model.safetensors" in modes and len(set(modes.values())) == 1, modes
