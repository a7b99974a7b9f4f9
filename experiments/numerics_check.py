#!/usr/bin/env python
"""Experiment behind docs/training.md#cpu-numerics-native-and-portable ("CPU numerics: `native` and `portable`"); reproduce: `python experiments/numerics_check.py portable`.

Fingerprint one training computation's float32 results on this CPU, to compare CPUs.

Loads a base model, applies the default recipe's LoRA (top 12 layers, rank 16, alpha 32), and on
one random 64-token row runs a forward pass, a backward pass and ``--steps`` AdamW steps (the
fused AdamW under ``portable``, as ``noulengine train`` uses it). Prints one JSON line: the
sha256 prefixes of the logits, the loss, each step's gradients and the final LoRA weights, and
:func:`noulengine.train.numerics.report`. Two CPUs that print the same hashes computed the same
bits (docs/training.md, "CPU numerics: native and portable").

Usage::

    python experiments/numerics_check.py portable
    qemu-x86_64 -cpu Haswell .venv/bin/python experiments/numerics_check.py portable   # an emulated Intel CPU
    python experiments/numerics_check.py native --model runs/some-model --lora-layers 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from noulengine.train import numerics  # noqa: E402  (no torch yet: the kernels are chosen at first use)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("numerics", choices=numerics.MODES)
    ap.add_argument("--model", default="SmolLM2-135M-Instruct", help="anything noulengine train --model takes")
    ap.add_argument("--lora-layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=2, help="AdamW steps")
    ap.add_argument("--seed", type=int, default=20261201)
    args = ap.parse_args(argv)
    numerics.apply(args.numerics)
    import torch
    import torch.nn.functional as F

    from noulengine.models.loading import load_model
    from noulengine.train.methods import apply_method

    numerics.check(args.numerics)

    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:8]

    torch.manual_seed(args.seed)
    model = apply_method(load_model(args.model, dtype=torch.float32, device="cpu").model, method="lora",
                         lora_r=16, lora_alpha=32, lora_layers=args.lora_layers)
    params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.randint(0, model.config.vocab_size, (1, 64))
    optimizer = torch.optim.AdamW(params, lr=1e-3, fused=(args.numerics == "portable") or None)
    out = {}
    for step in range(args.steps):
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        if step == 0:
            out["logits"], out["loss"] = digest(logits), digest(loss)
        out[f"grads{step}"] = digest(torch.cat([p.grad.flatten() for p in params]))
        optimizer.step()
        optimizer.zero_grad()
    out["lora"] = digest(torch.cat([p.detach().flatten() for p in params]))
    print(json.dumps({"hashes": out, "numerics": numerics.report()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
