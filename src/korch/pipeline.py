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

from korch.config import Settings
from korch.ir import Graph, GroupOp, verify
from korch.ir.subgraph import KernelKind, canonical_hash, extract, kernel_class, make_kernel
from korch.orchestrate.choose import UNMEASURED_PENALTY_US
from korch.orchestrate.plan import Candidate, Plan, PlanFamily

log = logging.getLogger("korch")


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
    plan: Plan | None = None  # the plan shipped (korch.selection)
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
    from korch.rewrite.rules import AFTER_SEARCH

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
    ctx.graph = for_library(ctx.graph, rules=AFTER_SEARCH, counts=after)  # Note [An affine map before a MatMul]
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


# Note [One thread pool]
# ~~~~~~~~~~~~~~~~~~~~~~
# With native segments (Settings.native), generated and native linear kernels share
# korch's pool. numpy's OpenBLAS and torch bring pools of their own, whose workers
# spin after each call on the same two cores: an attention executable with four numpy
# MatMuls between native segments took 36 ms instead of 0.8 ms. onnxruntime's sessions
# do not spin beside other kernels (Note [No spinning thread pools]), so each call
# wakes a sleeping pool instead: in place, segformer_block's onnxruntime MatMuls and
# Convs took 46-89 us more than measured alone, its native kernels 0.9-1.1x (Note [A
# step outside the segments]). Where the native backend takes a linear kernel, none
# of the three is a candidate, and the plan runs as few segments as the opaque
# kernels allow: composed plans of the six test models went from 0.563x to 0.755x the
# best peer (geomean; attention, candy, mlp and segformer one segment each). Charging
# each library step 50 us instead, and letting the BLP choose, reached 0.636x: the
# hand-off in place was larger than that, and a library kernel splits a segment.
POOLED_OUT = frozenset({"numpy", "torch", "ort"})


def _backends_for(kind: KernelKind, kgraph: Graph, target: str = "cpu", native: bool = False) -> tuple[str, ...]:
    from korch.kernels.registry import all_backends, get_backend

    if kind is KernelKind.OPAQUE:
        # korch's runtime runs a TopK itself, a step of a segment (Note [Native TopK]);
        # on a device, a TopK stays there (Note [Device TopK])
        if target == "cpu" and native and get_backend("native").supports(kgraph):
            return ("native",)
        on_device = [
            b.name
            for b in all_backends()
            if target != "cpu" and "opaque" in b.kinds and b.targets == {target} and b.supports(kgraph)
        ]
        return tuple(on_device) or ("ort",)
    backends = [b for b in all_backends() if kind in b.kinds and target in getattr(b, "targets", ("cpu",))]
    names = [b.name for b in backends if b.supports(kgraph)]
    if target == "cpu":
        if not native:
            names = [n for n in names if n != "native"]
        elif "native" in names:  # Note [One thread pool]
            names = [n for n in names if n not in POOLED_OUT]
    if target != "cpu":
        # device targets: kernels that keep tensors on the device win; host backends
        # (onnxruntime) only where no device backend takes the kernel
        on_device = [b.name for b in backends if b.name in names and "cpu" not in b.targets]
        if kind == "linear" and not on_device and len(kgraph.outputs) > 1:
            return ()  # a host kernel would cost the plan its CUDA graph; the one-output kernels remain
        names = on_device or names
    if kind is KernelKind.MEMORY:
        # Generated kernels are the point; onnxruntime only guarantees that every single
        # primitive has some backend. A pooling korch's runtime runs (Note [Native
        # pooling]) is measured beside TVM's kernel for it.
        for gen in ("tvm", "triton"):
            if gen in names:
                return (gen, "native") if gen == "tvm" and "native" in names else (gen,)
        return ("ort",) if len(kgraph.compute_ids()) == 1 and "ort" in names else ()
    return tuple(names)


def _fallback_for(kind: KernelKind, kgraph: Graph, target: str, backends: tuple[str, ...]) -> tuple[str, ...]:
    """The backends Note [One thread pool] took from a kernel the native backend takes
    (onnxruntime, for an opaque kernel another backend took), measured only if every
    one of ``backends`` fails (Note [Fallback backends] in orchestrate/plan.py)."""
    if kind is KernelKind.OPAQUE:
        return () if "ort" in backends else ("ort",)  # onnxruntime runs any opaque operator
    if "native" not in backends:
        return ()
    return tuple(b for b in _backends_for(kind, kgraph, target, native=False) if b not in backends)


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
            backends = _backends_for(kind, kg, ctx.settings.target, ctx.settings.native)
            if not backends:
                continue
            fallback = _fallback_for(kind, kg, ctx.settings.target, backends)
            ctx.candidates.append(Candidate(pi, k, kind, canonical_hash(g, k), backends, fallback=fallback))
        if ctx.settings.target == "cpu":
            for nodes in library_regions(g, part, ctx.settings.library_regions):
                k = make_kernel(g, users, nodes)
                ctx.candidates.append(Candidate(pi, k, KernelKind.REGION, canonical_hash(g, k), ("ort",)))


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


def step_profile(ctx: Context) -> None:
    """Tile configs, predictions and measurements (Note [Model-guided profiling])."""
    from korch.orchestrate.guided import step_profile as profile_step

    profile_step(ctx)


def _solve_all(ctx: Context, cost: Callable[[Candidate], float]) -> list[Candidate]:
    """The BLP of every partition on ``cost`` (``korch.orchestrate.choose``); its solve
    times and unmeasurable partitions recorded in ``ctx``."""
    from korch.orchestrate.choose import solve_partitions

    assert ctx.graph is not None
    got = solve_partitions(ctx.graph, ctx.partitions, ctx.candidates, cost, ctx.settings.blp_time_limit_s)
    ctx.blp_seconds += got.seconds
    ctx.blp_max_seconds = max(ctx.blp_max_seconds, got.max_seconds)
    for pi in got.unmeasured:
        unmeasured = ctx.report.setdefault("unmeasured_partitions", [])
        if pi not in unmeasured:
            unmeasured.append(pi)
    return got.chosen


def step_orchestrate(ctx: Context) -> None:
    ctx.chosen = _solve_all(ctx, lambda c: c.cost_us)


def _build(ctx: Context, chosen: list[Candidate]):
    from korch.executable.build import build_executable
    from korch.orchestrate.plan import native_segments

    assert ctx.graph is not None
    s = ctx.settings
    return build_executable(ctx.graph, chosen, s.num_threads, s.cuda_graph, native=native_segments(s))


def step_build(ctx: Context) -> None:
    ctx.executable = _build(ctx, ctx.chosen)


def plan_inputs(ctx: Context):
    """What the final selection stage reads (``korch.selection.PlanInputs``)."""
    from korch.profile.e2e import time_alternating
    from korch.selection import PlanInputs

    assert ctx.graph is not None
    return PlanInputs(
        graph=ctx.graph,
        fissioned=ctx.fissioned,
        model=ctx.model,
        candidates=ctx.candidates,
        settings=ctx.settings,
        rewritten=bool(ctx.report.get("rewrites_applied")),
        solve=lambda cost: _solve_all(ctx, cost),
        build=lambda chosen: _build(ctx, chosen),
        time=time_alternating,
        report=ctx.report,
    )


def step_plans(ctx: Context) -> None:
    """The final selection stage (``korch.selection``, Note [End-to-end plan check])."""
    from korch.selection import select_plan

    base = Plan("blp", PlanFamily.COMPOSED, ctx.chosen, ctx.executable)
    ctx.executable = None  # the plan holds it (a lean check frees it: Note [Lean plan check])
    kept = select_plan(plan_inputs(ctx), base)
    ctx.chosen, ctx.executable, ctx.plan = kept.chosen, kept.executable, kept
    ctx.report.update(plan_name=kept.name, plan_family=str(kept.family))


# Note [Runtime threads]: executables whose call takes longer than this keep
# ``num_threads`` without timing one thread against it
THREADS_CHECK_MAX_MS = 200.0


def step_threads(ctx: Context) -> None:
    """Pick the executable's thread count by end-to-end time (Note [Runtime threads])."""
    from korch.profile.e2e import random_feeds, time_alternating

    exe, s = ctx.executable, ctx.settings
    assert exe is not None
    n = max(1, int(s.num_threads))
    exe.set_threads(n)
    if not s.choose_threads or n == 1 or s.target != "cpu":
        ctx.report.update(runtime_threads=n)
        return
    steps = getattr(exe, "steps", None)
    if steps and all(st.backend == "native-segment" for st in steps):
        # korch's one pool runs every kernel (Note [One thread pool]): no pools take
        # turns on the cores, small kernels already stay on the calling thread (Note
        # [Serial small kernels]), and a check timed while the VM's other core was
        # slow saved efficientnet_b0 and mobilenetv3_small at one thread (14.5 against
        # 18.0 ms at two; on a calm machine two threads run them in 8.7 and 1.6 ms,
        # one in 14.1 and 2.4): a choice saved once outlives the phase it was timed in
        ctx.report.update(runtime_threads=n, threads_check="skipped: native segments only")
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

    from korch.selection import beats

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


def step_cuda_graph(ctx: Context) -> None:
    """Note [CUDA graph choice] (korch.executable.device); cuda target only."""
    from korch.executable.device import choose_cuda_graph
    from korch.profile.e2e import random_feeds

    if ctx.settings.target == "cuda" and ctx.executable is not None:
        ctx.report.update(choose_cuda_graph(ctx.executable, random_feeds(ctx.executable.inputs)))


def step_measure(ctx: Context) -> None:
    from korch.profile.e2e import compare_with_onnxruntime

    assert ctx.executable is not None
    ctx.report.update(compare_with_onnxruntime(ctx.executable, ctx.model, ctx.settings))
    ctx.report.update(generated_share=generated_share(ctx.executable))


def generated_share(exe, runs: int = 5) -> float:
    """The share of end-to-end time spent in korch-generated kernels (``GENERATORS``),
    from a few runs with a clock per step; 0 without a generated kernel."""
    from korch.kernels.registry import GENERATORS
    from korch.profile.e2e import random_feeds, time_steps

    ksteps = exe.kernel_steps()
    if not any(st.backend in GENERATORS for st in ksteps):
        return 0.0
    info = time_steps(exe, random_feeds(exe.inputs), runs=runs, max_seconds=5.0)
    gen = sum(us for st, us in zip(ksteps, info["kernel_us"]) if st.backend in GENERATORS)
    return round(gen / max(info["end_to_end_us"], 1e-9), 3)


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
    ("cuda_graph", step_cuda_graph),
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
        "native_segments": sum(1 for st in ctx.executable.steps if st.backend == "native-segment")
        if ctx.executable is not None
        else 0,
        "kernels_by_backend": _count(c.backend for c in ctx.chosen),
        "region_candidates": sum(1 for c in ctx.candidates if c.kind is KernelKind.REGION),
        "region_kernels": sum(1 for c in ctx.chosen if c.kind is KernelKind.REGION),
        "redundant_primitives": redundant,
        "predicted_latency_us": round(sum(c.cost_us for c in ctx.chosen), 1),
        "buffers": ctx.executable.buffer_stats if ctx.executable else {},
        "stage_seconds": ctx.stage_seconds,
        "skipped": skipped.records(),  # optimizations that raised (Note [Skipped optimizations])
    }
    # how far the sum of the chosen kernels' costs (each measured alone) is from the
    # executable's end-to-end time (issue 25: within 15% once kernels cost in place
    # what they cost alone); baseline plans have no kernel costs
    pred, lat = ctx.report["predicted_latency_us"], ctx.report.get("latency_ms")
    if lat and math.isfinite(pred) and 0 < pred < UNMEASURED_PENALTY_US:
        ctx.report["latency_over_predicted"] = round(lat * 1e3 / pred, 3)
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
        from korch.executable.graph_summary import save_graph_summary

        save_graph_summary(ctx.graph, d)


__all__ = ["STEPS", "Candidate", "Context", "GroupOp", "run_pipeline", "save_outputs"]
