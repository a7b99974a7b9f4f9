"""Ray Data inference: one :class:`~noulengine.Engine` per actor, ``Dataset.map_batches`` over requests.

The same code runs on a laptop (``ray.init()`` starts a local cluster), one multi-GPU node, or a
Ray cluster (``ray.init(address="ray://head:10001")`` or ``address="auto"`` on a cluster node).

Rows carry ``index`` (the input position) and ``request`` (a pickled :class:`Request` or JSON
object). Each actor (:class:`RayDecider`) builds its engine once and answers a batch of
``batch_size`` rows with ``Engine.decide_batch``, which still packs them into forward passes under
its token budget; a bad request becomes an error row there, never an exception that loses the
batch. Results are re-ordered by ``index`` and checked to hold every input row exactly once.

Fault tolerance is Ray's: Ray Data creates actor-pool actors with ``max_restarts=-1`` and their
tasks with ``max_task_retries=-1`` (its defaults; passing them as remote args is deprecated since
Ray 2.5x), so a killed actor is restarted, its engine rebuilt by the constructor, and the batch
it held is retried; a retried task's output replaces the lost one, so no row is lost or
duplicated (``tests/test_distributed_ray.py`` kills an actor mid-run and checks exactly that).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence


def _require_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError("the Ray path needs Ray Data: pip install -e '.[ray]' (ray[data]>=2.40)") from exc
    return ray


@dataclass
class RayConfig:
    """Where and how wide the Ray path runs.

    Attributes:
        address: a Ray cluster address (``"auto"``, ``"ray://host:10001"``); None starts or joins a
            local cluster (``ray.init()``).
        actors: engine actors (``concurrency`` of ``map_batches``), each holding one model copy.
        num_cpus: CPUs reserved per actor (torch uses that many threads in it).
        num_gpus: GPUs per actor (0 on CPU; 1 for one GPU per actor; a fraction packs actors).
        batch_size: requests handed to one actor call (``map_batches(batch_size=...)``).
        model: the model spec for :meth:`Engine.from_pretrained` (None: the embedded default).
        engine_kwargs: :class:`~noulengine.engine.engine.EngineConfig` fields for every actor.
    """

    address: str | None = None
    actors: int = 1
    num_cpus: float = 1
    num_gpus: float = 0
    batch_size: int = 16
    model: str | None = None
    engine_kwargs: dict = field(default_factory=dict)


class RayDecider:
    """The ``map_batches`` callable class: builds one engine per actor, answers batches.

    Args:
        model: model spec for :meth:`Engine.from_pretrained`.
        engine_kwargs: engine settings.
        num_threads: torch CPU threads in this actor (Ray reserves ``num_cpus`` for it).
    """

    def __init__(self, model: str | None = None, engine_kwargs: dict | None = None, num_threads: int | None = None):
        import torch

        from noulengine.engine.engine import Engine

        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.engine = Engine.from_pretrained(model, **(engine_kwargs or {}))

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Answer one batch.

        Args:
            batch: ``{"index": (B,) int64, "request": (B,) pickled requests}`` (numpy format).

        Returns:
            ``{"index": (B,) int64, "decision": (B,) JSON strings}`` (``Decision.to_dict()``; strict
            JSON, never NaN).
        """
        import numpy as np

        requests = [pickle.loads(bytes(b)) for b in batch["request"]]
        decisions = self.engine.decide_batch(requests, on_error="record")
        out = np.array([json.dumps(d.to_dict(), ensure_ascii=False, allow_nan=False) for d in decisions], dtype=object)
        return {"index": np.asarray(batch["index"], dtype=np.int64), "decision": out}


def init_ray(config: RayConfig):
    """``ray.init`` once (local cluster or ``config.address``); returns the ``ray`` module."""
    ray = _require_ray()
    if not ray.is_initialized():
        ray.init(address=config.address, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    return ray


def decide_dataset(ds, config: RayConfig):
    """Map a Ray Dataset with ``index`` and ``request`` columns to ``index`` and ``decision``.

    Args:
        ds: ``ray.data.Dataset`` of ``{"index": int, "request": bytes (pickle)}`` rows.
        config: actors, resources and model.

    Returns:
        A lazy ``ray.data.Dataset`` of ``{"index", "decision"}`` rows (any order).
    """
    import ray.data

    return ds.map_batches(
        RayDecider,
        fn_constructor_kwargs={"model": config.model, "engine_kwargs": dict(config.engine_kwargs),
                               "num_threads": max(1, int(config.num_cpus)) if not config.num_gpus else None},
        batch_size=config.batch_size, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=config.actors),
        num_cpus=config.num_cpus, num_gpus=config.num_gpus, udf_modifying_row_count=False)


def iter_decisions(requests: Sequence[Any], config: RayConfig) -> Iterator[tuple[int, dict]]:
    """Answer requests on Ray, yielding ``(input index, Decision.to_dict())`` as batches finish
    (in completion order, so a caller can write results while the rest run).

    Args:
        requests: :class:`Request` objects or JSON objects (what ``Engine.decide_batch`` takes).
        config: the Ray settings.

    Raises:
        RuntimeError: after the last batch, when the cluster returned a row count or index set
            other than the input's (not expected, since Ray retries failed tasks; checked so it
            can never pass silently).
    """
    if not requests:
        return
    ray = init_ray(config)
    items = [{"index": i, "request": pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL)} for i, r in enumerate(requests)]
    # at least one block per actor (a small input would otherwise leave actors idle), at most
    # four per actor, and batches no larger than an even share
    share = -(-len(items) // config.actors)
    batch_size = max(1, min(config.batch_size, share))
    blocks = max(1, min(len(items), max(config.actors, min(config.actors * 4, -(-len(items) // batch_size)))))
    ds = ray.data.from_items(items, override_num_blocks=blocks)
    config = dataclasses.replace(config, batch_size=batch_size)
    seen: set[int] = set()
    n_rows = 0
    for batch in decide_dataset(ds, config).iter_batches(batch_size=None, batch_format="numpy"):
        for i, text in zip(batch["index"], batch["decision"]):
            n_rows += 1
            if int(i) in seen:
                raise RuntimeError(f"Ray returned request {int(i)} twice")
            seen.add(int(i))
            yield int(i), json.loads(text)
    if n_rows != len(requests) or len(seen) != len(requests):
        raise RuntimeError(f"Ray returned {n_rows} rows for {len(requests)} requests ({len(seen)} distinct)")


def decide_requests(requests: Sequence[Any], config: RayConfig) -> list[dict]:
    """Answer requests on Ray; returns ``Decision.to_dict()`` dicts in input order (error rows
    included, one per input). Raises as :func:`iter_decisions`."""
    out = dict(iter_decisions(requests, config))
    return [out[i] for i in range(len(requests))]
