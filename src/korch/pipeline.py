"""The pipeline driver: one flat, ordered list of named steps.

    load -> fission -> rewrite -> partition -> identify -> profile -> orchestrate -> build -> measure

Each step reads and extends one ``Context``; step names appear in logs and in the
report's per-stage times.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
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
    # the graph before the search's rewrites, with the library layouts (for_library;
    # Note [End-to-end plan check])
    fissioned: Graph | None = None
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
    from collections import Counter

    from korch.rewrite import for_library, optimize_graph

    assert ctx.graph is not None
    s = ctx.settings
    if not s.rewrite:
        ctx.report.update(rewrites_applied={})
        return
    # the plan check's "unrewritten" graph: no search rewrites, but the layouts an
    # onnxruntime region runs faster (efficientvit_b16, one session each: the model 36.1
    # ms, fission with them 33.2, the search's graph 53.5, its HardSwish split up)
    ctx.fissioned = for_library(ctx.graph)
    ctx.graph, stats = optimize_graph(
        ctx.graph, budget=s.rewrite_budget, time_limit_s=s.rewrite_time_limit_s, patience=s.rewrite_patience
    )
    # layouts an onnxruntime region runs faster, which the search's cost cannot see
    # (Note [Narrowing before the transpose])
    after = Counter()
    ctx.graph = for_library(ctx.graph, counts=after)
    stats.applied = dict(sorted((Counter(stats.applied) + after).items()))
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


def step_plans(ctx: Context) -> None:
    """Pipeline step ``plans``: Note [End-to-end plan check] in ``korch.plans``."""
    from korch.plans import step_plans as run

    run(ctx)


def _unrewritten_plan(ctx: Context):
    """``korch.plans._unrewritten_plan`` (kept here for its callers)."""
    from korch.plans import _unrewritten_plan as build

    return build(ctx)


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


# Note [Runtime threads]: executables whose call takes longer than this keep
# ``num_threads`` without timing one thread against it
THREADS_CHECK_MAX_MS = 200.0


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
    t0 = time.perf_counter()
    exe(feeds)
    call_ms = (time.perf_counter() - t0) * 1e3
    if call_ms > THREADS_CHECK_MAX_MS:
        # one thread has never won on a call this long (segformer_b16: 1650 against
        # 2812 ms; segformer_b1 88 against 179; candy_b1 50 against 92), and the check
        # would take a minute of the optimize time (61 s on segformer_b16)
        ctx.report.update(runtime_threads=n, threads_check=f"skipped: {call_ms:.0f} ms a call")
        return
    current = [n]

    def run_with(k: int):
        def fn():
            if current[0] != k:
                exe.set_threads(k)
                current[0] = k
            exe(feeds)

        return fn

    from korch.plans import beats

    t = time_alternating(
        {str(n): run_with(n), "1": run_with(1)},
        rounds=15,
        block=None,
        max_seconds=20.0,
        min_rounds=3,
        quiesce_first=True,
    )
    ms = {k: v["median_ms"] for k, v in t.items()}
    # one thread only when it wins by every measure (Note [Runtime threads]): a coin
    # toss between near-equal counts kept efficientvit_b1's one onnxruntime session
    # at 1 thread, 2.45 ms in korch bench against 1.54 for the same graph at 2
    best = 1 if beats(t["1"], t[str(n)]) else n
    exe.set_threads(best)
    ctx.report.update(
        runtime_threads=best,
        threads_ms={k: round(v, 4) for k, v in ms.items()},
        threads_rel={k: v["rel"] for k, v in t.items()},
        threads_round_ms={k: [round(x, 4) for x in v["round_ms"]] for k, v in t.items()},
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
    from korch.diagnostics import collecting

    ctx = Context(settings, source, shapes)
    with collecting() as skipped:  # Note [Skipped optimizations]
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
        "skipped": skipped.records(),  # optimizations that raised (Note [Skipped optimizations])
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
