"""Timing device kernels (the ``cuda`` target; Note [Device kernels]).

Inputs are moved to the device once; each sample launches the kernel enough times to
last ``min_sample_ms`` and is timed with CUDA events (device time, launches queued
back to back) after a warm-up that also triggers Triton's JIT compile. Without a GPU
(Triton's interpreter) samples are host wall time on CPU torch tensors.
"""

from __future__ import annotations

import numpy as np

from korch.kernels import device as D
from korch.profile.timing import time_kernel


def is_device_kernel(kernel) -> bool:
    return bool(getattr(kernel, "device_kernel", False))


def time_device_kernel(kernel, args: list[np.ndarray], warmup: int, repeat: int, min_sample_ms: float) -> list[float]:
    """Per-launch times in microseconds, ``repeat`` samples."""
    dev = kernel.device
    xs = [D.to_device(a, dev) for a in args]
    run = kernel.run_device
    for _ in range(max(1, warmup)):
        run(xs)
    D.synchronize(dev)
    if not dev.startswith("cuda"):  # the interpreter on the host: wall-clock timing
        return time_kernel(run, xs, 1, repeat, min_sample_ms)
    torch = D.torch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run(xs)
    end.record()
    end.synchronize()
    one_ms = max(start.elapsed_time(end), 1e-4)
    inner = max(1, min(10_000, int(min_sample_ms / one_ms)))
    times = []
    for _ in range(repeat):
        start.record()
        for _ in range(inner):
            run(xs)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner * 1e3)
    return times
