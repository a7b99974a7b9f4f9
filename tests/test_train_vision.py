"""Training a vision-language model: the answer is only in the pixels, the language model learns
to read it, the vision tower and projector stay frozen, and the output loads and serves images."""

from __future__ import annotations

import json
import random

import pytest
import torch

from noulengine import Engine
from noulengine.train import TrainConfig, train
from noulengine.train.contamination import EvaluationIndex
from noulengine.train.methods import apply_method, vision_parameters
from tests.vision_models import build, image_field

COLOURS = {"red": (230, 20, 20), "blue": (20, 40, 230)}
QUESTIONS = {"c": {"type": "choice", "instructions": "Which colour fills the image?",
                   "criteria": {"red": None, "blue": None}},
             "n": {"type": "noul", "instructions": "Is the image red?"}}


def colour_rows(n: int, seed: int, role=None):
    """The same state for every row; the gold answer is the image's colour (a little noise)."""
    import numpy as np
    from PIL import Image
    import io

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        gold = rng.choice(sorted(COLOURS))
        base = np.array(COLOURS[gold], dtype=np.int16)
        noise = np.random.default_rng(seed * 1000 + i).integers(-25, 26, (56, 56, 3))
        im = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        rows.append({"id": f"img-{seed}-{i}", "state": "Look at the image.", "images": [image_field(buf.getvalue())],
                     "questions": QUESTIONS,
                     "targets": {"c": {"label": gold}, "n": {"label": "yes" if gold == "red" else "no"}},
                     **({"validation_role": role} if role else {})})
    return rows


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def accuracy(engine, rows) -> float:
    out = engine.decide_batch(rows, on_error="raise")
    hits = [d.answers[f].label == r["targets"][f]["label"] for d, r in zip(out, rows) for f in ("c", "n")]
    return sum(hits) / len(hits)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    model, processor, _ = build("qwen2_vl")
    d = tmp_path_factory.mktemp("qwen-vlm")
    model.save_pretrained(d)
    processor.save_pretrained(d)
    return d


def _vision_state(model):
    return {n: p.detach().clone() for n, p in vision_parameters(model)}


def test_lora_targets_only_the_language_model():
    model, _, _ = build("idefics3")  # its vision tower has q_proj/k_proj/v_proj too
    assert any(".vision_model." in n and n.endswith("q_proj.weight") for n, _ in model.named_parameters())
    peft_model = apply_method(model, method="lora", lora_r=4, lora_alpha=8)
    adapted = [n for n, _ in peft_model.named_parameters() if "lora_" in n]
    assert adapted and all(".text_model.layers." in n for n in adapted), adapted[:3]
    assert {n.split(".")[-4] for n in adapted if n.endswith("lora_A.default.weight")} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any(p.requires_grad for _, p in vision_parameters(peft_model.get_base_model()))
    top = apply_method(build("idefics3")[0], method="lora", lora_r=4, lora_layers=1)
    assert all(".text_model.layers.1." in n for n, _ in top.named_parameters() if "lora_" in n)


def test_full_training_reads_pixels_and_keeps_the_vision_tower_frozen(tmp_path, qwen_dir):
    data = write(tmp_path / "train.jsonl", colour_rows(48, 0))
    sel = write(tmp_path / "sel.jsonl", colour_rows(12, 1, role="selection"))
    test = colour_rows(24, 2)
    before_engine = Engine.from_pretrained(str(qwen_dir), readout="symbols")
    before = accuracy(before_engine, test)
    frozen = _vision_state(before_engine.runner.model)
    result = train(TrainConfig(data=str(data), output=str(tmp_path / "out"), model=str(qwen_dir), method="full",
                               lr=3e-3, epochs=4, batch_tokens=2048, max_batch_size=8, selection=str(sel),
                               permute=False, flip_rate_rows=0, progress=False), evaluation_index=EvaluationIndex())
    trained = Engine.from_pretrained(str(tmp_path / "out"))
    after = accuracy(trained, test)
    assert after >= 0.9 and after > before, (before, after)
    for n, p in vision_parameters(trained.runner.model):
        assert torch.equal(p, frozen[n]), n  # the vision tower and projector did not move
    assert result.training["epochs"][-1]["selection"]["accuracy"] >= 0.9


@pytest.mark.parametrize("train_vision", [False, True])
def test_lora_adapter_on_a_vlm_reloads_with_its_processor(tmp_path, qwen_dir, train_vision):
    data = write(tmp_path / "train.jsonl", colour_rows(16, 3))
    sel = write(tmp_path / "sel.jsonl", colour_rows(4, 7, role="selection"))
    out = train(TrainConfig(data=str(data), output=str(tmp_path / "lora"), model=str(qwen_dir), lora_r=4,
                            lora_alpha=8, lr=1e-2, batch_tokens=2048, max_steps=2, selection=str(sel),
                            flip_rate_rows=4, train_vision=train_vision, progress=False),
                evaluation_index=EvaluationIndex())
    assert set(out.training["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert out.training["final"]["permutation"]["flip_rate"] is not None  # the flip-rate engine reads images
    adapted = [n for n, _ in out.model.named_parameters() if n.endswith("lora_A.default.weight")]
    in_vision = [n for n in adapted if ".visual." in n]
    # Qwen2-VL's vision blocks name their layers qkv / proj / fc1 / fc2: adapted only with train_vision
    assert bool(in_vision) == train_vision and any(".language_model.layers." in n for n in adapted)
    _, processor, tokenizer = build("qwen2_vl")
    merged = out.model.merge_and_unload()
    mem = Engine.from_model(merged, tokenizer, processor=processor, readout="symbols")
    loaded = Engine.from_pretrained(str(tmp_path / "lora"))
    assert loaded.runner.supports_images
    base = dict(vision_parameters(Engine.from_pretrained(str(qwen_dir)).runner.model))
    moved = any(not torch.equal(p, base[n]) for n, p in vision_parameters(loaded.runner.model))
    assert moved == train_vision
    rows = colour_rows(4, 4)
    for x, y in zip(mem.decide_batch(rows), loaded.decide_batch(rows)):
        for f in ("c", "n"):
            for k, p in x.answers[f].probabilities.items():
                assert abs(p - y.answers[f].probabilities[k]) < 1e-6


def test_evaluation_images_never_feed_training(tmp_path):
    from noulengine.eval.suites.registry import get_suite
    from noulengine.train import TrainingDataError
    from noulengine.train.contamination import build_evaluation_index
    from noulengine.train.data import load_training_rows

    index = build_evaluation_index()
    assert index.suites["shapes"]["rows"] == 48 and len(index.images) == 48
    copied = get_suite("shapes").prepared_dir / "images" / "shape_007.png"
    (tmp_path / "shape.png").write_bytes(copied.read_bytes())
    from PIL import Image

    with Image.open(copied) as im:  # the same pixels, other bytes: re-encoded at another compression level
        im.save(tmp_path / "resaved.png", format="PNG", compress_level=9)
        im.convert("RGBA").save(tmp_path / "rgba.png")
    assert (tmp_path / "resaved.png").read_bytes() != copied.read_bytes()
    for name in ("shape.png", "resaved.png", "rgba.png"):
        rows = colour_rows(2, 5)
        rows[1]["images"] = [name]  # a copied test image under a new name
        with pytest.raises(TrainingDataError, match=r"images\[0\].*evaluation suite 'shapes'") as err:
            load_training_rows(write(tmp_path / "t.jsonl", rows), index=index)
        assert err.value.errors[0].field == "images[0]"
    # the suite's shared state text alone is not evidence: a new image with it trains
    rows = colour_rows(1, 6)
    rows[0]["state"] = {"task": "Look at the image and answer about the shapes drawn on it."}
    assert len(load_training_rows(write(tmp_path / "ok.jsonl", rows), index=index)) == 1


def test_undecodable_training_image_is_listed_with_its_row(tmp_path):
    """A JPEG cut short passes the header check; the overlap guard decodes it and must report the
    row (id, field images[1], file, line) among the training errors, not raise on its own."""
    from PIL import Image

    from noulengine.train import TrainingDataError
    from noulengine.train.contamination import EvaluationIndex
    from noulengine.train.data import load_training_rows

    import io

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(buf, format="JPEG")
    (tmp_path / "cut.jpg").write_bytes(buf.getvalue()[:-600])
    rows = colour_rows(2, 8)
    rows[1]["images"] = [rows[1]["images"][0], "cut.jpg"]
    index = EvaluationIndex()
    index.add("some-suite", "x", "y", ("0" * 64,))  # one indexed image: the guard decodes training images
    with pytest.raises(TrainingDataError) as err:
        load_training_rows(write(tmp_path / "t.jsonl", rows), index=index)
    (only,) = err.value.errors
    assert (only.record_id, only.field, only.line) == (rows[1]["id"], "images[1]", 2)
