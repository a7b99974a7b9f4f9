"""Rendered shapes: 48 images with exactly known counts, positions and colours (no source data).

Each 64x64 image has a white background and 1 to 4 filled shapes (circle, square, triangle),
each in its own quadrant, each red, green, blue or yellow, drawn from ``random.Random(SEED)``.
Three questions per image, answered from the drawing itself:

- ``count`` (score, levels 0..4, so the level is the count; 0 never occurs): how many shapes;
- ``red`` (noul): whether any shape is red;
- ``top_left`` (choice): the shape in the top-left quadrant, or ``empty``.

Images are written as uncompressed PNG (``compress_level=0``: stored deflate blocks, so the
bytes do not depend on the zlib build) under ``prepared/images/``; records name them by a path
relative to the records file, the way any records file names local images.
"""

from __future__ import annotations

import random
from pathlib import Path

from noulengine.eval.suites.hashing import short_id, write_jsonl

SOURCE_FILES: tuple[str, ...] = ()  # procedural: nothing is read
SEED = 0
N_IMAGES = 48
IMAGE_NAMES = tuple(f"images/shape_{i:03d}.png" for i in range(N_IMAGES))
OUTPUT = ("shapes.jsonl",) + IMAGE_NAMES  # every file is pinned in the manifest
SIZE = 64
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 70, 220), "yellow": (240, 200, 20)}
SHAPES = ("circle", "square", "triangle")
QUADRANTS = ("top_left", "top_right", "bottom_left", "bottom_right")

QUESTIONS = {
    "count": {"type": "score", "instructions": "How many shapes are in the image?",
              "criteria": ["no shapes", "one shape", "two shapes", "three shapes", "four shapes"]},
    "red": {"type": "noul", "instructions": "Is any shape in the image red?"},
    "top_left": {"type": "choice", "instructions": "Which shape is in the top-left quarter of the image?",
                 "criteria": {"circle": "A filled circle.", "square": "A filled square.",
                              "triangle": "A filled triangle.", "empty": "Nothing: only white background."}},
}


def draw(shapes: list[tuple[str, str, str]]):
    """A ``PIL.Image`` with ``(shape, colour, quadrant)`` drawn, one per quadrant."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    d = ImageDraw.Draw(im)
    half = SIZE // 2
    for shape, colour, quadrant in shapes:
        x0 = half * (QUADRANTS.index(quadrant) % 2) + 5
        y0 = half * (QUADRANTS.index(quadrant) // 2) + 5
        box = (x0, y0, x0 + half - 11, y0 + half - 11)
        fill = COLOURS[colour]
        if shape == "circle":
            d.ellipse(box, fill=fill)
        elif shape == "square":
            d.rectangle(box, fill=fill)
        else:
            d.polygon([((box[0] + box[2]) // 2, box[1]), (box[0], box[3]), (box[2], box[3])], fill=fill)
    return im


def scenes(seed: int = SEED, n: int = N_IMAGES) -> list[list[tuple[str, str, str]]]:
    """``n`` scenes of 1..4 ``(shape, colour, quadrant)`` triples, counts balanced (n/4 each)."""
    rng = random.Random(seed)
    counts = [1 + i % 4 for i in range(n)]
    rng.shuffle(counts)
    out = []
    for k in counts:
        quadrants = rng.sample(QUADRANTS, k)
        out.append([(rng.choice(SHAPES), rng.choice(list(COLOURS)), q) for q in quadrants])
    return out


def make_record(index: int, shapes, image_path: str) -> dict:
    """One canonical record: the image, a short state, three questions and their gold answers."""
    top_left = next((s for s, _, q in shapes if q == "top_left"), "empty")
    red = "yes" if any(c == "red" for _, c, _ in shapes) else "no"
    count = str(len(shapes))  # score labels are the level numbers
    return {"id": short_id(f"vision-v1/shapes:{index}"),
            "state": {"task": "Look at the image and answer about the shapes drawn on it."},
            "images": [image_path],
            "questions": QUESTIONS,
            "targets": {"count": {"label": count}, "red": {"label": red}, "top_left": {"label": top_left}},
            "category": "vision_shapes"}


def prepare(source_dir: Path, out_dir: Path) -> Path:
    """Render the images into ``out_dir/images/`` and write ``out_dir/shapes.jsonl``."""
    images = Path(out_dir) / "images"
    images.mkdir(parents=True, exist_ok=True)
    records = []
    for i, shapes in enumerate(scenes()):
        name = IMAGE_NAMES[i]
        draw(shapes).save(Path(out_dir) / name, format="PNG", compress_level=0)
        records.append(make_record(i, shapes, name))
    return write_jsonl(Path(out_dir) / OUTPUT[0], records)
