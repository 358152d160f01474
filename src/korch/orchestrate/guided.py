"""The profile step: tile configs for generated kernels, and model-guided profiling.

Note [Model-guided profiling]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Measuring every candidate kernel is what made Korch take hours. The tiling model
(``korch.tiling``) predicts a generated (memory-bound) kernel's latency in
milliseconds, so the orchestrator decides what is worth measuring:

1. every candidate's tile config is chosen (``Settings.tile_configs``: the tiling
   model's, Note [Tiling to TileConfig], or the rule's ``default_tile_config``) and
   the model predicts its latency from the same solution; linear kernels (a MatMul or
   Conv with its epilogue, several library backends) get a roofline estimate
   (``korch.rewrite.cost``: flops and bytes; ``Settings.guided_linear``); opaque
   kernels and any kernel the model cannot describe are measured outright;
2. costs: the measurement where there is one (this run's or the database's), else the
   prediction times an *optimistic scale*: ``exp(mean - z * sd)`` of
   log(measured / predicted) over the kernels of the same class (generated or linear)
   measured so far. A few kernels of each class (``SEED_PER_CLASS``, spread over the
   predicted costs; first among those an uncalibrated round chooses, which a round
   would measure anyway) are measured before the first round; a kernel with a measured
   *neighbour* (Note [Measured neighbours]) takes the neighbour's error instead of the
   class scale. With no seeds, the scale assumed the model's level right, and on a
   machine where it was not (the linear roofline predicted mlp's MatMuls at 86 us,
   onnxruntime ran them in 36-38) the first round settled on measured library regions,
   1.21x slower end to end than what exhaustive profiling found (the model
   ranks kernels; its level drifts with machine load and calibration; ``z`` is
   ``Settings.guided_optimism``, sd is shrunk towards a prior of 0.5 while few
   kernels are measured);
3. solve the BLP of every partition on these costs; measure each chosen kernel not
   yet measured (plus, if ``guided_rivals`` > 0, up to that many *near rivals* per
   chosen kernel: unmeasured candidates of the same partition sharing a primitive
   with it whose cost per primitive is within ``guided_rival_factor`` of its own);
4. repeat until a round chooses only measured kernels (or, per partition, comes
   within ``guided_tolerance`` of the measured-only plan: Note [Guided tolerance]). Because unmeasured kernels
   were costed optimistically, that choice is optimal unless some unmeasured kernel
   is faster than its optimistic estimate (a lower bound, as in branch and bound).
5. a budget: once profiling has taken ``Settings.profile_budget_s`` the rounds turn
   pessimistic (``z`` negated: unmeasured kernels assumed as slow as the model's error
   plausibly allows), so the BLP keeps to measured kernels unless an unmeasured one is
   clearly better, and the rounds end within a few more. segformer_b1 (9032
   candidates) took 50 rounds and 598 s without it. Report: ``profiling_budget_round``,
   the round the budget ran out in (None: it did not).
6. a hard stop: past ``HARD_BUDGET_FACTOR`` times the budget no round starts. Each
   round measures every kernel of the plan it picks, so the measured kernels hold a
   whole plan and the final solve has one. segformer_b16's pessimistic rounds
   (batch-16 kernels of seconds each) ran 186 s past the budget: a 644 s optimize,
   over the 10-minute target. Report: ``profiling_stop_round`` (None: not reached).

The final orchestration (``step_orchestrate``) sees measured costs only (unmeasured
candidates are unavailable). It is optimal over the measured candidates: the last
round's choice is all measured and optimal for costs that are, for every other
candidate, at least its optimistic estimate. It misses a candidate only when the
model overestimates it by more than ``z`` deviations: ``z`` trades measurements
against that risk (on mlp with a +-40% oracle: z=0.5 measures 10% of the workloads,
z=1 17%, both find the exhaustive optimum), and ``--exhaustive-profiling`` measures
everything.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

from korch.executable.views import VIEW_US, view_of
from korch.ir.graph import Graph
from korch.ir.subgraph import KernelKind
from korch.orchestrate.plan import fall_back, native_segments, step_us


@dataclasses.dataclass
class GuidedStats:
    rounds: int = 0
    predicted: int = 0  # workloads with a model prediction
    prediction_seconds: float = 0.0
    budget_round: int | None = None  # the round the profiling budget ran out in
    seeded: int = 0  # workloads measured before the first round (``_seed``)
    share_round: int | None = None  # the round the measurement share budget ran out in
    started: float = dataclasses.field(default_factory=time.perf_counter)
    stop_round: int | None = None  # the round the hard stop ended profiling in (step 6)
    composed_rounds: int = 0  # the rounds of Note [Composed pass]


HARD_BUDGET_FACTOR = 1.5  # step 6 of Note [Model-guided profiling]


def _cost(results, w, backends, native: bool = False) -> float | None:
    """Best measured cost of a workload as a step (``step_us``); None while some
    backend is unmeasured."""
    best = math.inf
    for b in backends:
        m = results.get((w, b))
        if m is None:
            return None
        best = min(best, step_us(m, b, native))
    return best


def step_profile(ctx) -> None:
    """Pipeline step ``profile`` (Note [Model-guided profiling])."""
    from korch.diagnostics import Skipped, record
    from korch.ir.subgraph import extract, kernel_consts
    from korch.kernels.tvm.tiling import config_key
    from korch.orchestrate.confirm import confirm_near_ties
    from korch.profile import ProfileStats, Workload, profile, versions_of
    from korch.profile.db import ResultsDB
    from korch.profile.worker import WorkerPool

    g, s = ctx.graph, ctx.settings
    assert g is not None
    workloads: dict[str, Workload] = {}
    for c in ctx.candidates:
        if c.hash not in workloads:
            workloads[c.hash] = Workload(c.hash, c.kind, extract(g, c.kernel), kernel_consts(g, c.kernel), c.backends)

    gs = GuidedStats()
    pred: dict[str, float] = {}
    t0 = time.perf_counter()
    generated = [w for w in workloads.values() if "tvm" in w.backends]
    if generated:
        from korch.kernels.tvm.backend import vector_bytes
        from korch.orchestrate.predict import predict_all

        vb = vector_bytes()
        for w, (cfg, p) in zip(generated, predict_all([w.kgraph for w in generated], s, vb)):
            if isinstance(cfg, Skipped):  # not generatable: no tvm candidate (Note [Skipped optimizations])
                record("tiling", w.hash[:16], cfg.message, error=cfg.error)
                w.backends = _without_tvm(w.kgraph, w.backends)
                continue
            w.tile_config, w.config = cfg, config_key(cfg)
            if p is not None and w.backends == ("tvm",):
                pred[w.hash] = p
    klass = dict.fromkeys(pred, KernelKind.MEMORY)
    if s.guided_linear:
        from korch.rewrite.cost import default_cost

        for w in workloads.values():
            if w.kind == KernelKind.LINEAR and w.hash not in pred and w.backends:
                # roofline, Note [Model-guided profiling]; its epilogue in registers
                pred[w.hash] = default_cost.linear_kernel(w.kgraph) * 1e6
                klass[w.hash] = KernelKind.LINEAR
    gs.prediction_seconds = time.perf_counter() - t0
    gs.predicted = len(pred)

    db = ResultsDB(s.db_path)
    pool = WorkerPool(s.num_threads, (s.warmup, s.repeat, s.min_repeat_ms), s.kernel_timeout_s)
    stats = ProfileStats()
    results: dict = {}
    confirmed = (0, 0)

    fallback = {c.hash: c.fallback for c in ctx.candidates if c.fallback}

    def measure(ws) -> None:
        if not ws:
            return
        r, st = profile(ws, db, s.target, s, progress=s.progress, pool=pool)
        results.update(r)
        for f in ("requested", "cached", "measured", "failed"):
            setattr(stats, f, getattr(stats, f) + getattr(st, f))
        stats.seconds += st.seconds
        measure(fall_back(ws, results, fallback))  # Note [Fallback backends]

    try:
        if not s.guided_profiling or not pred:
            measure(list(workloads.values()))
            gs.rounds = 1
        else:
            # what the database already holds counts as measured (no job is run for it)
            for w in workloads.values():
                for b in w.backends:
                    m = db.lookup(w.hash, s.target, b, w.config, versions_of(b))
                    if m is not None:
                        results[(w.hash, b)] = m
            measure(fall_back(workloads.values(), results, fallback))
            measure([w for h, w in workloads.items() if h not in pred])
            # Note [Model-guided profiling], step 2: seeds among what an uncalibrated
            # first round would choose
            z = s.guided_optimism
            first = _round_wants(ctx, workloads, pred, results, klass, z, 0.0)
            seed = _seed(pred, klass, {h for h, _ in results}, first)
            gs.seeded = len(seed)
            measure([workloads[h] for h in seed])
            _guided_rounds(ctx, workloads, pred, results, measure, gs, klass)
            gs.composed_rounds = _composed_rounds(ctx, workloads, pred, results, measure, klass, gs.started)
            # requested: the pairs the guided rounds needed (from the database or measured)
            stats.requested = len(results)
            stats.cached = len(results) - stats.measured
        confirmed = confirm_near_ties(ctx, workloads, results, db, pool)
    finally:
        pool.close()
        db.close()

    _record_build_failures(workloads, results)
    for c in ctx.candidates:  # a failed tiling took tvm away, a fallback joined (Notes [Skipped
        c.backends = workloads[c.hash].backends  # optimizations], [Fallback backends])
    ctx.candidates = [c for c in ctx.candidates if c.backends]
    measured_hashes = set()
    native = native_segments(s)
    for c in ctx.candidates:
        w = workloads[c.hash]
        c.tile_config = w.tile_config
        for b in c.backends:
            m = results.get((c.hash, b))
            if m is not None:
                measured_hashes.add(c.hash)
                us = step_us(m, b, native)
                if us < c.cost_us:
                    c.cost_us, c.backend = us, b
        tvm = results.get((c.hash, "tvm"))
        if native and "tvm" in c.backends and (tvm is None or tvm.ok) and view_of(ctx.graph, c.kernel.nodes):
            c.cost_us, c.backend = VIEW_US, "tvm"  # Note [Views in a segment]
    ctx.report.update(
        workloads=len(workloads),
        measurements_requested=stats.requested,
        measurements_cached=stats.cached,
        candidates_measured=stats.measured,
        measurements_failed=stats.failed,
        candidates_predicted=sum(1 for c in ctx.candidates if c.hash not in measured_hashes),
        profiling_rounds=gs.rounds,
        profiling_budget_round=gs.budget_round,
        profiling_stop_round=gs.stop_round,
        profiling_share_round=gs.share_round,
        profiling_seeded=gs.seeded,
        profiling_composed_rounds=gs.composed_rounds,
        measurements_confirmed=confirmed[0],
        confirmed_faster=confirmed[1],
        prediction_seconds=round(gs.prediction_seconds, 3),
        tile_configs=s.tile_configs,
    )


def _without_tvm(kgraph: Graph, backends: tuple[str, ...]) -> tuple[str, ...]:
    """``backends`` less tvm; a single primitive keeps onnxruntime, which runs any one."""
    rest = tuple(b for b in backends if b != "tvm")
    if rest or len(kgraph.compute_ids()) != 1:
        return rest
    from korch.kernels.registry import get_backend

    return ("ort",) if get_backend("ort").supports(kgraph) else ()


def _record_build_failures(workloads: dict, results: dict) -> None:
    """A candidate whose build failed (raised, crashed or ran out of time while
    building) was measured as failed and is not chosen; say so in the report."""
    from korch.diagnostics import record

    for (h, b), m in results.items():
        if not m.ok and m.status != "wrong" and "build" in (m.error or "") and h in workloads:
            record("build", f"{h[:16]}/{b}", m.error, error=m.status)


# workloads of each predicted class measured before the first round (Note [Model-guided
# profiling], step 2): at most this many, and one per SEED_EVERY of the class's workloads
SEED_PER_CLASS = {KernelKind.MEMORY: 4, KernelKind.LINEAR: 2}
SEED_EVERY = 20


def _seed(
    pred: dict[str, float], klass: dict[str, str], measured: set[str], prefer: set[str] | frozenset = frozenset()
) -> list[str]:
    """A few workloads of each predicted class, at the midpoints of equal quantiles of
    its predicted costs, so that the first round's optimistic scale starts from the
    model's level on this machine, not from the assumption that it has none. Classes
    with that many measurements already (a resumed database) get none. A small class
    gets one seed per ``SEED_EVERY`` workloads (at least one).

    Seeds are taken from ``prefer`` first (the kernels an uncalibrated first round
    chooses, which that round would measure anyway), spread over their costs the
    same way; a class with too few there is filled from the rest."""
    out: list[str] = []
    for cls, most in SEED_PER_CLASS.items():
        hs = sorted((h for h in pred if klass.get(h, KernelKind.MEMORY) == cls), key=lambda h: (pred[h], h))
        k = min(most, max(1, -(-len(hs) // SEED_EVERY)))
        have = sum(1 for h in hs if h in measured)
        todo = [h for h in hs if h not in measured]
        k = min(k - have, len(todo))
        if k <= 0:
            continue
        first = [h for h in todo if h in prefer]
        if len(first) >= k:
            out += [first[int((i + 0.5) * len(first) / k)] for i in range(k)]  # quantile midpoints
            continue
        rest = [h for h in todo if h not in prefer]
        k -= len(first)
        out += first + [rest[int((i + 0.5) * len(rest) / k)] for i in range(k)]
    return out


def _optimistic_scale(ratios: list[float], z: float, prior_sd: float = 0.5, prior_n: int = 5) -> float:
    """exp(mean - z * sd) of log(measured / predicted): unmeasured kernels are assumed as
    fast as the model's error plausibly allows (sd shrunk towards ``prior_sd`` while
    few kernels are measured), so a round that picks only measured kernels means no
    unmeasured one is likely to beat them."""
    logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    if not logs:
        return math.exp(-z * prior_sd)
    mean = statistics.fmean(logs)
    var = statistics.pvariance(logs) if len(logs) > 1 else 0.0
    sd = math.sqrt((len(logs) * var + prior_n * prior_sd**2) / (len(logs) + prior_n))
    return math.exp(mean - z * sd)


# Note [Measured neighbours]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The model's error is not independent from kernel to kernel: it is mostly the error
# on the kernel's dominant primitive. Every variant of one Conv with a different
# epilogue inherits the roofline's error on that Conv (opaque: the bare MatMul measured
# 12.7 us against 23.0 predicted, its epilogue variants 14.5-21.9 against 28.3-36.8),
# and every variant of yolo's nearest-upsample Concat inherits the model's error on
# the Gather. With one scale per class, each variant was costed at the class's
# optimistic level, looked a few percent better than its measured sibling, and was
# measured in a round of its own: 7 of opaque's 9 MatMul variants, 12 of yolo's
# upsample variants. So an unmeasured kernel with a measured *neighbour* takes the
# neighbour's error: ``pred * measured_n / pred_n``, times ``exp(-z * sd)`` where sd
# is how well a neighbour's error predicted a measured kernel's own so far (shrunk
# towards a prior while few pairs exist). Neighbours: candidates of the same class
# sharing the linear primitive (linear), or sharing at least half of their primitives
# (generated, Jaccard); the nearest by Jaccard is used. Kernels without one keep the
# class scale.
NEIGHBOUR_OVERLAP = 0.5
NEIGHBOUR_PRIOR_SD = 0.25


def _neighbour_scales(g, cands, known: dict, pred: dict, klass: dict, z: float, prior_n: int = 5) -> dict[str, float]:
    """Workload -> optimistic scale from its nearest measured neighbour (Note [Measured
    neighbours]); workloads without one are absent."""
    from korch.ir.ops import GroupOp

    resid = {
        h: math.log(known[h] / p)
        for h, p in pred.items()
        if known.get(h) is not None and math.isfinite(known[h]) and known[h] > 0 and p > 0
    }
    if not resid:
        return {}
    linear = GroupOp.LINEAR
    index: dict[int, list] = {}
    for c in cands:
        if c.hash in resid:
            for n in c.kernel.nodes:
                index.setdefault(n, []).append(c)

    def nearest(c) -> float | None:
        cls = klass.get(c.hash, KernelKind.MEMORY)
        nodes = set(c.kernel.nodes)
        anchors = {n for n in nodes if g.nodes[n].op in linear} if cls == KernelKind.LINEAR else set()
        best, best_j = None, -1.0
        seen = set()
        for n in nodes:
            for m in index.get(n, ()):
                if m.hash == c.hash or id(m) in seen or klass.get(m.hash, KernelKind.MEMORY) != cls:
                    continue
                seen.add(id(m))
                mn = set(m.kernel.nodes)
                jac = len(nodes & mn) / len(nodes | mn)
                if cls == KernelKind.LINEAR and not anchors & mn:
                    continue
                if cls != KernelKind.LINEAR and jac < NEIGHBOUR_OVERLAP:
                    continue
                if jac > best_j:
                    best, best_j = resid[m.hash], jac
        return best

    # how well a neighbour's error predicts a measured kernel's own, per class
    errs: dict[str, list[float]] = {}
    done: set[str] = set()
    todo = []
    for c in cands:
        if c.hash not in pred:
            continue
        if c.hash in resid:
            if c.hash not in done:
                r = nearest(c)
                if r is not None:
                    done.add(c.hash)
                    errs.setdefault(klass.get(c.hash, KernelKind.MEMORY), []).append(resid[c.hash] - r)
        else:
            todo.append(c)
    sd = {k: _robust_sd(v, NEIGHBOUR_PRIOR_SD, prior_n) for k, v in errs.items()}
    out: dict[str, float] = {}
    for c in todo:
        r = nearest(c)
        if r is not None:
            f = math.exp(r - z * sd.get(klass.get(c.hash, KernelKind.MEMORY), NEIGHBOUR_PRIOR_SD))
            out[c.hash] = min(out.get(c.hash, math.inf), f)  # the most optimistic of its places
    return out


def _robust_sd(errs: list[float], prior_sd: float, prior_n: int) -> float:
    """1.4826 x the median absolute error (the sd of a normal sample, unmoved by the few
    neighbours whose error is unrelated), shrunk towards ``prior_sd`` while few exist."""
    mad = 1.4826 * statistics.median(abs(e) for e in errs) if errs else prior_sd
    return math.sqrt((len(errs) * mad**2 + prior_n * prior_sd**2) / (len(errs) + prior_n))


def _estimate(h: str, known: dict, pred: dict, scale: float | dict) -> float:
    k = known[h]
    if k is not None:
        return k
    if h not in pred:
        return math.inf
    return pred[h] * (scale if isinstance(scale, float) else scale[h])


# Note [Guided tolerance]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# A round's objective on optimistic costs is a lower bound on what any plan of the
# partition costs (as far as the estimates are lower bounds, step 4 of Note
# [Model-guided profiling]); the BLP over measured kernels alone is a plan the final
# solve can always pick. Once the lower bound is within ``Settings.guided_tolerance``
# of that plan, measuring more can gain at most that share, and the partition measures
# nothing more. Without it, yolo_block measured 75-86 of its 331 candidates, one or
# two variants a round for rounds on end whose choices differed by a few percent; with
# 3% it measured 64-70 (benchmarks/RESULTS.md, Auto tiling). Native kernels (no build,
# ms each) are measured whatever the gain: efficientnet_b0's pooled convs saved 1-3%.


def _guided_rounds(
    ctx, workloads, pred, results, measure, gs: GuidedStats, klass: dict | None = None, max_rounds: int = 50
) -> None:
    s = ctx.settings
    tol = s.guided_tolerance
    for _ in range(max_rounds):
        gs.rounds += 1
        z = s.guided_optimism
        budget = s.profile_budget_s
        share = s.guided_share_budget
        if budget and gs.rounds > 1 and time.perf_counter() - gs.started > HARD_BUDGET_FACTOR * budget:
            gs.stop_round = gs.rounds  # step 6: what is unmeasured stays unavailable
            return
        if budget and time.perf_counter() - gs.started > budget:
            gs.budget_round = gs.budget_round or gs.rounds
            z = -abs(z) if z else -1.0  # step 5: pessimistic past the budget
        elif share and _measured_share(ctx.candidates, workloads, results) >= share:
            gs.share_round = gs.share_round or gs.rounds
            z = -abs(z) if z else -1.0  # Note [Measurement share budget]
        want = _round_wants(ctx, workloads, pred, results, klass or {}, z, tol)
        if not want:
            return
        measure([workloads[h] for h in sorted(want)])
    # out of rounds: whatever is still unmeasured stays unavailable to the final solve


# Note [Composed pass]
# ~~~~~~~~~~~~~~~~~~~~
# With library regions among the candidates, the rounds measure what could beat a
# region, and a region, measured outright (it has no prediction), mostly bounds its
# partition: kernels of korch's own that could not beat it kept their optimistic
# estimates and were never measured. The plan check's composed plan (the BLP with
# regions left out, Note [The composed plan] in korch/selection.py) then had no
# measured kernels for the primitives the regions covered: candy_b1's, raced in the
# default check, ran 80.6 ms where the composed-only optimization's plan ran 61.5. So,
# after the rounds, the rounds run again over the candidates less the regions; what
# the first rounds measured counts. Their time budget (steps 5 and 6 of Note
# [Model-guided profiling]) is what the first rounds left of ``profile_budget_s``, and
# at least ``COMPOSED_BUDGET_SHARE`` of it: with a budget of their own, segformer_b1's
# profiling took 351 s instead of 159 (the first rounds had run out of theirs), and its
# optimization 586 s. Their share budget (Note [Measurement share budget]) is their
# own too: ``guided_share_budget`` more than the share already measured. yolo_b1's
# first rounds reached the share in round 3 of 4, so its composed rounds were
# pessimistic from the start: its best composed plan ran 0.86x the model in the check;
# with a share of their own (256 measured, not 169), 0.92x.
# Report: ``profiling_composed_rounds``.
COMPOSED_BUDGET_SHARE = 0.25


def _composed_rounds(ctx, workloads, pred, results, measure, klass: dict, started: float) -> int:
    """Note [Composed pass]: the guided rounds again without the library regions (the
    profiling began at ``started``); the number of rounds run (0 without regions)."""
    import copy

    composed = [c for c in ctx.candidates if c.kind is not KernelKind.REGION]
    if len(composed) == len(ctx.candidates):
        return 0
    view = copy.copy(ctx)
    view.candidates = composed
    # a share of their own (Note [Composed pass])
    share = ctx.settings.guided_share_budget
    if share:
        view.settings = ctx.settings.replace(guided_share_budget=_measured_share(composed, workloads, results) + share)
    gs = GuidedStats()
    spent = gs.started - started
    gs.started -= min(spent, (1.0 - COMPOSED_BUDGET_SHARE) * ctx.settings.profile_budget_s)
    _guided_rounds(view, workloads, pred, results, measure, gs, klass)
    return gs.rounds


# Note [Measurement share budget]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The rounds are branch and bound with a loose bound: an unmeasured kernel is costed
# ``z`` deviations below its expected cost, so each round's newly measured kernels
# mostly come out slower than their estimate, and the next round tries their rivals.
# On yolo_block, whose plans are near-ties between onnxruntime regions and generated
# kernels, that went on for 3 to 8 rounds depending on how the first measurements
# fell: 14-23% of its 331 candidates measured in runs minutes apart, while two
# *exhaustive* runs disagree by 8.7% on the objective (benchmarks/RESULTS.md), so the
# later rounds chased differences below the measurements' own noise. Once
# ``Settings.guided_share_budget`` of the candidates is measured, the rounds turn
# pessimistic like past the time budget (step 5): an unmeasured kernel is then chosen
# only if it is better even at the slow end of its estimate, and the rounds end within
# one or two more. Report: ``profiling_share_round``.


def _measured_share(cands, workloads, results) -> float:
    """Share of the candidates whose workload is measured on every backend."""
    if not cands:
        return 0.0
    done = {h for h, w in workloads.items() if _cost(results, h, w.backends) is not None}
    return sum(1 for c in cands if c.hash in done) / len(cands)


def _round_wants(ctx, workloads, pred, results, klass: dict, z: float, tol: float) -> set[str]:
    """One round: the BLP of every partition on optimistic costs; the unmeasured kernels
    it chooses (and their near rivals, ``Settings.guided_rivals``)."""
    from korch.orchestrate import OrchestrationError, solve
    from korch.orchestrate.choose import with_unmeasured_penalty

    g, s = ctx.graph, ctx.settings
    factor = s.guided_rival_factor
    per_kernel = s.guided_rivals
    by_part: dict[int, list] = {}
    for c in ctx.candidates:
        by_part.setdefault(c.partition, []).append(c)
    # one optimistic scale per class of prediction (tiling model; linear roofline)
    ratios: dict[str, list[float]] = {}
    native = native_segments(s)
    for h, p in pred.items():
        m = _cost(results, h, workloads[h].backends, native)
        if m is not None and math.isfinite(m) and p > 0:
            ratios.setdefault(klass.get(h, KernelKind.MEMORY), []).append(m / p)
    by_class = {k: _optimistic_scale(ratios.get(k, []), z) for k in set(klass.values()) | {KernelKind.MEMORY}}
    known: dict[str, float | None] = {h: _cost(results, h, w.backends, native) for h, w in workloads.items()}
    near = _neighbour_scales(g, ctx.candidates, known, pred, klass, z)
    scale = {h: near.get(h, by_class[klass.get(h, KernelKind.MEMORY)]) for h in pred}

    want: set[str] = set()
    for pi, part in enumerate(ctx.partitions):
        cands = by_part.get(pi, [])
        if not cands:
            continue
        costs = [_estimate(c.hash, known, pred, scale) for c in cands]
        try:
            orch = solve(g, part, [c.kernel for c in cands], costs, time_limit_s=s.blp_time_limit_s)
        except OrchestrationError:
            # every candidate writing some output failed its measurement: the final
            # solve runs that part on onnxruntime at a penalty (Note [Unmeasurable
            # partitions] in orchestrate/choose.py); solved the same way here, so that
            # what the rest of the partition would use is measured
            penal = with_unmeasured_penalty(cands, costs)
            if penal == costs:
                continue
            try:
                orch = solve(g, part, [c.kernel for c in cands], penal, time_limit_s=s.blp_time_limit_s)
            except OrchestrationError:
                continue
        if tol > 0 and any(known[cands[i].hash] is None and cands[i].backends != ("native",) for i in orch.chosen):
            # Note [Guided tolerance]: close enough to what is measured already
            measured_costs = [known[c.hash] if known[c.hash] is not None else math.inf for c in cands]
            try:
                inc = solve(g, part, [c.kernel for c in cands], measured_costs, time_limit_s=s.blp_time_limit_s)
            except OrchestrationError:
                inc = None
            if inc is not None and orch.objective >= (1.0 - tol) * inc.objective:
                continue
        for i in orch.chosen:
            k = cands[i]
            if known[k.hash] is None:
                want.add(k.hash)
            nodes = set(k.kernel.nodes)
            per_prim = costs[i] / max(1, len(nodes))
            rivals = []
            for j, c in enumerate(cands):
                if j == i or known[c.hash] is not None or c.hash in want or not nodes & set(c.kernel.nodes):
                    continue
                r = costs[j] / max(1, len(c.kernel.nodes))
                if r <= factor * per_prim:
                    rivals.append((r, c.hash))
            want.update(h for _, h in sorted(rivals)[:per_kernel])
    return want
