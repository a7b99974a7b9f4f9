"""Experiment behind docs/vision.md#measured ("Measured"); reproduce: `python experiments/vision_shapes_experiment.py --output runs/vision-shapes`.

Does the image path learn? Train a small random-init Qwen2-VL on rendered shapes, then score it
on the vision-v1 ``shapes`` suite (no vision-language checkpoint is installable offline here).

Training scenes come from the suite's own renderer with other seeds (``--train-seed``,
``--selection-seed``; the suite is seed 0), so no test image feeds training (the trainer's
evaluation-overlap guard also refuses any image with a test image's pixels). The model is built from a config with
random weights (language model and vision tower), trained with ``method=full`` and
``train_vision`` (a random vision tower has nothing to keep frozen), then evaluated by
``python -m noulengine.eval --suite vision-v1``.

    python experiments/vision_shapes_experiment.py --output runs/vision-shapes   # 753 s training on 2 CPU cores
    ... --permute false        # choice options in criteria order
    ... --image-side 112       # 16 image tokens per image instead of 4

Results: docs/vision.md#measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _suite_module():
    path = REPO / "benchmarks" / "vision-v1" / "shapes" / "prepare.py"
    spec = importlib.util.spec_from_file_location("shapes_prepare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_scenes(folder: Path, seed: int, n: int, role: str | None) -> Path:
    """Render ``n`` scenes with ``seed`` into ``folder`` (images + records.jsonl)."""
    m = _suite_module()
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, shapes in enumerate(m.scenes(seed=seed, n=n)):
        name = f"images/s{seed}_{i:05d}.png"
        m.draw(shapes).save(folder / name, format="PNG")
        rec = m.make_record(i, shapes, name)
        rec["id"] = f"shapes-train-s{seed}-{i}"
        if role:
            rec["validation_role"] = role
        rows.append(rec)
    path = folder / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", default="runs/vision-shapes")
    ap.add_argument("--train-rows", type=int, default=2000)
    ap.add_argument("--train-seed", type=int, default=1)
    ap.add_argument("--selection-seed", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--image-side", type=int, default=56, help="images are resized to side x side pixels "
                    "(multiples of 28; 56: 4 image tokens, 112: 16)")
    ap.add_argument("--permute", choices=["true", "false"], default="true",
                    help="permute choice options per row and epoch (the trainer's augmentation)")
    args = ap.parse_args()

    from noulengine.train import TrainConfig, train
    from tests.vision_models import build

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pixels = args.image_side ** 2
    model, processor, _ = build("qwen2_vl", hidden=args.hidden, layers=args.layers, min_pixels=pixels,
                                max_pixels=pixels)
    base = out / "base"
    model.save_pretrained(base)
    processor.save_pretrained(base)
    data = write_scenes(out / "train", args.train_seed, args.train_rows, None)
    sel = write_scenes(out / "selection", args.selection_seed, 96, "selection")
    result = train(TrainConfig(data=str(data), output=str(out / "trained"), model=str(base), method="full",
                               train_vision=True, lr=args.lr, epochs=args.epochs, batch_tokens=4096,
                               max_batch_size=16, selection=str(sel), permute=args.permute == "true", flip_rate_rows=0,
                               progress=False))
    train_s = time.perf_counter() - t0
    print(json.dumps({"train_s": round(train_s, 1), "epochs": result.training["epochs"]}, indent=1), flush=True)
    for name in ("base", "trained"):
        subprocess.run([sys.executable, "-m", "noulengine.eval", "--suite", "vision-v1", "--model", str(out / name),
                        "--output", str(out / f"eval-{name}"), "--no-plots", "--no-progress"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
