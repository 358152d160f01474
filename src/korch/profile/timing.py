"""Timing one compiled kernel: random inputs, warm-up, repeats, median."""

from __future__ import annotations

import statistics
import time

import numpy as np

from korch.ir.graph import Graph
from korch.ir.interp import evaluate
from korch.ir.ops import Op
from korch.kernels.base import aligned_copy


def random_inputs(kgraph: Graph, consts: dict[str, np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """Inputs of a kernel for checking and timing: random values, constants as given.
    Every array is 64-byte aligned, as the executable's are (its constants, its inputs
    and the generated kernels' outputs): a misaligned argument would add a staging
    copy to a generated kernel's measured time, at random (Note [TVM buffer alignment])."""
    rng = np.random.default_rng(seed)
    bounds = _index_bounds(kgraph)
    out = []
    for name, nid in kgraph.inputs.items():
        node = kgraph.nodes[nid]
        if name in consts:
            a = consts[name]
        elif node.dtype == "bool":
            a = rng.random(node.shape) < 0.5
        elif np.issubdtype(np.dtype(node.dtype), np.integer):
            # positions an opaque operator reads stay within its axis (Note [Index operands])
            a = rng.integers(0, max(1, min(4, bounds.get(nid, 4))), node.shape).astype(node.dtype)
        else:
            a = rng.standard_normal(node.shape).astype(node.dtype)
        out.append(aligned_copy(a))
    return out


def _index_bounds(kgraph: Graph) -> dict[int, int]:
    """Kernel inputs read as positions by an opaque operator: the smallest axis size
    they index (``korch.ir.opaque.index_bounds``, Note [Index operands])."""
    from korch.ir.opaque import index_bounds

    inputs = set(kgraph.inputs.values())
    out: dict[int, int] = {}
    for node in kgraph.nodes:
        if node.op is not Op.OPAQUE or not inputs.intersection(node.inputs):
            continue
        for pos, size in index_bounds(node, [kgraph.nodes[i].shape for i in node.inputs]).items():
            src = node.inputs[pos]
            if src in inputs:
                out[src] = min(out.get(src, size), size)
    return out


def check_outputs(kgraph: Graph, args: list[np.ndarray], got: list[np.ndarray], rtol: float = 1e-3) -> str:
    """Compare a kernel's outputs with the reference interpreter; '' when they agree.

    OPAQUE primitives are evaluated by onnxruntime, the backend that runs them."""
    from korch.kernels.ort.opaque_eval import run_opaque_ort

    feeds = dict(zip(kgraph.inputs, args))
    want = evaluate(kgraph, feeds, opaque=run_opaque_ort)
    for (name, w), g in zip(want.items(), got):
        g = np.asarray(g)
        if g.shape != w.shape:
            return f"{name}: shape {g.shape} != {w.shape}"
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w):
                return f"{name}: integer values differ"
            continue
        finite = np.isfinite(w)
        if not np.array_equal(finite, np.isfinite(g)):
            return f"{name}: non-finite values differ"
        scale = float(np.max(np.abs(w[finite]), initial=0.0)) or 1.0
        err = float(np.max(np.abs(g[finite].astype(np.float64) - w[finite]), initial=0.0))
        if err > rtol * scale + 1e-5:
            return f"{name}: max abs error {err:.3g} (scale {scale:.3g})"
    return ""


# past this many samples, a kernel's samples stop once they add up to MAX_SAMPLING_MS:
# a batch-16 Segformer has kernels of 50-200 ms, which took 1-3 s each to measure at 15
# samples, for hundreds of candidates
MIN_SAMPLES = 5
MAX_SAMPLING_MS = 400.0
# a kernel whose call takes this long is warm after one call and has MIN_SLOW_SAMPLES:
# segformer_b16's library regions take 0.3-2 s a call, and 3 warm-ups, a probe and 5
# samples each were most of its 415 s of profiling
SLOW_CALL_MS = 150.0
MIN_SLOW_SAMPLES = 3


def time_kernel(fn, args: list[np.ndarray], warmup: int, repeat: int, min_sample_ms: float) -> list[float]:
    """Per-call times in microseconds: ``repeat`` samples, each averaging enough calls
    to last ``min_sample_ms`` (so microsecond kernels are not timer noise); slow kernels
    stop after ``MIN_SAMPLES`` once sampling has taken ``MAX_SAMPLING_MS``, and a call
    over ``SLOW_CALL_MS`` needs one warm-up and ``MIN_SLOW_SAMPLES``."""
    fn(args)
    one = 0.0
    for _ in range(max(1, warmup)):  # the first call above is the first warm-up
        t0 = time.perf_counter()
        fn(args)
        one = max(time.perf_counter() - t0, 1e-7)
        if one * 1e3 > SLOW_CALL_MS:
            break
    min_samples = MIN_SLOW_SAMPLES if one * 1e3 > SLOW_CALL_MS else MIN_SAMPLES
    inner = max(1, int(min_sample_ms * 1e-3 / one))
    times: list[float] = []
    spent = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(args)
        dt = time.perf_counter() - t0
        times.append(dt / inner * 1e6)
        spent += dt
        if len(times) >= min_samples and spent * 1e3 > MAX_SAMPLING_MS:
            break
    return times


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


__all__ = ["Op", "check_outputs", "median", "random_inputs", "time_kernel"]
