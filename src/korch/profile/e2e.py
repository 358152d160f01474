"""End-to-end latency of an executable and onnxruntime, measured alternately in one process."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def random_feeds(inputs: Mapping, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, spec in inputs.items():
        if spec.dtype == "bool":
            feeds[name] = rng.random(spec.shape) < 0.5
        elif np.issubdtype(np.dtype(spec.dtype), np.integer):
            feeds[name] = rng.integers(0, 4, spec.shape).astype(spec.dtype)
        else:
            feeds[name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return feeds


def ort_session(model, num_threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def max_rel_error(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    """max over outputs of max|got - want| / max|want| (normwise relative error)."""
    worst = 0.0
    for name, w in want.items():
        g = np.asarray(got[name])
        if g.shape != w.shape:
            return float("inf")
        if w.dtype.kind in "biu":
            worst = max(worst, 0.0 if np.array_equal(g, w) else 1.0)
            continue
        finite = np.isfinite(w)
        if not np.array_equal(finite, np.isfinite(g)):
            return float("inf")
        scale = float(np.max(np.abs(w[finite]), initial=0.0)) or 1.0
        err = float(np.max(np.abs(g[finite].astype(np.float64) - w[finite]), initial=0.0))
        worst = max(worst, err / scale)
    return worst


BLOCK_MS = 100.0  # Note [Timing in blocks]: block=None
SLOW_BLOCK_CALL_MS = 500.0  # ... and calls this slow get blocks of two


def quiesce(window_s: float = 0.01, busy_share: float = 0.1, max_s: float = 0.5) -> float:
    """Wait until this process's threads stop spinning: a window in which the whole
    process used under ``busy_share`` of one core (onnxruntime's default pool spins on
    after a call, about 30 ms for yolo_b1; OpenMP's too). The process's CPU time moves
    in scheduler ticks (4 ms here), so the window is 10 ms. Returns the seconds waited.
    (The monotonic clock: tests replace ``perf_counter`` with a fake one.)"""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s:
        c0, w0 = time.process_time(), time.monotonic()
        time.sleep(window_s)
        if time.process_time() - c0 < busy_share * (time.monotonic() - w0):
            break
    return time.monotonic() - t0


def time_alternating(
    fns: dict[str, Callable[[], object]],
    rounds: int = 20,
    min_ms: float = 50.0,
    block: int | None = 3,
    max_seconds: float = 60.0,
    min_rounds: int = 5,
    quiesce_first: bool = False,
) -> dict:
    """Median and spread per engine, engines interleaved round by round.

    Note [Timing in blocks]: each round runs every engine ``block`` times in a row and
    drops the first call of each block. Interleaving call by call let one engine's thread
    pool, still spinning after its call (onnxruntime's by default, OpenMP's in torch),
    take a core from the engine timed next: an onnxruntime session on yolo_b1 took 35 ms
    right after a second spinning session and 14 ms in blocks (measured here). Blocks time
    each engine as a user's loop runs it; the alternation still spreads drift over all.

    This VM's speed also drifts by 30-40% in phases of seconds, longer than a round. So
    each engine also gets ``rel``: the median over rounds of its round time over the
    geometric mean of all engines' times in that round. Rounds are short, so a phase
    scales every engine of a round alike and cancels; ``rel`` ranks close engines more
    steadily than the medians do.

    Past ``min_rounds`` rounds, timing stops once the kept calls add up to
    ``max_seconds``: a batch-16 Segformer call takes 1.5 s.

    ``block=None`` sizes blocks to about ``BLOCK_MS`` of the fastest engine's calls (3
    to 30 calls): the first calls after another engine ran are slower than the first
    one alone (Note [Engines in their own processes]), and a block of three on a 3 ms
    model kept two of those. When every engine's call takes ``SLOW_BLOCK_CALL_MS`` or more
    (batch-16 Segformer: 1-2 s) a block is two calls, the first dropped: a pool that
    spins some 30 ms after its call costs such a call a few percent at most, and the
    plan check of six such plans took 116 of segformer_b16's 615 s optimize.

    ``quiesce_first`` waits before each block until this process's threads are idle
    (``quiesce``): a session that keeps spinning after its calls, like onnxruntime's
    default one, then takes no cores from the engine timed next.

    An engine is a callable, timed here, or has ``block(n)`` returning the times of n
    calls it timed itself (``korch.bench.isolate.EngineProcess``: an engine in its own
    process, which answers once its threads are idle).
    """
    warm = [_block_ms(fn, 2)[-1] for fn in fns.values()]
    if block is None and min(warm) >= SLOW_BLOCK_CALL_MS:
        block = 2  # one kept call: what the dropped call guards against is ~1% of it
    elif block is None:  # about BLOCK_MS of the fastest engine's calls
        block = max(3, min(30, math.ceil(BLOCK_MS / max(min(warm), 1e-3))))
    block = max(1, int(block))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    per_round: list[dict[str, float]] = []
    names = list(fns)
    for r in range(rounds):
        this: dict[str, float] = {}
        # odd rounds in reverse order, so that no engine always runs right after the
        # same other one (two copies of one executable, each in its own process, timed
        # 1.02-1.12 apart in a fixed order and 0.98-1.01 alternating)
        for name in names if r % 2 == 0 else names[::-1]:
            fn = fns[name]
            if quiesce_first and not hasattr(fn, "block"):  # (an engine process quiesces itself)
                quiesce()
            times = _block_ms(fn, block)
            kept = times[1:] if block > 1 else times
            samples[name] += kept
            this[name] = statistics.median(kept)
        per_round.append(this)
        if r + 1 >= min_rounds and sum(sum(s) for s in samples.values()) > 1e3 * max_seconds:
            break  # cap the measuring time of big models
    del min_ms
    rel: dict[str, list[float]] = {k: [] for k in fns}
    for this in per_round:
        gm = math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in this.values()))
        for name, v in this.items():
            rel[name].append(v / gm)
    out = {}
    for name, s in samples.items():
        s_sorted = sorted(s)
        out[name] = {
            "median_ms": statistics.median(s),
            "p10_ms": s_sorted[len(s) // 10],
            "p90_ms": s_sorted[(9 * len(s)) // 10],
            "runs": len(s),
            "rel": statistics.median(rel[name]),
            "round_ms": [this[name] for this in per_round],
            "block": block,
        }
    return out


def over_processes(timings: list[dict]) -> dict:
    """One ``time_alternating`` result per set of engine processes, combined: per engine,
    the median over processes of each process's median (Note [Medians over processes]),
    the per-process medians in ``process_ms``, p10/p90 over the round medians of all
    processes (one set: returned as it is, p10/p90 over its calls). An engine missing from some sets (a peer that failed to start again) is combined
    over the sets it ran in.

    Note [Medians over processes]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    One process per engine still leaves that process's luck in its median: where its
    threads and arena landed, which core it shared with the other engine's leftover
    spinning, what it JIT-compiled. ``korch bench`` therefore starts a fresh set of
    engine processes several times (``--processes``), alternates the engines within each
    set, and reports the median over processes, so that one unlucky process moves an
    engine's number no more than one unlucky round does."""
    if len(timings) == 1:
        return {k: {**v, "process_ms": [v["median_ms"]], "processes": 1} for k, v in timings[0].items()}
    out: dict[str, dict] = {}
    names = list(dict.fromkeys(k for t in timings for k in t))
    for name in names:
        runs = [t[name] for t in timings if name in t]
        rounds = sorted(x for r in runs for x in r["round_ms"])
        out[name] = {
            "median_ms": statistics.median(r["median_ms"] for r in runs),
            "p10_ms": rounds[len(rounds) // 10],
            "p90_ms": rounds[(9 * len(rounds)) // 10],
            "runs": sum(r["runs"] for r in runs),
            "rel": statistics.median(r["rel"] for r in runs),
            "round_ms": [x for r in runs for x in r["round_ms"]],
            "process_ms": [r["median_ms"] for r in runs],
            "processes": len(runs),
            "block": runs[0]["block"],
        }
    return out


def time_shuffled(
    fns: dict[str, Callable[[], object]], rounds: int, calls: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Per engine, one median per round (seconds per call): each round runs the engines
    in a fresh random order, ``warmup`` calls then ``calls`` timed ones each. For
    in-process A/B scripts of microsecond calls (benchmarks/call_overhead.py,
    export_passes.py), where a fixed order lets one engine always follow the same
    other; compare engines round by round (the ratio of the two lists)."""
    per_round: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        order = list(fns.items())
        random.shuffle(order)
        for name, fn in order:
            for _ in range(warmup):
                fn()
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            per_round[name].append(statistics.median(times))
    return per_round


def _block_ms(fn, n: int) -> list[float]:
    """Milliseconds of n calls of an engine (Note [Engines in their own processes])."""
    if hasattr(fn, "block"):
        return list(fn.block(n))
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def compare_with_onnxruntime(executable, model, settings) -> dict:
    feeds = random_feeds(executable.inputs)
    sess = ort_session(model, settings.num_threads)
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(None, feeds)))
    got = executable(feeds)
    err = max_rel_error(got, want)
    timing = time_alternating(
        {"korch": lambda: executable(feeds), "onnxruntime": lambda: sess.run(None, feeds)}, quiesce_first=True
    )
    k, o = timing["korch"]["median_ms"], timing["onnxruntime"]["median_ms"]
    return {
        "latency_ms": round(k, 4),
        "onnxruntime_ms": round(o, 4),
        "speedup": round(o / k, 3) if k > 0 else None,
        "max_rel_error": err,
        "timing": timing,
    }


def time_steps(exe, feeds, runs: int = 20, max_seconds: float = 30.0) -> dict[str, Any]:
    """Per-step medians, dispatch overhead and end to end, from runs with a clock per step."""
    n = len(exe.steps)
    per: list[list[float]] = [[] for _ in range(n)]
    totals: list[float] = []
    overheads: list[float] = []
    pc = time.perf_counter
    t_start = pc()
    segments = [st.kernel for st in exe.steps if st.backend == "native-segment"]
    for r in range(runs + 2):
        if r == 2:  # after the warm-up: per-kernel clocks inside native segments, from zero
            for k in segments:
                k.profile(True)
        ts = [0.0] * n
        t0 = pc()
        env = exe.check_inputs(feeds)
        env.update(exe.consts)
        for i, (step, free) in enumerate(zip(exe.steps, exe.free_after)):
            args = [env[j] for j in step.inputs]
            a = pc()
            outs = step.kernel(args)
            ts[i] = pc() - a
            for nid, val in zip(step.outputs, outs):
                env[nid] = val
            for nid in free:
                env.pop(nid, None)
        total = pc() - t0
        if r < 2:
            continue  # warm-up
        totals.append(total)
        overheads.append(total - sum(ts))
        for i in range(n):
            per[i].append(ts[i])
        if pc() - t_start > max_seconds and len(totals) >= 3:
            break
    # per kernel: a native segment's kernels by its own clocks (means), others as steps
    kernel_us: list[float] = []
    segment_overhead_us = 0.0  # inside segments, outside their kernels' clocks
    segment_spread_us = 0.0  # a call's kernel total above the sum of the kernels' medians
    for i, st in enumerate(exe.steps):
        if st.backend == "native-segment":
            raw = st.kernel.profile_runs_ns()
            st.kernel.profile(False)
            members = (
                [float(v) / 1e3 for v in np.median(raw, axis=0)] if len(raw) else [0.0] * len(st.kernel.step_names)
            )
            kernel_us += members  # medians, like the steps'
            # Note [Segment overhead]: against the median of each call's kernel total, not
            # the sum of the kernels' medians, which is smaller (each kernel's time is
            # skewed right): on efficientnet_b0's 129 kernels by 0.38 ms of 9.4, all of
            # it once counted as dispatch
            inside = float(np.median(raw.sum(axis=1))) / 1e3 if len(raw) else sum(members)
            segment_overhead_us += max(0.0, statistics.median(per[i]) * 1e6 - inside) if per[i] else 0.0
            segment_spread_us += max(0.0, inside - sum(members))
        else:
            kernel_us.append(statistics.median(per[i]) * 1e6)
    plain = []
    for _ in range(max(3, min(runs, len(totals)))):
        a = pc()
        exe(feeds)
        plain.append(pc() - a)
    step_us = [statistics.median(p) * 1e6 for p in per]
    dispatch_us = max(0.0, statistics.median(overheads) * 1e6)
    return {
        "step_us": step_us,
        "dispatch_us": dispatch_us,
        "end_to_end_us": sum(step_us) + dispatch_us,
        "kernel_us": kernel_us,  # one per exe.kernel_steps()
        "segment_overhead_us": segment_overhead_us,
        "segment_spread_us": segment_spread_us,
        "plain_end_to_end_us": statistics.median(plain) * 1e6,
        "instrumented_median_us": statistics.median(totals) * 1e6,
        "runs": len(totals),
    }
