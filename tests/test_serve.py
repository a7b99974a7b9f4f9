"""HTTP service tests on a tiny random model: routes, error shapes, auth, limits, batching."""

from __future__ import annotations

import base64
import io
import json
import math
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from noulengine import Engine  # noqa: E402
from noulengine.serve.app import create_app  # noqa: E402
from noulengine.serve.config import ServeConfig  # noqa: E402
from tests.conftest import three_question_request  # noqa: E402

JEV_Q = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": "Payments", "Technical": None}},
    "anger": {"type": "score", "instructions": "How frustrated?", "criteria": ["Calm", {"label": "Upset"}, "Angry"]},
}


@pytest.fixture(scope="module")
def engine(tiny_llama, tiny_tokenizer):
    return Engine.from_model(tiny_llama, tiny_tokenizer)


def make_client(engine, **cfg):
    return TestClient(create_app(engine, ServeConfig(model_name="tiny", **cfg)))


@pytest.fixture(scope="module")
def client(engine):
    with make_client(engine) as c:
        yield c


def strict_json(resp):
    """Parse like a strict client: NaN/Infinity are errors."""
    def bad(name):
        raise AssertionError(f"non-finite {name} in {resp.text[:200]}")
    return json.loads(resp.text, parse_constant=bad)


def png_b64(w=4, h=4) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


# -- routes ------------------------------------------------------------------------------------

def test_healthz_models_and_demo(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    m = client.get("/v1/models").json()["models"][0]
    assert m["name"] == "tiny" and all(isinstance(m[k], str) for k in ("name", "description", "release_date"))
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"] and "/v1/decide" in page.text


def test_decide_returns_engine_format(client, engine):
    req = three_question_request(id="r1")
    r = client.post("/v1/decide", json=req)
    assert r.status_code == 200, r.text
    body = strict_json(r)
    assert body["id"] == "r1" and body["error"] is None and list(body["answers"]) == ["topic", "risk", "flag"]
    direct = engine.decide(req).to_dict()
    for f in body["answers"]:
        assert body["answers"][f]["probabilities"] == direct["answers"][f]["probabilities"]


def test_systemone_contract(client):
    r = client.post("/v1/systemone", json={"model": "jev-latest", "state": {"ticket": "charged twice"},
                                           "questions": JEV_Q, "x_unknown": 1},
                    headers={"Authorization": "Bearer whatever"})  # ignored without a key
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = strict_json(r)
    assert set(body) == {"model", "answers", "usage"} and body["model"] == "tiny"
    assert body["usage"]["output_tokens"] == 0 and body["usage"]["input_tokens"] > 0
    a = body["answers"]
    assert set(a["refund"]) == {"type", "noul"} and 0 <= a["refund"]["noul"] <= 1
    assert set(a["team"]) == {"type", "choice", "probabilities", "confidence"}
    assert set(a["team"]["probabilities"]) == {"Billing", "Technical"}
    assert a["team"]["choice"] == max(a["team"]["probabilities"], key=a["team"]["probabilities"].get)
    s = a["anger"]
    assert s["legend"] == {"0": "Calm", "1": {"label": "Upset"}, "2": "Angry"}
    assert list(s["probabilities"]) == ["0", "1", "2"]
    assert math.isclose(s["score"], sum(i * p for i, p in enumerate(s["probabilities"].values())), abs_tol=1e-9)
    p = list(a["team"]["probabilities"].values())
    assert math.isclose(a["team"]["confidence"], (max(p) - 0.5) / 0.5, abs_tol=1e-9)


def test_systemone_accepts_contract_variants(client):
    qs = {"🎯 q.1": {"type": "noul", "criteria": {"true": "wants a refund"}},
          "n2": {"type": "noul", "instructions": "x?", "criteria": None},
          "c": {"type": "choice", "instructions": ["route", "it"], "criteria": {"환불": None, "기타": {"a": 1}}}}
    r = client.post("/v1/systemone", json={"state": ["a", "b"], "questions": qs})  # no model: the served one
    assert r.status_code == 200, r.text
    assert set(r.json()["answers"]) == set(qs)
    assert set(r.json()["answers"]["c"]["probabilities"]) == {"환불", "기타"}


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/decide"])
@pytest.mark.parametrize("payload,loc", [
    (b'{"state": "x", "questions": {', None),
    ({"questions": {"q": {"type": "noul", "instructions": "x"}}}, ["body", "state"]),
    ({"state": "x"}, ["body", "questions"]),
    ({"state": "x", "questions": {}}, ["body", "questions"]),
    ({"state": "x", "questions": {"q": {"type": "boolean", "instructions": "x"}}}, ["body", "questions", "q", "type"]),
    ({"state": "x", "questions": {"q.1": {"type": "choice", "instructions": "x", "criteria": {"a": None}}}},
     ["body", "questions", "q.1", "criteria"]),
    ({"state": "x", "questions": {f"q{i}": {"type": "noul", "instructions": "x"} for i in range(65)}},
     ["body", "questions"]),  # over both routes' default caps (decide 16, systemone 64)
    ({"state": "x", "questions": {"q": {"type": "score", "instructions": "x", "criteria": [str(i) for i in range(11)]}}},
     ["body", "questions", "q", "criteria"]),
])
def test_validation_errors_are_422_with_loc(client, path, payload, loc):
    r = client.post(path, content=payload if isinstance(payload, bytes) else json.dumps(payload).encode())
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail[0]["loc"][0] == "body"
    assert isinstance(detail[0]["msg"], str) and isinstance(detail[0]["type"], str)
    if loc:
        assert detail[0]["loc"] == loc


def test_systemone_rejects_map_scores_and_unknown_model(client):
    q = {"a": {"type": "score", "instructions": "x", "criteria": {"0": "lo", "1": "hi"}}}
    r = client.post("/v1/systemone", json={"state": "x", "questions": q})
    assert r.status_code == 422 and "map form" in r.json()["detail"][0]["msg"]
    r = client.post("/v1/systemone", json={"model": "nope", "state": "x", "questions": JEV_Q})
    assert r.status_code == 404 and r.json()["detail"]["error_type"] == "model_not_found"


def _noul_questions(n: int) -> dict:
    return {f"q{i}": {"type": "noul", "instructions": f"Is item {i} late?"} for i in range(n)}


def test_question_caps_are_per_route_defaults(client):
    r = client.post("/v1/systemone", json={"state": "x", "questions": _noul_questions(20)})  # Jev's frozen tests
    assert r.status_code == 200, r.text
    assert len(strict_json(r)["answers"]) == 20
    assert client.post("/v1/decide", json={"state": "x", "questions": _noul_questions(16)}).status_code == 200
    r = client.post("/v1/decide", json={"state": "x", "questions": _noul_questions(17)})
    assert r.status_code == 422
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "questions"] and item["type"] == "too_long"
    assert "at most 16" in item["msg"] and "--max-questions decide=16" in item["msg"] and "got 17" in item["msg"]
    r = client.post("/v1/systemone", json={"state": "x", "questions": _noul_questions(65)})
    assert r.status_code == 422 and "--max-questions systemone=64" in r.json()["detail"][0]["msg"]
    limits = client.get("/v1/limits").json()
    assert limits["max_questions"] == {"/v1/decide": 16, "/v1/systemone": 64}


def test_question_caps_are_configurable(engine):
    from noulengine.serve.config import parse_max_questions

    caps = parse_max_questions(["decide=40", "systemone=none"])
    with make_client(engine, max_questions=caps) as c:
        r = c.post("/v1/decide", json={"state": "x", "questions": _noul_questions(40)})
        assert r.status_code == 200 and len(r.json()["answers"]) == 40
        r = c.post("/v1/decide", json={"state": "x", "questions": _noul_questions(41)})
        assert r.status_code == 422 and "at most 40" in r.json()["detail"][0]["msg"]
        assert c.post("/v1/systemone", json={"state": "x", "questions": _noul_questions(70)}).status_code == 200
        assert c.get("/v1/limits").json()["max_questions"] == {"/v1/decide": 40, "/v1/systemone": None}
    with make_client(engine, max_questions=parse_max_questions(["2"])) as c:  # every route
        for path in ("/v1/decide", "/v1/systemone"):
            r = c.post(path, json={"state": "x", "questions": _noul_questions(3)})
            assert r.status_code == 422 and "at most 2" in r.json()["detail"][0]["msg"]


@pytest.mark.parametrize("values, words", [
    (["decid=3"], "unknown route 'decid'"), (["0"], "positive integer"), (["systemone=x"], "positive integer"),
])
def test_max_questions_flag_refuses_bad_values(values, words):
    from noulengine.serve.config import parse_max_questions

    with pytest.raises(ValueError, match=words):
        parse_max_questions(values)


def test_serve_help_shows_max_questions(capsys):
    from noulengine.serve.__main__ import build_parser, config_from_args

    text = " ".join(build_parser().format_help().split())  # argparse wraps lines
    assert "--max-questions" in text and "decide=16, systemone=64" in text
    args = build_parser().parse_args(["--max-questions", "systemone=128", "--max-questions", "decide=none"])
    assert config_from_args(args).max_questions == {"decide": None, "systemone": 128}
    with pytest.raises(SystemExit, match="unknown route"):
        config_from_args(build_parser().parse_args(["--max-questions", "v1=3"]))


def test_demo_page_reads_the_question_cap_from_the_server(client):
    page = client.get("/").text
    assert 'fetch("/v1/limits")' in page and 'max_questions["/v1/decide"]' in page


@pytest.mark.parametrize("ctype, status", [
    ("text/plain", 415), ("application/x-www-form-urlencoded", 415), ("multipart/form-data; boundary=x", 415),
    ("application/json", 200), ("application/json; charset=utf-8", 200), ("application/vnd.api+json", 200)])
def test_only_json_content_types_are_read(client, ctype, status):
    # text/plain and form bodies are "simple" cross-origin requests (no CORS preflight)
    body = json.dumps({"state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it x?"}}}).encode()
    for path in ("/v1/decide", "/v1/systemone"):
        r = client.post(path, content=body, headers={"Content-Type": ctype})
        assert r.status_code == status, (path, r.text)
        if status == 415:
            assert r.json()["detail"]["error_type"] == "unsupported_media_type" and ctype in r.json()["detail"]["message"]


def test_nan_in_request_is_rejected(client):
    r = client.post("/v1/decide", content=b'{"state": NaN, "questions": {"q": {"type": "noul", "instructions": "x"}}}')
    assert r.status_code == 422


def test_unknown_route_error_shape(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and set(r.json()["detail"]) == {"error_type", "message"}


def test_text_model_reports_no_image_support(client):
    assert client.get("/v1/models").json()["models"][0]["x_modalities"] == ["text"]
    assert client.get("/v1/limits").json()["images"]["accepted"] is False


def test_images_on_text_model_are_unsupported(client):
    req = three_question_request(images=[{"type": "image/png", "data": png_b64()}])
    r = client.post("/v1/decide", json=req)
    assert r.status_code == 400 and r.json()["detail"]["error_type"] == "unsupported_modality"
    assert "images" in r.json()["detail"]["message"]


def test_bad_images_are_rejected_when_images_are_supported(engine, monkeypatch):
    monkeypatch.setattr(engine.runner, "supports_images", True, raising=False)
    with make_client(engine) as c:
        for image, field in (("/etc/passwd", "images"), ("https://example.com/a.png", "images"),
                             ({"type": "image/png", "data": "!!!!"}, "images")):
            r = c.post("/v1/decide", json=three_question_request(images=[image]))
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["loc"][:3] == ["body", field, 0]
        r = c.post("/v1/decide", json=three_question_request(images=[{"type": "image/png", "data": png_b64()}] * 9))
        assert r.status_code == 422 and "at most 8" in r.json()["detail"][0]["msg"]


def test_body_over_limit_is_413(engine):
    with make_client(engine, max_body_bytes=1000) as c:
        r = c.post("/v1/decide", json=three_question_request(state="x" * 2000))
        assert r.status_code == 413 and r.json()["detail"]["error_type"] == "payload_too_large"


def test_stalled_body_is_cut_off(engine):
    import anyio

    from noulengine.serve.limits import BodyLimitMiddleware

    sent = []

    async def app(scope, receive, send):  # pragma: no cover - never reached
        raise AssertionError("the app must not run")

    async def receive():
        await anyio.sleep(10)

    async def send(msg):
        sent.append(msg)

    mw = BodyLimitMiddleware(app, max_body_bytes=100, body_timeout_s=0.2)
    anyio.run(mw, {"type": "http", "method": "POST", "headers": []}, receive, send)
    assert sent[0]["status"] == 408


def test_api_key(engine):
    with make_client(engine, api_key="s3cret") as c:
        body = {"state": "x", "questions": JEV_Q}
        missing = c.post("/v1/systemone", json=body)
        wrong = c.post("/v1/systemone", json=body, headers={"Authorization": "Bearer nope"})
        assert missing.status_code == 401 and wrong.status_code == 401
        assert missing.json()["detail"]["error_type"] == "authentication_error"
        assert c.post("/v1/decide", json=three_question_request()).status_code == 401
        assert c.get("/metrics").status_code == 401
        assert c.post("/v1/systemone", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.post("/v1/decide", json=three_question_request(), headers={"x-api-key": "s3cret"}).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_full_queue_gets_429(engine):
    from noulengine.records.schema import request_from_json

    app = create_app(engine, ServeConfig(model_name="tiny", max_queue=1))
    gate = threading.Event()
    real = engine.decide_batch

    def slow(*a, **k):
        gate.wait(60)
        return real(*a, **k)

    with TestClient(app) as c:
        worker = app.state.worker
        worker.engine.decide_batch = slow
        try:
            # Fill the one queue slot directly (no client thread to race with), then ask over HTTP.
            first = worker.submit(request_from_json(three_question_request()))
            assert worker.depth == 1
            r = c.post("/v1/decide", json=three_question_request())
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.json()["detail"]["error_type"] == "overloaded"
            gate.set()
            assert first.result(timeout=60).ok
        finally:
            gate.set()
            del worker.engine.decide_batch


def test_metrics_text(client):
    client.post("/v1/decide", json=three_question_request())
    text = client.get("/metrics").text
    assert 'noulengine_requests_total{route="/v1/decide",status="200"}' in text
    for name in ("noulengine_request_duration_seconds_bucket", "noulengine_batch_requests_bucket",
                 "noulengine_queue_depth", "noulengine_input_tokens_total"):
        assert name in text


def _metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_metrics_report_the_prefix_cache_hit_rate(client):
    """Two one-question requests: each reuses the cached frame head, and /metrics counts it."""
    engine = client.app.state.engine
    store = engine.prefix_store
    assert store is not None
    before = client.get("/metrics").text
    requests = [{"state": s, "questions": {"q": {"type": "noul", "instructions": "Is it urgent?"}}}
                for s in ("The server is down.", "A user asked for a refund.")]
    for r in requests:
        assert client.post("/v1/decide", json=r).status_code == 200
    text = client.get("/metrics").text
    grown = {n: _metric(text, f"noulengine_prefix_cache_{n}") - _metric(before, f"noulengine_prefix_cache_{n}")
             for n in ("queries_total", "hits_total", "query_tokens_total", "hit_tokens_total")}
    assert grown["queries_total"] == 2 and grown["hits_total"] == 2
    assert grown["hit_tokens_total"] == 2 * len(engine.compiler.frame_head_ids())
    assert grown["query_tokens_total"] == sum(engine.compile(r).input_tokens for r in requests)
    assert _metric(text, "noulengine_prefix_cache_hit_rate") == pytest.approx(store.stats.token_hit_rate, abs=1e-6)
    assert _metric(text, "noulengine_prefix_cache_capacity_bytes") == store.max_bytes > 0
    assert _metric(text, "noulengine_prefix_cache_entries") == len(store) >= 1


# -- batching ----------------------------------------------------------------------------------

def _states(n):
    return [f"Event {i}: " + "the server rejected logins " * (1 + i % 5) for i in range(n)]


BATCH_TOL = 1e-6  # float32 kernels tile differently for different batch shapes (observed ~1e-7)


def test_batched_answers_equal_alone(engine):
    """Concurrent requests share forward passes, and each answer equals the request sent alone:
    the same argmax and every probability within BATCH_TOL (bitwise equality is not promised
    across batch shapes in float32; see the engine's own equivalence test, 1e-5)."""
    reqs = [three_question_request(state=s, id=f"r{i}") for i, s in enumerate(_states(12))]
    with make_client(engine, max_wait_ms=200) as c:
        alone = [c.post("/v1/decide", json=r).json() for r in reqs]
        results = [None] * len(reqs)

        def go(i):
            results[i] = c.post("/v1/decide", json=reqs[i])

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        sizes = c.app.state.metrics.batch_sizes
    assert all(r is not None and r.status_code == 200 for r in results)
    assert sizes.total < 2 * len(reqs), "no request was batched with another"
    for a, b in zip(alone, results):
        b = b.json()
        assert a["id"] == b["id"]
        for f in a["answers"]:
            pa, pb = a["answers"][f]["probabilities"], b["answers"][f]["probabilities"]
            assert list(pa) == list(pb) and a["answers"][f]["label"] == b["answers"][f]["label"], f
            assert max(abs(pa[k] - pb[k]) for k in pa) < BATCH_TOL, (f, pa, pb)


def test_same_batch_gives_bitwise_identical_answers(engine):
    """Repeated identical traffic gives bitwise-identical answers (no hidden state or randomness)."""
    req = three_question_request(id="same")
    with make_client(engine) as c:
        first, second = (c.post("/v1/decide", json=req).json() for _ in range(2))
    assert first["answers"] == second["answers"]


def test_worker_gathers_one_request_per_call_when_batching_is_off(engine):
    from noulengine.records.schema import request_from_json
    from noulengine.serve.worker import BatchWorker

    calls = []
    real = engine.decide_batch
    w = BatchWorker(engine, max_batch_tokens=1, max_wait_ms=50)
    w.engine = type("E", (), {"decide_batch": lambda self, reqs, **k: calls.append(len(reqs)) or real(reqs, **k)})()
    futures = [w.submit(request_from_json(three_question_request(state=s))) for s in _states(4)]
    w.start()
    try:
        assert all(f.result(30).ok for f in futures)
    finally:
        w.stop()
    assert calls == [1, 1, 1, 1]


# -- command line --------------------------------------------------------------------------------

def test_cli_refuses_public_host_without_key(monkeypatch):
    from noulengine.serve.__main__ import build_parser, config_from_args

    parse = build_parser().parse_args
    with pytest.raises(SystemExit, match="refusing to bind"):
        config_from_args(parse(["--host", "0.0.0.0"]))
    assert config_from_args(parse(["--host", "0.0.0.0", "--insecure"])).api_key is None
    with pytest.raises(SystemExit, match="unset or empty"):
        config_from_args(parse(["--api-key-env", "NOULENGINE_TEST_NO_SUCH_VAR"]))
    monkeypatch.setenv("NOULENGINE_TEST_KEY", "k1")
    cfg = config_from_args(parse(["--host", "0.0.0.0", "--api-key-env", "NOULENGINE_TEST_KEY", "--max-batch-tokens", "1"]))
    assert cfg.api_key == "k1" and cfg.max_batch_tokens == 1
    assert config_from_args(parse(["--host", "::1"])).api_key is None
    # the eval/decide spelling of the same setting
    assert config_from_args(parse(["--batch-tokens", "2048"])).max_batch_tokens == 2048
    with pytest.raises(SystemExit, match="--batch-tokens must be at least 1"):
        config_from_args(parse(["--batch-tokens", "0"]))


def test_cli_serve_verb_delegates(capsys):
    from noulengine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0 and "--max-wait-ms" in capsys.readouterr().out


def test_duplicate_keys_in_body_are_422_not_a_dropped_option(client):
    body = ('{"state": 1, "questions": {"q": {"type": "choice", "instructions": "x", '
            '"criteria": {"a": "first", "a": "second", "b": null}}}}')
    for path in ("/v1/decide", "/v1/systemone"):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        item = strict_json(r)["detail"][0]
        assert item["type"] == "json_invalid" and "duplicate key 'a'" in item["msg"]


def test_systemone_images_are_not_silently_dropped(client):
    r = client.post("/v1/systemone", json={"state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}},
                                           "images": [png_b64()]})
    assert r.status_code == 400 and strict_json(r)["detail"]["error_type"] == "unsupported_modality"


def test_lone_surrogates_are_422_naming_the_field(client):
    body = '{"state": "\\ud800", "questions": {"q": {"type": "noul", "instructions": "x"}}}'
    for path in ("/v1/decide", "/v1/systemone"):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and strict_json(r)["detail"][0]["loc"] == ["body", "state"], r.text


def test_image_one_byte_over_the_limit_is_413_with_both_sizes(engine, monkeypatch):
    from noulengine.records.images import MAX_IMAGE_BYTES

    monkeypatch.setattr(engine.runner, "supports_images", True, raising=False)
    blob = b"\x89PNG" + b"\0" * (MAX_IMAGE_BYTES + 1 - 4)  # size is checked before Pillow sees the bytes
    image = {"type": "image/png", "data": base64.b64encode(blob).decode()}
    with make_client(engine) as c:
        r = c.post("/v1/decide", json=three_question_request(images=[image]))
    assert r.status_code == 413, r.text[:300]
    detail = r.json()["detail"]
    assert detail["error_type"] == "payload_too_large"
    assert str(MAX_IMAGE_BYTES) in detail["message"] and str(MAX_IMAGE_BYTES + 1) in detail["message"]


def test_jev_public_model_names_are_aliases(client):
    assert client.get("/v1/models").json()["models"][0]["x_aliases"] == ["jev-latest", "noul"]
    for name in ("noul", "jev-latest", "tiny"):
        r = client.post("/v1/systemone", json={"model": name, "state": "x", "questions": JEV_Q})
        assert r.status_code == 200 and r.json()["model"] == "tiny", (name, r.text[:200])
    r = client.post("/v1/systemone", json={"model": "noul-2", "state": "x", "questions": JEV_Q})
    assert r.status_code == 404 and "'jev-latest', 'noul', 'tiny'" in r.json()["detail"]["message"]


def test_score_answers_name_their_level_text(client):
    r = client.post("/v1/systemone", json={"state": "x", "questions": JEV_Q})
    s = strict_json(r)["answers"]["anger"]
    assert s["x_level"] in s["probabilities"] and s["x_level_text"] == s["legend"][s["x_level"]]
    d = strict_json(client.post("/v1/decide", json=three_question_request()))["answers"]["risk"]
    assert d["level_texts"] == {"0": "none", "1": "low", "2": "high"} and d["level_text"] == d["level_texts"][d["label"]]
    page = client.get("/").text
    assert "level_texts" in page and '"yes/no"' in page


# -- one validation path for both routes (issue #25, items 15 and 16) ----------------------------

_DEEP = "[" * 600 + "]" * 600
BAD_VALUES = [  # (raw body, loc on both routes, type)
    ('{"state":"s","questions":{"q":{"type":"choice","instructions":"x","criteria":{"a":[1e400],"b":null}}}}',
     ["body", "questions", "q", "criteria", "a", 0], "finite_number"),
    ('{"state":"s","questions":{"q":{"type":"score","instructions":"x","criteria":["low",{"v":-1e400}]}}}',
     ["body", "questions", "q", "criteria", 1, "v"], "finite_number"),
    ('{"state":"s","questions":{"q":{"type":"noul","instructions":"x","criteria":{"true":[1e400]}}}}',
     ["body", "questions", "q", "criteria", "true", 0], "finite_number"),
    ('{"state":{"n":1e999},"questions":{"q":{"type":"noul","instructions":"x"}}}', ["body", "state", "n"], "finite_number"),
    ('{"state":"s","questions":{"\\ud800":{"type":"bogus","instructions":"x"}}}', ["body", "questions"], "string_unicode"),
    ('{"state":"s","questions":{"q":{"type":"noul","instructions":"x","criteria":{"\\udfff":"y"}}}}',
     ["body", "questions", "q", "criteria"], "string_unicode"),
    ('{"state":"s","questions":{"q":{"type":"choice","instructions":"x","criteria":{"a\\udc00b":"y","c":null}}}}',
     ["body", "questions", "q", "criteria"], "string_unicode"),
    ('{"state":"s","questions":{"q":{"type":"choice","instructions":"x","criteria":{"a":%s,"b":null}}}}' % _DEEP,
     ["body", "questions", "q"], "too_deep"),
]


@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/decide"])
@pytest.mark.parametrize("body,loc,type_", BAD_VALUES, ids=[f"bad{i}" for i in range(len(BAD_VALUES))])
def test_bad_json_values_get_the_same_422_on_both_routes(client, path, body, loc, type_):
    """1e400 (read as infinity), lone surrogates in ids and keys, and over-deep nesting: a 422
    naming the field, the same on both routes, never a 500 while rendering or echoing it."""
    r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    r.content.decode("utf-8")  # strict UTF-8: no lone surrogate reached the client
    item = strict_json(r)["detail"][0]
    assert (item["loc"], item["type"]) == (loc, type_), item


def test_errors_that_echo_a_lone_surrogate_are_escaped():
    from noulengine.serve.responses import ApiError, ValidationFailure

    body = ValidationFailure(["questions", "\ud800", "type"], "got '\udfff'").response().body.decode("utf-8")
    assert json.loads(body)["detail"][0] == {"loc": ["body", "questions", "\\ud800", "type"], "msg": "got '\\udfff'",
                                              "type": "value_error"}
    assert "\\udc00" in json.loads(ApiError(400, "x", "a\udc00").response().body.decode("utf-8"))["detail"]["message"]


def test_systemone_translation_runs_the_shared_checks():
    """translate_request refuses what /v1/decide's frame check refuses (called alone, too)."""
    from noulengine.serve.responses import ValidationFailure
    from noulengine.serve.systemone import translate_request

    with pytest.raises(ValidationFailure) as err:
        translate_request({"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": [float("inf")], "b": None}}}})
    assert err.value.items[0]["loc"] == ["body", "questions", "q", "criteria", "a", 0]
