"""``noulengine bench`` flags, kept free of torch (``--help`` answers at once); the bench itself
is :mod:`noulengine.bench.runner`."""

from __future__ import annotations

import argparse
import sys

from noulengine.bench.configs import MODEL_CONFIGS
from noulengine.bench.peer import PEER


def parse_args(argv):
    p = argparse.ArgumentParser(prog="noulengine bench", description=(
        "The engine against the two baselines a user would write by hand (naive per-question forwards, padded "
        "batches), and a same-model peer library where installed; prints the table and writes it (JSON and "
        "Markdown) with the device, dtype and torch threads."))
    p.add_argument("--quick", action="store_true",
                   help="smaller workloads, one repetition (on an idle 2-core CPU, 2 threads, the peer included: 215 s; "
                        "20 min was measured on a shared one; a line per variant and repetition shows progress)")
    p.add_argument("--model", default=None, help="model directory or .gguf (default: the embedded default model)")
    p.add_argument("--model-config", choices=sorted(MODEL_CONFIGS), default=None,
                   help="random-weight Llama-style model at this config's size (tokenizer from --model)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--attn", choices=("sdpa", "flex"), default="sdpa", help="engine attention (flex: CUDA only)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per variant (default 1 quick, 2 full)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: NOULENGINE_THREADS, else "
                   "the physical cores this process may use)")
    p.add_argument("--output", default=None,
                   help="JSON result path, a .md table is written beside it (default bench-results/bench.json, or layouts.json with --layouts; "
                        "git-ignored)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="padded tokens per forward pass for the engine and the padded batches (default the "
                        "engine's, 8192)")
    p.add_argument("--workloads", default=None,
                   help="comma-separated workloads to run (default all: typed_decisions, long_state_16q, "
                        "long_state_32q, agnews_1q)")
    p.add_argument("--peer", choices=("auto", "on", "off"), default="auto",
                   help=f"the peer variant on AG News ({PEER} from PyPI, same weights): auto runs it when installed "
                        "(default auto; on: exit 2 when it is not installed)")
    p.add_argument("--probe", choices=("reverse",), default=None,
                   help="reverse: after timing, answer every workload once more with each choice question's options "
                        "reversed (untimed) and report the share of answers that change (as eval --probe reverse)")
    p.add_argument("--layouts", action="store_true",
                   help="compare the prompt layouts instead: state-first and schema-first, each warm (the "
                        "workload's questions already cached) and cold (new questions every request), interleaved, "
                        "on agnews_1q (with the peer), typed_decisions and tickets_3q (--workloads picks among "
                        "them); writes bench-results/layouts.{json,md} unless --output is given")
    p.add_argument("--adapters", action="store_true",
                   help="several LoRA adapters on one base instead: the default adapter merged against the same "
                        "adapter loaded unmerged under 1, 2 and 4 names, rows routed round-robin in mixed batches, "
                        "interleaved, on agnews_1q and tickets_3q (--workloads picks among them); writes "
                        "bench-results/adapters.{json,md} unless --output is given (docs/adapters.md)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="max allowed probability difference (default 1e-4 float32, 2e-2 otherwise)")
    return p.parse_args(argv)



def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Parse the flags (``--help`` needs no torch), then run :func:`noulengine.bench.runner.run`."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from noulengine.bench.runner import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
