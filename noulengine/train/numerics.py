"""CPU float32 numerics for training: ``native`` (the fastest kernels this CPU has) or ``portable``
(kernels whose results do not depend on the CPU model), and a record of which ran.

Why: a float32 CPU training run is reproducible byte for byte on one host, not across hosts. The
v2 recipe's first loss is 6.349981 on this project's AMD EPYC (Zen 4, AVX-512) host, 6.349974 there
with ``ATEN_CPU_CAPABILITY=avx2``, and 6.349978 in the shipped adapter's record (another host), so
652 updates later the adapters differ in their last bits (docs/training.md). Four parts of torch
pick their kernels from the CPU at run time:

- ATen's vectorised kernels (softmax, norms, activations, reductions) dispatch on
  ``ATEN_CPU_CAPABILITY`` (``default`` | ``avx2`` | ``avx512``; torch's
  ``aten/src/ATen/native/DispatchStub.cpp``). ``default`` runs the one generic build on every
  x86-64 CPU.
- Intel MKL's sgemm (torch's CPU matmul) picks a code path per CPU. Its Conditional Numerical
  Reproducibility mode ``MKL_CBWR=COMPATIBLE`` runs one SSE2 path that gives the same results on
  Intel and non-Intel CPUs (Intel oneMKL Developer Guide, "Obtaining Numerically Reproducible
  Results"). Measured here: on this AMD host MKL takes only ``COMPATIBLE``; ``MKL_CBWR=AVX2``
  falls back to ``AUTO`` (``mkl_cbwr_get`` returns 2) and changes nothing.
- oneDNN dispatches on ``ONEDNN_MAX_CPU_ISA``; ``SSE41`` is its most basic x86-64 level.
- MKL's vector math (VML) computes ``torch.sqrt`` on float32 tensors: not correctly rounded
  (2 of 7 values differ from numpy's ``sqrt`` here), and CPU-dependent even with
  ``MKL_CBWR=COMPATIBLE`` (another result under QEMU emulating an Intel Haswell). AdamW's
  for-loop step takes ``exp_avg_sq.sqrt()`` from it, so a portable run uses torch's fused AdamW,
  whose kernel uses the CPU's correctly rounded sqrt instruction (the trainer).

``portable`` sets the first three and the trainer takes the fused AdamW. Checked with QEMU's
user-mode emulation of an Intel Haswell (``qemu-x86_64 -cpu Haswell``) against this AMD host: a
3-update run of a 2-layer Llama gives the same adapter bytes, and SmolLM2-135M with the recipe's
LoRA the same logits, gradients and weights after two steps (docs/training.md). The thread count
still changes the last bits (tests/test_train_numerics.py), so a resume must repeat it and the
recipe pins it. Cost, on the v2 recipe (2 updates, an AMD EPYC host): 2.2x the update time of
``native`` at one thread, 1.2x at two threads against native at one. On an Intel Xeon host with
AVX-512 (two threads, the v4 mix's first 6 updates) 4.4x: MKL's COMPATIBLE sgemm runs SSE2 code
there (docs/training.md#cpu-numerics-native-and-portable). The settings must be in the environment
before torch runs a kernel, which is why ``noulengine train --numerics portable`` sets them before
importing torch, and a process that already imported torch without them is refused instead of
silently mixing kernels.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

MODES = ("native", "portable")
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
# mkl_cbwr_get's return values (mkl_types.h: MKL_CBWR_BRANCH_OFF 1 = CNR off, MKL_CBWR_AUTO 2, MKL_CBWR_COMPATIBLE 3, ...)
_MKL_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX",
                 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}


def apply(mode: str) -> None:
    """Put ``mode``'s settings into this process's environment, before torch runs a kernel.

    Args:
        mode: ``native`` (nothing is set: whatever the environment says) or ``portable``
            (:data:`PORTABLE_ENV`).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
        RuntimeError: ``portable`` was asked for, torch is already imported, and the environment
            did not already hold the portable settings: the kernels may already be chosen, so the
            run could mix both (set the variables before starting Python, or use the CLI flag).
    """
    if mode not in MODES:
        raise ValueError(f"numerics must be one of {list(MODES)}, got {mode!r}")
    if mode == "native":
        return
    missing = {k: v for k, v in PORTABLE_ENV.items() if os.environ.get(k, "").lower() != v.lower()}
    if missing and "torch" in sys.modules:
        raise RuntimeError("numerics portable: torch is already imported in this process, so its CPU kernels may "
                           "already be chosen; set " + " ".join(f"{k}={v}" for k, v in PORTABLE_ENV.items())
                           + " before starting Python (or run `noulengine train --numerics portable`)")
    os.environ.update(missing)


def _mkl_branch() -> str | None:
    """MKL's code path in effect (``mkl_cbwr_get(MKL_CBWR_BRANCH)`` from torch's statically linked
    MKL); None when torch has no such symbol (a build without MKL)."""
    import torch

    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(lib)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    value = get(1)
    return _MKL_BRANCHES.get(value, str(value))


def _cpu_model() -> str | None:
    """The CPU's vendor and model name from ``/proc/cpuinfo``; None where there is none."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    parts = [fields.get("vendor_id"), fields.get("model name")]
    return " ".join(p for p in parts if p) or None


def report() -> dict:
    """What decided this process's float32 CPU results, for ``training.json``.

    Returns:
        ``{"mode", "cpu_capability", "mkl_cbwr", "onednn_max_cpu_isa", "threads", "cpu"}``: ``mode`` is
        ``portable`` when ATen runs its ``DEFAULT`` kernels and MKL its ``COMPATIBLE`` path with
        oneDNN capped at SSE4.1, else ``native``; ``cpu_capability`` is
        ``torch.backends.cpu.get_cpu_capability()``; ``mkl_cbwr`` MKL's branch in effect (None
        without MKL); ``threads`` torch's intra-op threads; ``cpu`` the vendor and model name.
    """
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    mkl = _mkl_branch()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA")
    portable = (capability == "DEFAULT" and mkl in ("COMPATIBLE", None)
                and (onednn or "").upper() == PORTABLE_ENV["ONEDNN_MAX_CPU_ISA"])
    return {"mode": "portable" if portable else "native", "cpu_capability": capability, "mkl_cbwr": mkl,
            "onednn_max_cpu_isa": onednn, "threads": torch.get_num_threads(), "cpu": _cpu_model()}


def check(mode: str, effective: dict | None = None) -> dict:
    """Raise unless the kernels in effect are ``mode``'s; returns :func:`report`'s dict.

    Raises:
        RuntimeError: ``portable`` was asked for and is not what runs (names the setting that is not).
    """
    effective = effective or report()
    if mode == "portable" and effective["mode"] != "portable":
        raise RuntimeError(f"numerics portable asked for, but ATen runs {effective['cpu_capability']} kernels, "
                           f"MKL's branch is {effective['mkl_cbwr']} and ONEDNN_MAX_CPU_ISA is "
                           f"{effective['onednn_max_cpu_isa']}; want DEFAULT, COMPATIBLE and SSE41 "
                           "(set before torch is imported)")
    return effective
