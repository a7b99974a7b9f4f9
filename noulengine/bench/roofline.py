"""Roofline inputs: peak memory during a block, a measured matmul peak and the parameters that
count towards FLOPs.

Units: bytes, FLOP/s. Achieved FLOP/s counts 2 x non-embedding parameters x the tokens a variant
computed (served minus prefix-cache hits; no attention or head FLOPs), as a share of the square-
matmul peak measured in the same run, dtype and device.
"""

from __future__ import annotations

import threading
import time

import torch

from noulengine.bench.variants import _sync


class PeakMemory:
    """Peak memory during a block: CUDA max_memory_allocated, else sampled process RSS (bytes)."""

    def __init__(self, device: torch.device, interval_s: float = 0.002):
        self.device, self.interval_s, self.peak = device, interval_s, 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        import psutil

        proc = psutil.Process()
        self._stop = threading.Event()

        def sample():
            while not self._stop.is_set():
                self.peak = max(self.peak, proc.memory_info().rss)
                self._stop.wait(self.interval_s)

        self.peak = proc.memory_info().rss
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self._stop.set()
            self._thread.join()


def matmul_peak(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] = (2048, 3072), reps: int = 5) -> float:
    """Measured peak FLOP/s of square matmuls: the best of ``reps`` timed ``n x n x n`` products
    (after 2 warm-ups) over ``sizes``. The best, not the median: a peak is what the machine
    reached, and a median taken while the CPU was briefly busy understated it (a quick run on
    this 2-core CPU once reported engine shares above 100%)."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        for i in range(reps + 2):
            _sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            if i >= 2:
                best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def non_embedding_params(model) -> int:
    """Parameters minus the input embedding and (when untied) the output head."""
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    return total - emb.numel() - (0 if head.data_ptr() == emb.data_ptr() else head.numel())

