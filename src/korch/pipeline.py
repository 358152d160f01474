"""The pipeline driver: one flat, ordered list of named steps.

    load -> fission -> rewrite -> partition -> identify -> profile -> orchestrate -> build -> measure

Each step reads and extends one ``Context``; step names appear in logs and in the
report's per-stage times.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from korch.config import Settings
from korch.ir import Graph, GroupOp, Op, verify
from korch.ir.subgraph import Kernel, canonical_hash, extract, kernel_class, make_kernel

log = logging.getLogger("korch")


@dataclasses.dataclass
class Candidate:
    partition: int
    kernel: Kernel
    kind: str
    hash: str
    backends: tuple[str, ...]
    cost_us: float = math.inf
    backend: str = ""
    tile_config: Any = None  # tvm: the TileConfig it was measured with (and is built with)


@dataclasses.dataclass
class Context:
    settings: Settings
    source: Any
    shapes: dict[str, tuple[int, ...]] | None
    model: Any = None
    graph: Graph | None = None
    fissioned: Graph | None = None  # the graph before rewrites (Note [End-to-end plan check])
    partitions: list[list[int]] = dataclasses.field(default_factory=list)
    n_states: int = 0
    candidates: list[Candidate] = dataclasses.field(default_factory=list)
    chosen: list[Candidate] = dataclasses.field(default_factory=list)
    blp_seconds: float = 0.0
    blp_max_seconds: float = 0.0
    executable: Any = None
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


# --- steps ---------------------------------------------------------------------------


def step_load(ctx: Context) -> None:
    from korch.frontend import load_model

    ctx.model = load_model(ctx.source, ctx.shapes)


def step_fission(ctx: Context) -> None:
    from korch.fission import fission

    ctx.graph = fission(ctx.model)
    verify(ctx.graph)


def step_rewrite(ctx: Context) -> None:
    """TASO-style search over the primitive graph (Note [Rewrite search]).

    Report costs are the search's predicted cost (korch.rewrite.cost) in microseconds.
    """
    from korch.rewrite import optimize_graph

    assert ctx.graph is not None
    s = ctx.settings
    if not s.rewrite:
        ctx.report.update(rewrites_applied={})
        return
    ctx.fissioned = ctx.graph
    ctx.graph, stats = optimize_graph(
        ctx.graph, budget=s.rewrite_budget, time_limit_s=s.rewrite_time_limit_s, patience=s.rewrite_patience
    )
    verify(ctx.graph)
    ctx.report.update(
        rewrites_applied=stats.applied,
        rewrite_cost_before=round(stats.cost_before * 1e6, 1),
        rewrite_cost_after=round(stats.cost_after * 1e6, 1),
        rewrite_seconds=round(stats.seconds, 3),
        rewrite_stopped=stats.stopped,  # "time": the result depends on the machine's load
    )


def step_partition(ctx: Context) -> None:
    from korch.identify import execution_states
    from korch.partition import partition

    assert ctx.graph is not None
    ctx.partitions = partition(ctx.graph, ctx.settings.max_states)
    ctx.n_states = sum(len(execution_states(ctx.graph, p)) for p in ctx.partitions)


def _backends_for(kind: str, kgraph: Graph, target: str = "cpu") -> tuple[str, ...]:
    from korch.kernels.base import all_backends

    if kind == "opaque":
        return ("ort",)
    backends = [b for b in all_backends() if kind in b.kinds and target in getattr(b, "targets", ("cpu",))]
    names = [b.name for b in backends if b.supports(kgraph)]
    if target != "cpu":
        # device targets: kernels that keep tensors on the device win; host backends
        # (onnxruntime) only where no device backend takes the kernel
        on_device = [b.name for b in backends if b.name in names and "cpu" not in b.targets]
        names = on_device or names
    if kind == "memory":
        # Generated kernels are the point; onnxruntime only guarantees that every single
        # primitive has some backend.
        for gen in ("tvm", "triton"):
            if gen in names:
                return (gen,)
        return ("ort",) if len(kgraph.compute_ids()) == 1 and "ort" in names else ()
    return tuple(names)


# Note [Library regions]
# ~~~~~~~~~~~~~~~~~~~~~~
# Korch's candidates hold at most one linear primitive (Note [Generatable kernels]), so
# every Conv runs in its own library call. onnxruntime's CPU convolutions run in a
# blocked layout (NCHWc): alone, each call reorders its input into the blocks and its
# output back, two extra passes over the activations per Conv that a session holding
# a chain of Convs does once at the chain's ends (yolo_b1: its 52 Conv kernels took
# 25 ms in korch, onnxruntime's whole model 16 ms). So each partition also gets a few
# *library regions*: the partition itself and its halves, quarters, ... run as one
# onnxruntime kernel. They are measured like every other candidate and the BLP picks
# them only where they are faster than korch's own kernels for the same primitives
# (a region and generated kernels can split a partition). The Korch paper's
# orchestration is unchanged: a region is one more candidate kernel.


def step_identify(ctx: Context) -> None:
    from korch.identify import candidates

    g = ctx.graph
    assert g is not None
    users = g.users()
    for pi, part in enumerate(ctx.partitions):
        for k in candidates(g, part, ctx.settings.max_kernel_size):
            k = make_kernel(g, users, k.nodes)
            kg = extract(g, k)
            kind = kernel_class(g, k)
            backends = _backends_for(kind, kg, ctx.settings.target)
            if not backends:
                continue
            ctx.candidates.append(Candidate(pi, k, kind, canonical_hash(g, k), backends))
        if ctx.settings.target == "cpu":
            for nodes in library_regions(g, part, ctx.settings.library_regions):
                k = make_kernel(g, users, nodes)
                ctx.candidates.append(Candidate(pi, k, "region", canonical_hash(g, k), ("ort",)))


def library_regions(g: Graph, part: list[int], levels: int) -> list[list[int]]:
    """Whole-library candidates of a partition (Note [Library regions]).

    The partition (ascending ids, so a topological order) and its halves, quarters ...
    down to ``levels`` levels: contiguous ranges of a topological order restricted to a
    convex set are convex. Only ranges with two or more linear primitives (one linear
    primitive and its epilogue is an ordinary candidate).
    """
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for level in range(max(0, levels)):
        pieces = 1 << level
        if pieces > len(part):
            break
        for j in range(pieces):
            seg = part[j * len(part) // pieces : (j + 1) * len(part) // pieces]
            if sum(1 for n in seg if g.nodes[n].op in GroupOp.LINEAR) >= 2 and tuple(seg) not in seen:
                seen.add(tuple(seg))
                out.append(seg)
    return out


def _kernel_consts(g: Graph, k: Kernel) -> dict[str, np.ndarray]:
    out = {}
    for i, src in enumerate(k.inputs):
        if g.nodes[src].op is Op.CONST:
            out[f"in{i}_c"] = g.const_value(src)
    return out


def step_profile(ctx: Context) -> None:
    """Tile configs, predictions and measurements (Note [Model-guided profiling])."""
    from korch.orchestrate.guided import step_profile as profile_step

    profile_step(ctx)


# Note [Unmeasurable partitions]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A partition may have no orchestration among its measured candidates: every candidate
# writing some output failed its measurement. segformer_b16's decoder did so at the
# old 4 GiB worker memory limit (each kernel writing its 1 GB concat was killed). A
# failure to *measure* is not a failure to run, and onnxruntime runs any primitive
# subgraph correctly, so the partition is solved again with its unmeasured candidates
# that onnxruntime can run (library regions, linear and opaque kernels) at a penalty
# cost, ``UNMEASURED_PENALTY_US`` each: the BLP takes as few of them as it can (one
# region over the unmeasurable part, usually). The report lists such partitions
# (``unmeasured_partitions``); the optimization completes, the end-to-end check still
# times the result.
UNMEASURED_PENALTY_US = 1e9


def _solve_all(ctx: Context, cost: Callable[[Candidate], float]) -> list[Candidate]:
    """The BLP of every partition on ``cost``; the chosen kernels in execution order."""
    from korch.orchestrate import OrchestrationError, solve

    g = ctx.graph
    assert g is not None
    chosen: list[Candidate] = []
    for pi, part in enumerate(ctx.partitions):
        cands = [c for c in ctx.candidates if c.partition == pi]
        costs = [cost(c) for c in cands]
        try:
            orch = solve(g, part, [c.kernel for c in cands], costs, time_limit_s=ctx.settings.blp_time_limit_s)
        except OrchestrationError as e:
            # Note [Unmeasurable partitions]
            penal = [
                UNMEASURED_PENALTY_US if not math.isfinite(x) and "ort" in c.backends else x
                for c, x in zip(cands, costs)
            ]
            if penal == costs:
                raise
            log.warning(
                "partition %d: %s; onnxruntime runs its unmeasured part (Note [Unmeasurable partitions])", pi, e
            )
            orch = solve(g, part, [c.kernel for c in cands], penal, time_limit_s=ctx.settings.blp_time_limit_s)
            for i in orch.chosen:
                if not math.isfinite(costs[i]):
                    cands[i].backend, cands[i].cost_us = "ort", UNMEASURED_PENALTY_US
            unmeasured = ctx.report.setdefault("unmeasured_partitions", [])
            if pi not in unmeasured:
                unmeasured.append(pi)
        ctx.blp_seconds += orch.seconds
        ctx.blp_max_seconds = max(ctx.blp_max_seconds, orch.seconds)
        chosen.extend(cands[i] for i in orch.order)
    return chosen


def step_orchestrate(ctx: Context) -> None:
    ctx.chosen = _solve_all(ctx, lambda c: c.cost_us)


# Note [End-to-end plan check]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The BLP adds kernel costs measured one kernel at a time, each called back to back on
# its own hot inputs and weights. In the executable a kernel's weights and inputs are
# colder, and every call costs a little dispatch, so many small kernels cost more
# there than their sum: efficientvit_b1's chosen kernels summed 7.7 ms when measured
# and took 13.6 ms in place. A library region is one call over a chain that keeps its
# intermediates inside onnxruntime, so that error is not the same for both kinds of
# plan. So (cpu target, ``Settings.region_bias`` not empty) when regions exist the BLP
# is solved again with region costs scaled by each factor, and the whole primitive
# graph as a single onnxruntime kernel ("one region") is one more plan, so an
# optimized model is never slower than onnxruntime running korch's own graph. Every
# distinct plan is built, the plans are timed end to end, alternated, and the fastest
# is kept (report: ``plan_check`` says which won).
#
# The factors are a guess; the BLP's own plan also says by how much: each of its
# kernels is timed in place (``korch explain``'s clock around every step), and the BLP
# is solved again with those costs for the kernels that ran, every other candidate's
# measured cost times the median in-place/measured ratio of its kind (generated,
# linear, region ...), and the per-call dispatch of the run added to every kernel. The
# new plan is timed in place the same way, ``Settings.in_place_rounds`` times or until
# a plan repeats; each is one more plan for the end-to-end timing.


def step_plans(ctx: Context) -> None:
    from korch.bench.compare import random_feeds, time_alternating

    s = ctx.settings
    if s.target != "cpu" or not s.region_bias:
        return
    plans = {"blp": (ctx.chosen, ctx.executable)}
    seen = {tuple(c.kernel.nodes for c in ctx.chosen)}
    base = ctx.chosen
    # the whole graph as one region: what onnxruntime makes of korch's primitive graph
    # (rewritten, raised), one call; kept only when nothing korch composed beats it
    g = ctx.graph
    assert g is not None
    whole = make_kernel(g, g.users(), g.compute_ids())
    ctx.chosen = [Candidate(-1, whole, "region", canonical_hash(g, whole), ("ort",), math.nan, "ort")]
    try:
        if _memory_full(ctx):
            raise MemoryError("plan check: memory full")
        step_build(ctx)
        ctx.executable.steps[0].kernel.set_spin(True)  # the kernel runs alone
        plans["one region"] = (ctx.chosen, ctx.executable)
    except Exception as e:  # noqa: BLE001 - the check only adds a plan when it can
        log.info("plan check: the whole graph as one onnxruntime kernel failed to build: %s", e)
    if ctx.fissioned is not None and ctx.report.get("rewrites_applied") and not _memory_full(ctx):
        try:
            plans["one region, unrewritten"] = _unrewritten_plan(ctx)
        except Exception as e:  # noqa: BLE001
            log.info("plan check: the unrewritten graph as one onnxruntime kernel failed: %s", e)
    # (after the one-region plans: when memory runs short those matter most)
    has_regions = any(c.kind == "region" and math.isfinite(c.cost_us) for c in ctx.candidates)
    for f in s.region_bias if has_regions else ():
        _add_plan(
            ctx, plans, seen, f"regions x{f:g}", lambda c, f=f: c.cost_us * f if c.kind == "region" else c.cost_us
        )
    feeds = random_feeds(plans["blp"][1].inputs)
    scales = _in_place_plans(ctx, plans, seen, feeds)
    ctx.chosen = base
    if len(plans) == 1:
        ctx.report.update(plan_check={"plans": 1})
        return
    fns = {}
    for name, (_, exe) in plans.items():
        exe.set_threads(max(1, int(s.num_threads)))
        fns[name] = lambda exe=exe: exe(feeds)
    t = time_alternating(fns, rounds=10)
    ms = {k: v["median_ms"] for k, v in t.items()}
    best = min(t, key=lambda k: t[k]["rel"])  # by round-relative time (Note [Timing in blocks])
    ctx.chosen, ctx.executable = plans[best]
    ctx.report.update(
        plan_check={
            "kept": best,
            "ms": {k: round(v, 4) for k, v in ms.items()},
            "rel": {k: round(v["rel"], 3) for k, v in t.items()},
            "in_place_scale": scales,
        }
    )


def _in_place_plans(ctx: Context, plans: dict, seen: set, feeds) -> dict[str, float]:
    """Re-solve the BLP on the costs its plan's kernels take in place (Note [End-to-end
    plan check]); adds each new plan to ``plans``. Returns the last in-place/measured
    ratio per kernel kind."""
    from korch.bench.explain import time_steps

    s = ctx.settings
    chosen, exe = plans["blp"]
    in_place: dict[tuple[int, tuple[int, ...]], float] = {}
    scales: dict[str, float] = {}
    for r in range(max(0, s.in_place_rounds)):
        exe.set_threads(max(1, int(s.num_threads)))
        info = time_steps(exe, feeds, runs=8, max_seconds=10.0)
        per_call = info["dispatch_us"] / max(1, len(chosen))
        for c, us in zip(chosen, info["step_us"]):
            in_place[(c.partition, c.kernel.nodes)] = us
        ratios: dict[str, list[float]] = {}
        for c in ctx.candidates:
            us = in_place.get((c.partition, c.kernel.nodes))
            if us is not None and math.isfinite(c.cost_us) and c.cost_us > 0:
                ratios.setdefault(c.kind, []).append(us / c.cost_us)
        if not ratios:
            break
        scales = {k: round(statistics.median(v), 3) for k, v in ratios.items()}
        overall = statistics.median([x for v in ratios.values() for x in v])

        def cost(c: Candidate, sc: dict[str, float], overall: float, per_call: float) -> float:
            us = in_place.get((c.partition, c.kernel.nodes))
            if us is None:
                us = c.cost_us * sc.get(c.kind, overall)
            return us + per_call

        name = f"in place {r + 1}"
        if not _add_plan(
            ctx, plans, seen, name, functools.partial(cost, sc=dict(scales), overall=overall, per_call=per_call)
        ):
            break
        chosen, exe = plans[name]
    return scales


# Every plan of the check stays built until the alternating timing; a batch-16
# Segformer's plans (arenas, onnxruntime sessions) took the process to 24 GB and the
# OOM killer. Past this share of the machine's memory no further plan is built.
PLAN_MEMORY_SHARE = 0.4


def _memory_full(ctx: Context) -> bool:
    """Whether this process holds more than ``PLAN_MEMORY_SHARE`` of the machine's memory
    (then the plan check builds no more plans; the report counts those skipped)."""
    try:
        import psutil

        full = psutil.Process().memory_info().rss > PLAN_MEMORY_SHARE * psutil.virtual_memory().total
    except Exception:  # noqa: BLE001 - no reading: build as before
        return False
    if full:
        ctx.report["plans_skipped_for_memory"] = ctx.report.get("plans_skipped_for_memory", 0) + 1
        log.warning("plan check: %.0f%% of memory in use, no further plan built", 100 * PLAN_MEMORY_SHARE)
    return full


def _add_plan(ctx: Context, plans: dict, seen: set, name: str, cost: Callable[[Candidate], float]) -> bool:
    """The BLP on ``cost``, built and added to ``plans`` as ``name`` unless an earlier plan
    chose the same kernels (or memory is full: ``_memory_full``)."""
    if _memory_full(ctx):
        return False
    alt = _solve_all(ctx, cost)
    key = tuple(c.kernel.nodes for c in alt)
    if key in seen:
        return False
    seen.add(key)
    ctx.chosen = alt
    step_build(ctx)
    plans[name] = (alt, ctx.executable)
    return True


def _unrewritten_plan(ctx: Context) -> tuple[list[Candidate], Any]:
    """The graph before rewrites as one onnxruntime kernel, as a plan over ``ctx.graph``.

    The rewrites are chosen for korch's kernels (merged Convs, a scale moved into a
    bias); some of them hide from onnxruntime what it fuses (a merged Conv is split
    again by Slices, which leave its blocked layout). The kernel reads the graph inputs
    and writes the graph outputs, matched to ``ctx.graph``'s by name.
    """
    from korch.executable import Executable, Step, TensorSpec, plan_buffers
    from korch.ir.to_onnx import to_onnx
    from korch.kernels.ort_backend import OrtKernel, _session

    g, pre = ctx.graph, ctx.fissioned
    assert g is not None and pre is not None
    k = make_kernel(pre, pre.users(), pre.compute_ids())
    kg, consts = extract(pre, k), _kernel_consts(pre, k)
    in_name = {nid: name for name, nid in pre.inputs.items()}
    feeds = [(f"in{i}", in_name[src]) for i, src in enumerate(k.inputs) if f"in{i}_c" not in consts]
    out_names = {nid: name for name, nid in pre.outputs.items()}
    if any(n not in out_names for n in k.outputs) or set(pre.outputs) != set(g.outputs):
        raise ValueError("the rewritten graph's outputs do not match the original's")
    model = to_onnx(kg, const_inputs=consts).SerializeToString()
    kernel = OrtKernel(
        _session(model, ctx.settings.num_threads, spin=True),
        [f for f, _ in feeds],
        range(len(feeds)),
        list(kg.outputs),
        model,
        spin=True,
    )
    outputs = tuple(g.outputs[out_names[n]] for n in k.outputs)
    whole = make_kernel(g, g.users(), g.compute_ids())
    cand = Candidate(-1, whole, "region", canonical_hash(pre, k), ("ort",), math.nan, "ort")
    step = Step(
        f"k0_{cand.hash[:8]}", "ort", cand.hash, whole.nodes, tuple(g.inputs[n] for _, n in feeds), outputs, kernel
    )
    spec = lambda nid: TensorSpec(nid, g.nodes[nid].shape, g.nodes[nid].dtype)  # noqa: E731
    out_specs = {name: spec(nid) for name, nid in g.outputs.items()}
    if any(s.node not in outputs for s in out_specs.values()):
        raise ValueError("a graph output is not computed by the graph")  # a constant or an input as output
    sizes = {i: n.size * np.dtype(n.dtype).itemsize for i, n in enumerate(g.nodes)}
    free_after, stats = plan_buffers([step], set(outputs), sizes)
    exe = Executable({n: spec(i) for n, i in g.inputs.items()}, out_specs, {}, [step], free_after, stats)
    return [cand], exe


def step_build(ctx: Context) -> None:
    from korch.executable import Executable, Step, TensorSpec, plan_buffers
    from korch.kernels.base import get_backend

    g = ctx.graph
    assert g is not None
    steps: list[Step] = []
    by_backend: dict[str, list[int]] = {}
    for i, c in enumerate(ctx.chosen):
        steps.append(Step(f"k{i}_{c.hash[:8]}", c.backend, c.hash, c.kernel.nodes, c.kernel.inputs, c.kernel.outputs))
        by_backend.setdefault(c.backend, []).append(i)
    for name, idxs in by_backend.items():
        items = [(extract(g, ctx.chosen[i].kernel), _kernel_consts(g, ctx.chosen[i].kernel)) for i in idxs]
        tiles = [ctx.chosen[i].tile_config for i in idxs]
        kw = {"tile_configs": tiles} if any(t is not None for t in tiles) else {}
        built = get_backend(name).build_many(items, ctx.settings.num_threads, **kw)
        for i, k in zip(idxs, built):
            if isinstance(k, Exception):
                raise RuntimeError(f"building chosen kernel {steps[i].name} with {name} failed: {k}")
            steps[i].kernel = k
    inputs = {name: TensorSpec(nid, g.nodes[nid].shape, g.nodes[nid].dtype) for name, nid in g.inputs.items()}
    outputs = {name: TensorSpec(nid, g.nodes[nid].shape, g.nodes[nid].dtype) for name, nid in g.outputs.items()}
    consts: dict[int, np.ndarray] = {}
    for st in steps:
        for src in st.inputs:
            if g.nodes[src].op is Op.CONST:
                consts[src] = g.const_value(src)
    for spec in outputs.values():
        if g.nodes[spec.node].op is Op.CONST:
            consts[spec.node] = g.const_value(spec.node)
    sizes = {i: n.size * np.dtype(n.dtype).itemsize for i, n in enumerate(g.nodes)}
    free_after, stats = plan_buffers(steps, {s.node for s in outputs.values()}, sizes)
    ctx.executable = Executable(inputs, outputs, consts, steps, free_after, stats)
    ctx.executable.cuda_graph = ctx.settings.cuda_graph  # device executables only (Note [Device kernels])


def step_threads(ctx: Context) -> None:
    """Pick the executable's thread count by end-to-end time (Note [Runtime threads])."""
    from korch.bench.compare import random_feeds, time_alternating

    exe, s = ctx.executable, ctx.settings
    assert exe is not None
    n = max(1, int(s.num_threads))
    exe.set_threads(n)
    if not s.choose_threads or n == 1 or s.target != "cpu":
        ctx.report.update(runtime_threads=n)
        return
    feeds = random_feeds(exe.inputs)
    current = [n]

    def run_with(k: int):
        def fn():
            if current[0] != k:
                exe.set_threads(k)
                current[0] = k
            exe(feeds)

        return fn

    t = time_alternating({str(n): run_with(n), "1": run_with(1)}, rounds=15)
    ms = {k: v["median_ms"] for k, v in t.items()}
    best = 1 if t["1"]["rel"] < t[str(n)]["rel"] else n
    exe.set_threads(best)
    ctx.report.update(
        runtime_threads=best,
        threads_ms={k: round(v, 4) for k, v in ms.items()},
        threads_rel={k: v["rel"] for k, v in t.items()},
    )


def step_measure(ctx: Context) -> None:
    from korch.bench.compare import compare_with_onnxruntime

    assert ctx.executable is not None
    ctx.report.update(compare_with_onnxruntime(ctx.executable, ctx.model, ctx.settings))


STEPS: list[tuple[str, Callable[[Context], None]]] = [
    ("load", step_load),
    ("fission", step_fission),
    ("rewrite", step_rewrite),
    ("partition", step_partition),
    ("identify", step_identify),
    ("profile", step_profile),
    ("orchestrate", step_orchestrate),
    ("build", step_build),
    ("plans", step_plans),
    ("threads", step_threads),
    ("measure", step_measure),
]


def run_pipeline(source: Any, settings: Settings, shapes=None, measure: bool = True) -> Context:
    ctx = Context(settings, source, shapes)
    for name, fn in STEPS:
        if name == "measure" and not measure:
            continue
        t0 = time.perf_counter()
        log.info("step %s", name)
        fn(ctx)
        ctx.stage_seconds[name] = round(time.perf_counter() - t0, 3)
    g = ctx.graph
    assert g is not None
    redundant = sum(len(c.kernel.nodes) for c in ctx.chosen) - len({n for c in ctx.chosen for n in c.kernel.nodes})
    ctx.report = {
        "model": str(source) if not hasattr(source, "SerializeToString") else "<ModelProto>",
        "target": settings.target,
        "primitives": len(g.compute_ids()),
        "primitive_classes": {k: v for k, v in g.count().items() if k != "source"},
        "partitions": len(ctx.partitions),
        "execution_states": ctx.n_states,
        "candidates": len(ctx.candidates),
        **ctx.report,
        "blp_seconds": round(ctx.blp_seconds, 3),
        "blp_max_seconds": round(ctx.blp_max_seconds, 3),
        "kernels_chosen": len(ctx.chosen),
        "kernels_by_backend": _count(c.backend for c in ctx.chosen),
        "region_candidates": sum(1 for c in ctx.candidates if c.kind == "region"),
        "region_kernels": sum(1 for c in ctx.chosen if c.kind == "region"),
        "redundant_primitives": redundant,
        "predicted_latency_us": round(sum(c.cost_us for c in ctx.chosen), 1),
        "buffers": ctx.executable.buffer_stats if ctx.executable else {},
        "stage_seconds": ctx.stage_seconds,
    }
    return ctx


def _count(xs) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


def save_outputs(ctx: Context, out_dir: str | Path) -> None:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    ctx.executable.save(d)
    (d / "report.json").write_text(json.dumps(ctx.report, indent=1, default=str))
    if ctx.graph is not None:  # the primitive graph, for `korch explain`
        from korch.bench.explain import save_graph_summary

        save_graph_summary(ctx.graph, d)


__all__ = ["STEPS", "Candidate", "Context", "GroupOp", "run_pipeline", "save_outputs"]
