"""korch's native transpose (Note [Native transpose]) against TVM's kernel for the same
graph, alone, per shape: medians of 7 blocks of 100 ms (us). TVM builds with its
default tile config here, not the tiling model's, so its times are an upper bound on
what an optimization measures.

    .venv/bin/python benchmarks/native_transpose.py --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from test_library_backends import feeds_for, kernel_of  # noqa: E402
from test_native_transpose import _transpose  # noqa: E402

from korch.kernels.registry import get_backend  # noqa: E402

CASES = [
    ((1, 16384, 128), (0, 2, 1)),  # segformer_b1's first stage: tokens -> channels
    ((1, 128, 16384), (0, 2, 1)),  # ... and back
    ((1, 4096, 256), (0, 2, 1)),
    ((1, 197, 3, 64), (0, 2, 1, 3)),  # attention heads
    ((1, 3136, 96), (0, 2, 1)),
]


def time_us(kernel, args) -> float:
    ts = []
    with kernel.timed() if hasattr(kernel, "timed") else contextlib.nullcontext():
        for _ in range(7):
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < 0.1:
                kernel(args)
                n += 1
            ts.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backends", nargs="+", default=["native", "tvm"])
    a = ap.parse_args()
    print(f"| transpose | {' | '.join(a.backends)} |\n|---|{'---|' * len(a.backends)}")
    for shape, perm in CASES:
        kg, consts = kernel_of(_transpose(shape, perm))
        feeds = feeds_for(kg, consts)
        args = [feeds[n] for n in kg.inputs]
        row = []
        for name in a.backends:
            k = get_backend(name).build(kg, consts, a.threads)
            k.set_threads(a.threads)
            row.append(f"{time_us(k, args):.1f}")
        print(f"| {list(shape)} {perm} | {' | '.join(row)} |")


if __name__ == "__main__":
    main()
