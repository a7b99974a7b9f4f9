"""``noulengine bench``: the engine against the baselines a user would write by hand.

The harness, one module per part:

* :mod:`~noulengine.bench.cli`: the flags (no torch: ``--help`` answers at once) and ``main``;
* :mod:`~noulengine.bench.configs`: random-weight model configs and workload names (no torch);
* :mod:`~noulengine.bench.workloads`: what is timed (Typed-Decisions states, one long state asked
  1/16/32 questions, shuffled AG News rows with gold labels);
* :mod:`~noulengine.bench.variants`: ``naive`` and ``batched`` transformers baselines on the
  engine's own compiled prompts, and the ``engine`` itself;
* :mod:`~noulengine.bench.peer`: the ``peer`` variant (anyjev from PyPI, the ``bench`` extra);
* :mod:`~noulengine.bench.roofline`: peak memory, the measured matmul peak, non-embedding
  parameters;
* :mod:`~noulengine.bench.report`: the Markdown table;
* :mod:`~noulengine.bench.runner`: loads the engine, measures each workload, writes the result.

``python -m noulengine.bench`` and ``noulengine bench`` run :func:`main`. The names below are
re-exported lazily, so importing this package (and ``--help``) loads no torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "main": "cli", "parse_args": "cli", "MODEL_CONFIGS": "configs", "WORKLOAD_NAMES": "configs",
    "PEER": "peer", "Peer": "peer", "peer_unavailable": "peer",
    "VARIANTS": "variants", "Prompt": "variants", "Prepared": "variants", "baseline_prompts": "variants",
    "answers_from_terms": "variants", "run_naive": "variants", "run_batched": "variants", "run_engine": "variants",
    "max_prob_diff": "variants",
    "PeakMemory": "roofline", "matmul_peak": "roofline", "non_embedding_params": "roofline",
    "DATA": "workloads", "Workload": "workloads", "QUESTION_COUNTS": "workloads", "long_state_requests": "workloads",
    "AGNEWS_SEED": "workloads", "agnews_rows": "workloads", "build_workloads": "workloads",
    "markdown": "report",
    "run": "runner", "load_engine": "runner", "git_revision": "runner", "accuracy": "runner",
    "measure_workload": "runner", "cost_by_questions": "runner", "percentile": "runner", "order_probe": "runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
