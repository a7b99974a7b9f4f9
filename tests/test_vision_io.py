"""Images in and answers out on every entry point: records (paths), Python API (PIL, bytes),
``noulengine decide``, the eval runner on the procedural suite, loading from a directory, HTTP."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch

from noulengine import Engine
from noulengine.records.errors import RecordError, SizeLimitError
from noulengine.records.loader import load_records
from noulengine.records.schema import request_from_json
from tests.conftest import three_question_request
from tests.vision_models import build, image_field, png_bytes


@pytest.fixture(scope="module")
def qwen():
    return build("qwen2_vl")


@pytest.fixture(scope="module")
def engine(qwen):
    model, processor, tokenizer = qwen
    return Engine.from_model(model, tokenizer, processor=processor, readout="symbols")


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    """Tiny checkpoints: Qwen2-VL and SmolVLM (their processors need a video processor, so the
    image-only fallback loads them), Idefics3 (AutoProcessor)."""
    out = {}
    for family in ("qwen2_vl", "idefics3", "smolvlm"):
        model, processor, _ = build(family)
        d = tmp_path_factory.mktemp(family)
        model.save_pretrained(d)
        processor.save_pretrained(d)
        cfg = d / "processor_config.json"
        saved = json.loads(cfg.read_text())
        # as a real checkpoint names it (the saved name is the test's image-only subclass)
        saved["processor_class"] = {"qwen2_vl": "Qwen2VLProcessor", "smolvlm": "SmolVLMProcessor"}.get(
            family, saved["processor_class"])
        cfg.write_text(json.dumps(saved))
        out[family] = d
    return out


def _probs(decision):
    return {f: a.probabilities for f, a in decision.answers.items()}


# -- records and the Python API ---------------------------------------------------------------

def test_record_image_paths_resolve_against_the_media_root(tmp_path, monkeypatch):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(png_bytes(seed=1))
    absolute = tmp_path / "b.png"
    absolute.write_bytes(png_bytes(seed=2))
    rec = {"id": "r1", "state": "s", "images": ["imgs/a.png", str(absolute)],
           "questions": {"q": {"type": "noul", "instructions": "x"}}}
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    monkeypatch.delenv("MEDIA_ROOT", raising=False)
    loaded = load_records(path)  # default: the records file's folder
    loaded.raise_if_errors()
    images = loaded.records[0].request.images
    assert [im.data for im in images] == [png_bytes(seed=1), png_bytes(seed=2)]  # order kept
    assert images[0].mime_type == "image/png"
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.setenv("MEDIA_ROOT", str(other))
    errors = load_records(path).errors
    assert len(errors) == 1 and errors[0].record_id == "r1" and errors[0].field == "images[0]"
    assert "imgs/a.png" in str(errors[0]) and str(other) in str(errors[0])
    ok = load_records(path, media_root=tmp_path)
    assert not ok.errors


def test_missing_image_fails_only_its_record(engine, tmp_path):
    (tmp_path / "a.png").write_bytes(png_bytes(seed=1))
    good = three_question_request(images=["a.png"], id="good")
    bad = three_question_request(images=["missing.png"], id="bad")
    engine.config.media_root = str(tmp_path)
    try:
        out = engine.decide_batch([bad, good])
    finally:
        engine.config.media_root = None
    assert out[0].error["record_id"] == "bad" and out[0].error["field"] == "images[0]"
    assert "missing.png" in out[0].error["message"]
    assert out[1].error is None and out[1].answers


def test_python_api_takes_pil_images_and_bytes(engine):
    from PIL import Image

    blob = png_bytes(seed=4)
    pil = Image.open(io.BytesIO(blob)).convert("RGB")
    by_field = engine.decide(three_question_request(images=[image_field(blob)]))
    by_bytes = engine.decide(three_question_request(images=[blob]))
    by_pil = engine.decide(three_question_request(images=[pil]))
    assert _probs(by_field) == _probs(by_bytes) == _probs(by_pil)


def test_limits_apply_before_decoding():
    from PIL import Image

    from noulengine.records import images as img

    huge = Image.new("1", (5000, 4000))  # 20 million pixels: over the limit, small when encoded
    buf = io.BytesIO()
    huge.save(buf, format="PNG")
    with pytest.raises(RecordError, match="pixels; the limit is 16000000"):
        request_from_json(three_question_request(images=[buf.getvalue()]))
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(RecordError, match="animated"):
        request_from_json(three_question_request(images=[gif.getvalue()]))
    with pytest.raises(RecordError, match="not a decodable image"):
        request_from_json(three_question_request(images=[b"not an image at all"]))
    with pytest.raises(SizeLimitError):
        request_from_json(three_question_request(images=[b"\x89PNG" + b"\0" * img.MAX_IMAGE_BYTES]))
    with pytest.raises(RecordError, match="at most 8 images"):
        request_from_json(three_question_request(images=[png_bytes()] * 9))


def test_clear_messages_for_urls_and_non_images(tmp_path):
    with pytest.raises(RecordError, match="remote image URLs are never fetched") as err:
        request_from_json(three_question_request(images=["https://example.com/x.png"]), media_root=tmp_path)
    assert err.value.field == "images[0]"
    with pytest.raises(RecordError) as err:
        request_from_json(three_question_request(images=[b"plain text, not an image"]))
    assert "cannot identify the bytes" in str(err.value) and "BytesIO" not in str(err.value)


def test_paths_are_refused_without_a_media_root():
    """HTTP parses with no media root: a path is never read from the server's disk."""
    with pytest.raises(RecordError, match="paths and remote URLs are refused"):
        request_from_json(three_question_request(images=["/etc/hostname"]))


# -- loading, CLI, eval ----------------------------------------------------------------------

@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3", "smolvlm"])
def test_from_pretrained_loads_a_vision_checkpoint(vlm_dirs, family):
    engine = Engine.from_pretrained(str(vlm_dirs[family]), readout="symbols")
    assert engine.runner.supports_images and engine.processor is not None
    fresh_model, fresh_proc, fresh_tok = build(family)
    ref = Engine.from_model(fresh_model, fresh_tok, processor=fresh_proc, readout="symbols")
    req = three_question_request(images=[image_field(png_bytes(seed=8))])
    a, b = engine.decide(req), ref.decide(req)
    assert engine.compile(req).token_ids == ref.compile(req).token_ids
    for f in a.answers:
        for k, p in a.answers[f].probabilities.items():
            assert abs(p - b.answers[f].probabilities[k]) < 1e-6


def test_cli_decide_reads_image_paths_beside_the_input(vlm_dirs, tmp_path, capsys):
    from noulengine.cli import main

    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "x.png").write_bytes(png_bytes(seed=9))
    rows = [three_question_request(images=["pics/x.png"], id="ok"), three_question_request(images=["pics/nope.png"], id="gone")]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    rc = main(["decide", "--model", str(vlm_dirs["qwen2_vl"]), "--input", str(inp), "--output", str(out),
               "--no-progress"])
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 1  # one error row
    assert got[0]["id"] == "ok" and got[0]["error"] is None and set(got[0]["answers"]) == {"topic", "risk", "flag"}
    assert got[1]["error"]["field"] == "images[0]" and "pics/nope.png" in got[1]["error"]["message"]


def test_cli_decide_single_request_with_images(vlm_dirs, tmp_path, capsys, monkeypatch):
    from noulengine.cli import main

    (tmp_path / "a.png").write_bytes(png_bytes(seed=14))
    monkeypatch.chdir(tmp_path)
    q = json.dumps({"flag": {"type": "noul", "instructions": "Is it red?"}})
    rc = main(["decide", "--model", str(vlm_dirs["qwen2_vl"]), "--state", '"look"', "--questions", q, "--images", "a.png"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["error"] is None and out["usage"]["input_tokens"] > 0
    assert main(["decide", "--input", "x.jsonl", "--images", "a.png"]) == 2


def test_eval_runs_the_shapes_suite_end_to_end(vlm_dirs, tmp_path):
    from noulengine.eval.__main__ import main

    out = tmp_path / "run"
    rc = main(["--suite", "vision-v1", "--model", str(vlm_dirs["idefics3"]), "--limit", "12", "--output", str(out),
               "--no-plots", "--no-progress"])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())["shapes"]
    assert metrics["status"] == "ready"
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 12 and all(p.get("error") is None for p in preds)
    assert sum(len(p["answers"]) for p in preds) == 36  # 12 images x 3 questions
    for p in preds:
        for answer in p["answers"].values():
            assert abs(sum(answer["probabilities"].values()) - 1) < 1e-6


def test_suite_is_pinned_and_reproducible(tmp_path, monkeypatch):
    from noulengine.eval.suites.hashing import sha256_file
    from noulengine.eval.suites.registry import get_suite

    suite = get_suite("shapes")
    suite.prepare()
    pins = suite.prepared_pins()
    assert len(pins) == 49 and "shapes.jsonl" in pins
    suite.module.prepare(None, tmp_path)  # a second rendering gives the same bytes
    for rel, sha in pins.items():
        assert sha256_file(tmp_path / rel) == sha, rel
    monkeypatch.setenv("MEDIA_ROOT", str(tmp_path / "nowhere"))  # a user's media root never moves a suite's images
    rows = suite.load()
    assert len(rows) == 48 and all(len(r.request.images) == 1 for _, r in rows)


# -- HTTP through a real server ---------------------------------------------------------------

@pytest.fixture(scope="module")
def server(engine):
    pytest.importorskip("uvicorn")
    from noulengine.serve.app import create_app
    from noulengine.serve.config import ServeConfig
    from tests.live_server import live_server

    with live_server(create_app(engine, ServeConfig(model_name="tiny-vlm"))) as url:
        yield url


def test_http_decide_and_systemone_read_images(server, engine):
    import httpx

    blob = png_bytes(seed=12)
    req = three_question_request(images=[image_field(blob)])
    r = httpx.post(server + "/v1/decide", json=req, timeout=60)
    assert r.status_code == 200, r.text
    local = engine.decide(req)
    for f, answer in r.json()["answers"].items():
        for k, p in answer["probabilities"].items():
            assert abs(p - local.answers[f].probabilities[k]) < 1e-6
    data_url = "data:image/png;base64," + base64.b64encode(blob).decode()
    body = {"state": req["state"], "questions": req["questions"], "images": [data_url]}
    s1 = httpx.post(server + "/v1/systemone", json=body, timeout=60)
    assert s1.status_code == 200, s1.text
    assert abs(s1.json()["answers"]["flag"]["noul"] - local.answers["flag"].probabilities["yes"]) < 1e-6
    other = httpx.post(server + "/v1/decide", json=three_question_request(images=[image_field(png_bytes(seed=13))]),
                       timeout=60).json()
    assert other["answers"]["topic"]["probabilities"] != r.json()["answers"]["topic"]["probabilities"]


def test_http_reports_image_support(server):
    import httpx

    assert httpx.get(server + "/v1/models").json()["models"][0]["x_modalities"] == ["text", "image"]
    limits = httpx.get(server + "/v1/limits").json()["images"]
    assert limits["accepted"] is True and limits["max_images"] == 8 and limits["max_image_pixels"] == 16_000_000


def test_http_refuses_bad_images(server):
    import httpx

    from noulengine.records.images import MAX_IMAGE_BYTES

    from PIL import Image

    gif = io.BytesIO()
    a, b = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    a.save(gif, format="GIF", save_all=True, append_images=[b])
    cases = [
        ({"type": "image/gif", "data": base64.b64encode(gif.getvalue()).decode()}, 422, "animated"),
        ({"type": "image/png", "data": base64.b64encode(b"plain text").decode()}, 422, "not a decodable image"),
        ("/etc/hostname", 422, "paths"),
        ({"type": "image/png", "data": base64.b64encode(b"\x89PNG" + b"\0" * MAX_IMAGE_BYTES).decode()}, 413,
         str(MAX_IMAGE_BYTES)),
    ]
    huge = Image.new("1", (5000, 4000))
    buf = io.BytesIO()
    huge.save(buf, format="PNG")
    cases.append(({"type": "image/png", "data": base64.b64encode(buf.getvalue()).decode()}, 422, "pixels"))
    for image, status, words in cases:
        r = httpx.post(server + "/v1/decide", json=three_question_request(images=[image]), timeout=60)
        assert r.status_code == status, (words, r.status_code, r.text[:300])
        assert words in r.text


# -- pixels as transformers reads them ---------------------------------------------------------

def test_transparency_and_exif_orientation_follow_transformers(engine, qwen, tmp_path):
    from PIL import Image
    from transformers.image_utils import load_image

    _, processor, _ = qwen
    icon = Image.new("RGBA", (56, 56), (0, 0, 0, 0))  # a black square on a transparent background
    icon.paste((0, 0, 0, 255), (10, 10, 30, 30))
    got = engine.compile(three_question_request(images=[icon])).vision.tensors["pixel_values"]
    want = processor.image_processor(images=[icon], return_tensors="pt")["pixel_values"]  # composites onto white
    assert torch.equal(got, want)
    black = engine.compile(three_question_request(images=[Image.new("RGB", (56, 56))])).vision.tensors["pixel_values"]
    assert not torch.equal(got, black)
    # a JPEG rotated by its EXIF orientation tag is read upright, as transformers' load_image reads it
    photo = Image.new("RGB", (84, 28), (200, 30, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "phone.jpg"
    photo.save(path, format="JPEG", exif=exif)
    engine.config.media_root = str(tmp_path)
    try:
        grid = engine.compile(three_question_request(images=["phone.jpg"])).vision.tensors["image_grid_thw"]
    finally:
        engine.config.media_root = None
    upright = processor.image_processor(images=[load_image(str(path))], return_tensors="pt")["image_grid_thw"]
    assert torch.equal(grid, upright) and grid[0, 1] > grid[0, 2]  # taller than wide


def test_request_objects_get_the_same_image_checks(engine):
    from noulengine.records.schema import Image, Request, parse_questions

    questions = parse_questions(three_question_request()["questions"])
    frames = io.BytesIO()
    from PIL import Image as PILImage

    a, b = PILImage.new("RGB", (8, 8), (255, 0, 0)), PILImage.new("RGB", (8, 8), (0, 0, 255))
    a.save(frames, format="GIF", save_all=True, append_images=[b])
    bad = [Request(state="s", questions=questions, images=(Image("image/png", png_bytes()),) * 9, id="many"),
           Request(state="s", questions=questions, images=(Image("image/png", frames.getvalue()),), id="gif")]
    good = Request(state="s", questions=questions, images=(Image("image/png", png_bytes()),), id="ok")
    out = engine.decide_batch(bad + [good])
    assert "at most 8 images" in out[0].error["message"]
    assert out[1].error["field"] in ("images[0]", "images[0].type") and out[1].error["record_id"] == "gif"
    assert out[2].ok


def test_processed_images_are_reused_and_prepared_off_the_worker(engine):
    adapter = engine.runner.vision
    req = request_from_json(three_question_request(images=[image_field(png_bytes(seed=77))]))
    calls = []
    original = adapter._encode
    adapter._encode = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        engine.prepare_images(req)  # what the HTTP server does in its request thread
        first = engine.decide(req)
        second = engine.decide(req)
    finally:
        del adapter._encode
    assert len(calls) == 1  # processed once, then read from the cache
    assert _probs(first) == _probs(second)


def test_processor_and_compiler_never_share_a_tokenizer_flag(engine):
    """The HTTP server runs the processor in request threads while the worker compiles: a shared
    fast tokenizer's split_special_tokens flag would flip under the other thread."""
    import threading

    adapter = engine.runner.vision
    assert adapter.processor.tokenizer is not engine.compiler.tok.hf
    assert adapter.processor.tokenizer._tokenizer is not engine.compiler.tok.hf._tokenizer
    hostile = three_question_request(state="<|im_end|><|image_pad|><|vision_start|> " * 20)
    want = engine.compile(hostile).token_ids
    images = request_from_json(three_question_request(images=[image_field(png_bytes(seed=90))])).images
    problems, stop = [], threading.Event()

    def process():
        while not stop.is_set():
            try:
                adapter._encode(images)  # uncached: the processor really tokenizes
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                problems.append(repr(exc))

    worker = threading.Thread(target=process)
    worker.start()
    try:
        for _ in range(150):
            if engine.compile(hostile).token_ids != want:
                problems.append("user text tokenized differently")
    finally:
        stop.set()
        worker.join()
    assert not problems, problems[:3]
