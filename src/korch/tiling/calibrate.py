"""Calibration: micro-benchmarks on this machine fit the CPU target's cost formulas.

Note [Calibration]
~~~~~~~~~~~~~~~~~~
Per pipe we time numpy operations against their size and fit the formula of Note
[Target cost formulas] by least squares:

* load: a read-only reduction (``np.add.reduce``) of S bytes; store: ``ndarray.fill``;
  each fitted as ``t = per_call + S / T`` on sizes beyond the L2 (the GM regime),
  once on one thread and once on every core at once (numpy releases the GIL), which
  gives the per-core bandwidth at 1 and at n cores and so ``T = a + b / cores``;
* vector APIs: ``np.add``, ``np.exp``, ... on cache-resident float32 arrays, fitted as
  ``t = per_call + per_elem * n``.

numpy's own dispatch overhead (~1 us) is part of the fitted intercepts: an upper
bound on a generated kernel's per-call cost. When TVM is installed the pipes that
price generated kernels are measured on generated kernels instead (the numpy fits stay
in the file as ``load_numpy``, ``store_numpy``, ``vec_numpy``):

* load and store: a row sum and a broadcast, 256 KiB to 4 MiB (``calibrate_transfer_
  generated``); on this VM one thread reads ~30 B/ns and two threads
  together no more, where numpy's reduction read 12 B/ns -- the numpy fits made every
  kernel look transfer-bound and twice as fast on two cores, so the model chose
  parallel kernels that measured 1.3-2.6x slower than serial ones (the tiling grid
  in benchmarks/RESULTS.md);
* vector APIs: per-element slopes over a copy (``calibrate_vec_generated``);
* launch, per-argument and fork-join terms (``calibrate_launch``).

The result is a JSON file per machine (``target.calibration_path``), read by
``get_target("cpu")``. Run ``python -m korch.tiling.calibrate`` (``--full`` for more
sizes and repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from korch.tiling.target import calibration_path


# --- fits (pure) -------------------------------------------------------------------------
def fit_linear(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y = slope * x + intercept."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    A = np.stack([xa, np.ones_like(xa)], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(A, ya, rcond=None)
    return float(slope), float(intercept)


def fit_transfer(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """(bandwidth in bytes per time unit, per-call cost) of t = per_call + S / bandwidth."""
    slope, intercept = fit_linear(sizes, times)
    return 1.0 / max(slope, 1e-12), max(intercept, 0.0)


def fit_core_scaling(bw_1: float, bw_n: float, n: int) -> tuple[float, float]:
    """(a, b) of per-core bandwidth a + b / cores through (1, bw_1) and (n, bw_n)."""
    if n <= 1:
        return bw_1, 0.0
    b = (bw_1 - bw_n) * n / (n - 1)
    b = max(b, 0.0)
    return max(bw_1 - b, 1e-3), b


def fit_bandwidth_model(samples: dict[int, tuple[Sequence[float], Sequence[float]]]) -> tuple[float, float, float]:
    """(a, b, per_call) from {cores: (sizes, per-core times)}: least squares on 1/T = f(cores)."""
    fits = {c: fit_transfer(s, t) for c, (s, t) in samples.items()}
    cores = sorted(fits)
    per_call = float(np.mean([fits[c][1] for c in cores]))
    if len(cores) == 1:
        return fits[cores[0]][0], 0.0, per_call
    inv_c = [1.0 / c for c in cores]
    b, a = fit_linear(inv_c, [fits[c][0] for c in cores])
    return max(a, 1e-3), max(b, 0.0), per_call


def fit_generated_bandwidth(samples: dict[int, tuple[Sequence[float], Sequence[float]]]) -> tuple[float, float]:
    """(a, b) of per-core bandwidth ``a + b / cores`` from {cores: (bytes, times)} of one
    generated kernel run on that many cores: the slope of time against bytes at ``c``
    cores is 1 / (c * per-core bandwidth); the intercepts (launch, fork-join) belong
    to the launch terms, not the pipe."""
    per_core = {}
    for c, (sizes, times) in samples.items():
        slope, _ = fit_linear(sizes, times)
        per_core[c] = 1.0 / max(slope * c, 1e-12)
    cs = sorted(per_core)
    if len(cs) == 1:
        return per_core[cs[0]], 0.0
    return fit_core_scaling(per_core[cs[0]], per_core[cs[-1]], cs[-1])


def _pipe_entry(a: float, b: float, per_call: float, samples: dict) -> dict:
    """A transfer pipe as the calibration file stores it (one bandwidth regime) with
    its raw {cores: (bytes, times)} samples."""
    return {
        "large": [a, b],
        "small": [a, b],
        "threshold": 0,
        "per_call": per_call,
        "raw": {str(c): [list(map(float, sz)), list(map(float, t))] for c, (sz, t) in samples.items()},
    }


# --- measurements -------------------------------------------------------------------------
def _time_ns(fn: Callable[[], object], repeat: int, min_ns: float = 2e5) -> float:
    """Best per-call time over ``repeat`` rounds of enough calls to last ``min_ns``."""
    fn()
    t0 = time.perf_counter_ns()
    fn()
    once = max(time.perf_counter_ns() - t0, 1)
    inner = max(1, int(min_ns // once))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / inner)
    return best


def _parallel_ns(make: Callable[[], Callable[[], object]], threads: int, repeat: int) -> float:
    """Per-call time of ``threads`` copies of an operation running at once (each its own data)."""
    fns = [make() for _ in range(threads)]
    results = [0.0] * threads
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        barrier.wait()
        results[i] = _time_ns(fns[i], repeat)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return max(results)


def _l2_bytes() -> int | None:
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            if (idx / "level").read_text().strip() == "2":
                text = (idx / "size").read_text().strip().upper()
                mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
                return int(text.rstrip("KM")) * mult
        except (OSError, ValueError):
            continue
    return None


_VEC_OPS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], object]] = {
    "add": lambda x, y, z: np.add(x, y, out=z),
    "mul": lambda x, y, z: np.multiply(x, y, out=z),
    "div": lambda x, y, z: np.divide(x, y, out=z),
    "sqrt": lambda x, y, z: np.sqrt(y, out=z),
    "exp": lambda x, y, z: np.exp(x, out=z),
    "log": lambda x, y, z: np.log(y, out=z),
    "tanh": lambda x, y, z: np.tanh(x, out=z),
    "compare": lambda x, y, z: np.maximum(x, y, out=z),
    "reduce": lambda x, y, z: np.add.reduce(x),
    "copy": lambda x, y, z: np.copyto(z, x),
    "transpose": lambda x, y, z: np.copyto(z.reshape(64, -1), x.reshape(-1, 64).T),
}


def calibrate(target: str = "cpu", quick: bool = True, save: bool = True, path: Path | None = None) -> dict:
    """Measure and fit the CPU target's coefficients; returns (and saves) the JSON dict.

    Precondition: an otherwise idle machine (foreign load inflates every coefficient).
    """
    if target != "cpu":
        raise ValueError("only the cpu target can be calibrated on this machine (cuda: on a lent GPU)")
    repeat = 7 if quick else 11
    cores = os.cpu_count() or 1
    rng = np.random.default_rng(0)
    # transfers beyond the caches (GM regime): 8 MiB .. 64 MiB
    big = [8 << 20, 16 << 20, 32 << 20] if quick else [4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20]
    small = [4 << 10, 16 << 10, 64 << 10, 256 << 10]

    def load_op(nbytes: int) -> Callable[[], Callable[[], object]]:
        def make():
            a = rng.standard_normal(nbytes // 4).astype(np.float32)
            return lambda: np.add.reduce(a)

        return make

    def store_op(nbytes: int) -> Callable[[], Callable[[], object]]:
        def make():
            a = np.empty(nbytes // 4, dtype=np.float32)
            return lambda: a.fill(1.0)

        return make

    out: dict = {
        "machine": {
            "node": platform.node(),
            "processor": platform.processor(),
            "cores": cores,
            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "quick": quick,
        "units": "ns",
    }
    for name, op in (("load", load_op), ("store", store_op)):
        samples: dict[int, tuple[list[float], list[float]]] = {}
        for c in sorted({1, cores}):
            times = [_parallel_ns(op(s), c, repeat) for s in big]
            samples[c] = (big, times)
        # per-call cost from small (cache-resident) transfers, where it is not lost in
        # the noise of multi-millisecond ones; bandwidth from the large ones
        stimes = [_time_ns(op(s)(), repeat) for s in small]
        sbw, spc = fit_transfer(small, stimes)
        per_core = {
            c: float(np.median([s / max(t - spc, 1.0) for s, t in zip(sz, ts)])) for c, (sz, ts) in samples.items()
        }
        cs = sorted(per_core)
        a, b = fit_core_scaling(per_core[cs[0]], per_core[cs[-1]], cs[-1]) if len(cs) > 1 else (per_core[cs[0]], 0.0)
        out[name] = {**_pipe_entry(a, b, spc, samples), "cached_bw": sbw}
    vec: dict[str, list[float]] = {}
    # three float32 arrays of the largest size stay inside a 512 KiB L2
    elems = (
        [1 << 9, 1 << 11, 1 << 13, 1 << 14] if quick else [1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14]
    )
    for api, fn in _VEC_OPS.items():
        times = []
        for n in elems:
            x = rng.standard_normal(n).astype(np.float32)
            y = np.abs(x) + 1.0
            z = np.empty_like(x)
            times.append(_time_ns(lambda fn=fn, x=x, y=y, z=z: fn(x, y, z), repeat, min_ns=2e5))
        pe, pc = fit_linear(elems, times)
        vec[api] = [max(pe, 1e-4), max(pc, 0.0)]
    vec["default"] = vec["add"]
    vec["erf"] = [vec["tanh"][0] * 1.5, vec["tanh"][1]]  # numpy has no erf: assumed
    vec["sigmoid"] = [vec["exp"][0] + vec["div"][0], vec["exp"][1]]
    vec["broadcast"] = vec["copy"]
    vec["select"] = vec["compare"]
    vec["cast"] = vec["copy"]
    out["vec"] = vec
    try:
        # microsecond timings on a VM swing 2-3x between process states: the median of
        # three independent fits
        fits = [calibrate_launch(cores, repeat) for _ in range(3)]
        for key in ("launch", "per_arg", "fork_join"):
            if key in fits[0]:
                out[key] = float(np.median([f[key] for f in fits]))
        out["launch_raw_us"] = [f["launch_raw_us"] for f in fits]
        # the per-element costs of the code korch generates replace numpy's; numpy's
        # per-call constant (~1 us of Python dispatch) is not a cost a generated loop pays
        out["vec"] = {**vec, **calibrate_vec_generated(max(5, repeat))}
        out["vec_numpy"] = vec
        for name, pipe in calibrate_transfer_generated(cores, max(5, repeat)).items():
            out[f"{name}_numpy"] = out[name]
            out[name] = pipe
    except ImportError:  # no TVM: the numpy-based vector costs and default launch terms stay
        pass
    l2 = _l2_bytes()
    if l2:
        out["levels"] = {"l2": l2}
    out["cores"] = cores
    if save:
        dest = path or calibration_path(target)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(out, indent=1))
    return out


def _generated_timer(g, threads: int, parallel: bool, rng: np.random.Generator, **cfg_changes) -> Callable[[], float]:
    """Build ``g`` as a generated TVM kernel (the rule's tiling, ``parallel`` and
    ``cfg_changes`` forced) and return a timer: each call gives the median per-call time
    in us, through ``TvmKernel.__call__`` as the profiler times it, on positive aligned
    inputs."""
    import dataclasses as dc

    from korch.kernels.base import aligned_copy
    from korch.kernels.tvm.backend import TvmBackend, vector_bytes
    from korch.kernels.tvm.tiling import default_tile_config
    from korch.profile.timing import median, random_inputs, time_kernel

    cfg = dc.replace(default_tile_config(g, threads, vector_bytes()), parallel=parallel, **cfg_changes)
    k = TvmBackend().build(g, {}, threads, tile_config=cfg)
    args = [aligned_copy(np.abs(a) + 0.5) for a in random_inputs(g, {}, int(rng.integers(1 << 30)))]
    return lambda: median(time_kernel(k, args, 5, 5, 2.0))


# vector API -> (primitive, arity) for calibrate_vec_generated
_GEN_OPS = {
    "add": ("ADD", 2),
    "mul": ("MUL", 2),
    "div": ("DIV", 2),
    "sqrt": ("SQRT", 1),
    "exp": ("EXP", 1),
    "log": ("LOG", 1),
    "tanh": ("TANH", 1),
    "erf": ("ERF", 1),
    "sigmoid": ("SIGMOID", 1),
    "compare": ("MAX", 2),
}
VEC_CALL_NS = 5.0  # per API call per tile in a generated loop nest (loop set-up), assumed
ADD_NS = 0.05  # a float32 add per element, vectorised 16 wide at ~3 GHz, assumed


def calibrate_vec_generated(rounds: int = 5) -> dict[str, list[float]]:
    """Per-element vector costs (ns, float32) of generated kernels, one thread, data in
    L2: the slope of time against size (a least-squares line over three sizes, each
    the best of ``rounds`` interleaved rounds: ``_interleaved_best``) of
    ``y = op(x[, x2])``, less the slope of a
    copy (``y = -x``) of the same sizes, which carries the loads and stores the model
    prices in its transfer pipes. Rows for ``reduce`` (a row sum), ``transpose`` and
    ``pad``/``pad_reflect`` (a spatial pad inlined into a copy) and ``gather`` (a
    table gather: a nearest upsample)."""
    from korch.ir import GraphBuilder, Op

    rng = np.random.default_rng(0)
    sizes = (4096, 16384, 32768)

    def unary_or_binary(op: str, arity: int, n: int):
        b = GraphBuilder()
        x = b.input("in0", (n // 256, 256), "float32")
        if op == "COPY":
            y = b.unary(Op.NEG, x)
        elif op == "REDUCE":
            y = b.reduce(Op.REDUCE_SUM, x, [1])
        elif op == "TRANSPOSE":
            y = b.transpose(x, (1, 0))
        elif op == "GATHER":
            # a nearest 2x upsample of the last axis (Resize's fission), inlined into a copy
            x = b.input("in0", (n // 64, 32), "float32")
            idx = tuple(i // 2 for i in range(64))
            y = b.unary(Op.NEG, b.add(Op.GATHER, [x], axis=1, indices=idx, indices_shape=(64,)))
        elif op in ("PAD", "PAD_REFLECT"):
            # a spatial pad of 1 around 32 x 32 planes, inlined into a copy
            x = b.input("in0", (n // 1024, 32, 32), "float32")
            mode = {"mode": "constant", "value": 0.0} if op == "PAD" else {"mode": "reflect"}
            p = b.add(Op.PAD, [x], pads=((0, 0), (1, 1), (1, 1)), **mode)
            y = b.unary(Op.NEG, p)
        elif arity == 2:
            y = b.binary(Op[op], x, b.input("in1", (n // 256, 256), "float32"))
        else:
            y = b.unary(Op[op], x)
        b.output("out0", y)
        return b.graph

    ops = {**{op: ar for op, ar in _GEN_OPS.values()}, "COPY": 1}
    ops.update(dict.fromkeys(("REDUCE", "TRANSPOSE", "PAD", "PAD_REFLECT", "GATHER"), 1))
    timers = {}
    for op, arity in ops.items():
        # a padded plane runs as rows of its last axis (Note [Tiling to TileConfig])
        rows = {"parallel_axes": 2, "inner_tile": 0} if op.startswith("PAD") else {}
        for n in sizes:
            timers[(op, n)] = _generated_timer(unary_or_binary(op, arity, n), 1, False, rng, **rows)
    best = _interleaved_best(timers, rounds)

    def slope(op: str, arity: int) -> float:
        return max(fit_linear(sizes, [best[(op, n)] for n in sizes])[0] * 1e3, 0.0)  # ns per element

    # baselines carry the loads and stores: a copy for unary ops; for binary ops an add,
    # whose own arithmetic is taken as one fused vector add per element (assumed)
    base = {1: slope("COPY", 1), 2: slope("ADD", 2) - ADD_NS}
    out = {api: [max(slope(op, ar) - base[ar], 0.01), VEC_CALL_NS] for api, (op, ar) in _GEN_OPS.items()}
    out["copy"] = out["broadcast"] = out["cast"] = [0.01, VEC_CALL_NS]
    out["default"] = out["add"]
    out["select"] = out["compare"]
    out["reduce"] = [max(slope("REDUCE", 1) - base[1], 0.01), VEC_CALL_NS]
    out["transpose"] = [max(slope("TRANSPOSE", 1) - base[1], 0.01), VEC_CALL_NS]
    # per input element; the padded output is (34/32)^2 larger, its stores priced apart
    out["pad"] = [max(slope("PAD", 1) - base[1], 0.01), VEC_CALL_NS]
    out["pad_reflect"] = [max(slope("PAD_REFLECT", 1) - base[1], 0.01), VEC_CALL_NS]
    out["gather"] = [max(slope("GATHER", 1) - base[1], 0.01), VEC_CALL_NS]  # per output element
    return out


def _interleaved_best(timers: dict, rounds: int) -> dict:
    """Per timer, the best of ``rounds`` samples taken in rounds over every timer.

    On this project's VM a slope from two sizes timed back to back moved 2-6x between
    two calibrations minutes apart (exp 0.17 then 0.06 ns an element): a
    burst of interference landed on one size and not the other. In rounds, every
    timer's samples are spread over the whole calibration, and interference only ever
    slows a kernel, so the best sample of each is its own time."""
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(max(1, rounds)):
        for key, timer in timers.items():
            best[key] = min(best[key], timer())
    return best


def calibrate_transfer_generated(cores: int, repeat: int = 3) -> dict:
    """Load and store pipes of generated kernels (Note [Calibration]): a row sum of a
    [64, n/64] float32 tensor (reads n, writes 64) and a broadcast of [64, 1] to
    [64, n/64] (writes n), 256 KiB to 4 MiB, the sizes activations have, on one thread
    and on ``cores``; the per-core bandwidth comes from the slope of time against bytes
    (``fit_generated_bandwidth``). numpy's reductions, which the GM fits use, read at
    half the rate of a vectorised generated loop, and its per-call cost is Python's."""
    from korch.ir import GraphBuilder, Op

    rng = np.random.default_rng(0)
    sizes = [1 << 16, 1 << 18, 1 << 20]  # float32 elements

    def graph(kind: str, n: int):
        b = GraphBuilder()
        if kind == "load":
            b.output("out0", b.reduce(Op.REDUCE_SUM, b.input("in0", (64, n // 64), "float32"), [1]))
        else:
            b.output("out0", b.broadcast_to(b.input("in0", (64, 1), "float32"), (64, n // 64)))
        return b.graph

    out = {}
    for kind in ("load", "store"):
        samples: dict[int, tuple[list[float], list[float]]] = {}
        timers = {
            (c, n): _generated_timer(graph(kind, n), cores, c > 1, rng) for c in sorted({1, cores}) for n in sizes
        }
        best = _interleaved_best(timers, repeat)
        for c in sorted({1, cores}):
            samples[c] = ([4.0 * n for n in sizes], [best[(c, n)] * 1e3 for n in sizes])  # ns
        a, b = fit_generated_bandwidth(samples)
        out[kind] = {**_pipe_entry(a, b, 0.0, samples), "source": "generated"}
    return out


def calibrate_launch(cores: int, repeat: int = 7) -> dict:
    """Launch terms of the CPU target from generated kernels called the way the
    profiler calls them (``TvmKernel.__call__``; each sample a median of calls, the best
    of ``repeat`` interleaved rounds): ``launch + per_arg * tensors`` from tiny kernels
    with 2, 3 and 4 tensors (a linear fit in the tensor count), ``fork_join`` from a
    row kernel (``x - rowsum(x)`` on [64, 256], its row sums computed in the row loop,
    as most fused kernels are) on one thread and on ``cores``: the parallel time less
    the serial time shared out (the flat 4096-element kernel used before had no work
    to share). On this VM the three fits gave 11-18 us, median 12 us;
    larger row kernels scale worse still (Note [Parallel margin] in target.py)."""
    from korch.ir import GraphBuilder, Op

    def graph(n_in: int, n: int):
        b = GraphBuilder()
        xs = [b.input(f"in{i}", (n,), "float32") for i in range(n_in)]
        y = xs[0]
        for x in xs[1:]:
            y = b.binary(Op.ADD, y, x)
        b.output("out0", b.unary(Op.NEG, y) if n_in == 1 else y)
        return b.graph

    rng = np.random.default_rng(0)
    counts = [2, 3, 4]
    kernels = [_generated_timer(graph(n - 1, 64), cores, False, rng) for n in counts]
    if cores > 1:
        b = GraphBuilder()
        x = b.input("in0", (64, 256), "float32")
        b.output("out0", b.binary(Op.SUB, x, b.broadcast_to(b.reduce(Op.REDUCE_SUM, x, [1]), (64, 256))))
        kernels += [_generated_timer(b.graph, cores, False, rng), _generated_timer(b.graph, cores, True, rng)]
    # rounds interleave the kernels; the best round per kernel (each a median of
    # calls): microsecond calls on this VM vary 2x from one process state to the next
    rounds = [[k() for k in kernels] for _ in range(max(5, repeat))]
    times = [float(np.min(col)) for col in zip(*rounds)]
    per_arg, launch = fit_linear(counts, times[:3])
    out = {"launch": max(launch, 0.0) * 1e3, "per_arg": max(per_arg, 0.0) * 1e3}
    if cores > 1:
        out["fork_join"] = max(times[4] - times[3] / cores, 0.0) * 1e3
    out["launch_raw_us"] = {"tensors": counts, "times": times[:3], "one_vs_all_cores": times[3:]}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m korch.tiling.calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="cpu")
    p.add_argument("--full", action="store_true", help="more sizes and repeats (slower)")
    p.add_argument("--out", type=Path, default=None, help="where to write the JSON (default: per-machine cache)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    data = calibrate(args.target, quick=not args.full, path=args.out)
    dest = args.out or calibration_path(args.target)
    summary = {k: data[k] for k in ("load", "store") if k in data}
    for v in summary.values():
        v.pop("raw", None)
    print(
        json.dumps(
            {
                "path": str(dest),
                "seconds": round(time.perf_counter() - t0, 1),
                **summary,
                "vec": data["vec"],
                "levels": data.get("levels"),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
