"""Torch CPU threads: ``NOULENGINE_THREADS``, or a default that fits the cores this process may use.

torch's own default is one thread per core of the machine (hardware threads on some builds),
whatever share of it the process is given: a container limited to 2 CPUs of a 64-core host
runs 32+ threads, and N evaluation workers on one machine each take every core. Both
oversubscribe the CPU, and oversubscribed intra-op threads spin and wait on each other: on this
project's 2-core machine, loaded by another job, one ``Engine.decide`` of the README example took
7.5-13.6 s with torch's default threads against 1.2-1.8 s with one thread.

The default here (``auto``) is the physical cores this process may run on (its CPU affinity,
hyperthread siblings counted once, capped by a cgroup CPU quota), shared among the processes that
run side by side on one machine (``eval --workers N``: ``cores // N`` each, at least 1). Ray actors
run ``--cpus-per-actor`` threads each (:mod:`noulengine.distributed.ray_data`).
``NOULENGINE_THREADS=N`` overrides it everywhere (the commands and the Python engine); without it,
a set ``OMP_NUM_THREADS`` (torch's own variable) is kept.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from noulengine import envs


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by a cgroup quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``); None without one."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """Physical cores this process may run on: its CPU affinity with hyperthread siblings counted
    once (``/sys/devices/system/cpu/cpu*/topology``), capped by a cgroup CPU quota; at least 1."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # no topology (not Linux): every CPU a core
    n = len(cores) or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, math.floor(limit)))
    return max(1, n)


def resolve_threads(workers: int | None = None) -> dict:
    """The thread count a command should run, and why.

    Args:
        workers: processes that share this machine (``eval --workers N``); None or 1: one.

    Returns:
        ``{"threads", "source", "usable_cores", "workers"}``: ``source`` is ``"NOULENGINE_THREADS"``
        when the variable is set, ``"OMP_NUM_THREADS"`` when only that one is (torch's own
        variable: a per-process count the user already chose), else ``"auto"``
        (``usable_cores // workers``, at least 1).

    Raises:
        ValueError: ``NOULENGINE_THREADS`` is neither a positive integer nor ``auto``.
    """
    workers = max(1, int(workers or 1))
    cores = usable_cores()
    explicit = envs.num_threads()
    if explicit is not None:
        return {"threads": explicit, "source": "NOULENGINE_THREADS", "usable_cores": cores, "workers": workers}
    omp = _positive_int(os.environ.get("OMP_NUM_THREADS"))
    if omp is not None:
        return {"threads": omp, "source": "OMP_NUM_THREADS", "usable_cores": cores, "workers": workers}
    return {"threads": max(1, cores // workers), "source": "auto", "usable_cores": cores, "workers": workers}


def _positive_int(value) -> int | None:
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if n >= 1 else None


def busy_note(info: dict) -> str | None:
    """A one-line hint when other work already fills the cores this process was given (1-minute
    load average >= usable cores) and it runs more than one thread of its own choosing."""
    if info["source"] != "auto" or info["threads"] <= 1:
        return None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    if load < info["usable_cores"]:
        return None
    return (f"note: the CPU is busy (1-minute load average {load:.1f} on {info['usable_cores']} cores) and torch runs "
            f"{info['threads']} threads; where other work shares the CPU, NOULENGINE_THREADS=1 can be several times "
            "faster")


def configure_threads(workers: int | None = None, *, note: bool = True) -> dict:
    """Set torch's intra-op threads for this process (see :func:`resolve_threads`) and return the
    setting, with ``threads`` as torch reports it afterwards; prints :func:`busy_note` to stderr.

    Raises:
        ValueError: a bad ``NOULENGINE_THREADS``.
    """
    import torch

    info = resolve_threads(workers)
    torch.set_num_threads(info["threads"])
    info["threads"] = torch.get_num_threads()
    hint = busy_note(info) if note else None
    if hint:
        print(hint, file=sys.stderr)
    return info


def apply_env_threads() -> int | None:
    """Apply ``NOULENGINE_THREADS`` when it is set (the Python engine: without it, the host
    program keeps torch's threads); returns the count set, or None."""
    n = envs.num_threads()
    if n is None:
        return None
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def cli_threads(workers: int | None = None) -> dict:
    """:func:`configure_threads` for a command: a bad ``NOULENGINE_THREADS`` ends it with exit
    status 2 and a one-line error."""
    try:
        return configure_threads(workers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
