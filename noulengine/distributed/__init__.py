"""Decide and evaluate on a Ray cluster with Ray Data (the optional ``ray`` extra).

``pip install -e '.[ray]'``. See :mod:`noulengine.distributed.ray_data` and docs/evaluation.md.
"""

from noulengine.distributed.ray_data import RayConfig, RayDecider, decide_dataset, decide_requests, iter_decisions

__all__ = ["RayConfig", "RayDecider", "decide_dataset", "decide_requests", "iter_decisions"]
