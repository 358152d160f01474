"""Tiling solvers over the symbolic model, template selection and latency prediction.

Note [Axis-ordering solver]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
The seed ranks tiling variables by four rules, in this order of precedence: parent
axes above child axes, reduce above non-reduce, broadcast above non-broadcast,
non-innermost above innermost. Ties keep the loop order (outer first).

* ``variant="seed"`` (the seed's prose): the in-core pass walks the in-core (child)
  variables in *reverse* priority order -- so the innermost, plain parallel axes are
  sized first -- setting each to its (aligned) maximum and binary-searching it down
  until the buffer constraints hold, the not-yet-visited ones held at their minimum.
  The multi-core pass then walks the core-splitting variables from large to small
  and keeps the split occupying the most cores within the physical count (with 94
  parallel tiles on 48 cores: 2 tiles per core, 47 cores -- the seed's figure). When
  even one tile per core leaves cores idle, the parallel tile sizes are the next
  core-splitting variables walked from large to small (the seed's fused outer axis
  would be split further; our tiles are per axis).
* ``variant="ge"`` (GE's public code, DESIGN.md): innermost ranks *above*
  non-innermost, the in-core pass walks from the highest priority down, and after the
  multi-core pass it probes neighbouring core counts (steps of 1 up to 4 cores, 2 up
  to 16, 4 above) in both directions while the model improves; core counts are
  balanced so the last core is not left a sliver.

The seed's own example (s2t to 1024, then s1t, s1tt, s1tt2) walks a parent before its
children, which its rules contradict; we follow the rules.

The descent solver starts from the axis-ordering solution (or the smallest tiles) and
moves to the best feasible neighbour (each variable one candidate up or down, the
core count by +-1 and x2 / /2) until no neighbour improves. The exhaustive solver
evaluates the whole candidate grid (tiles: powers of two, aligned on the innermost
axes, and the extent; cores: every count) with the numpy form of the model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence

import numpy as np

from korch.ir.graph import Graph
from korch.tiling.describe import KernelDesc, describe
from korch.tiling.model import TemplateModel, Var
from korch.tiling.target import Target, get_target

SOLVERS = ("axis-seed", "axis-ge", "descent", "exhaustive")


@dataclasses.dataclass(frozen=True)
class TilingSolution:
    """A tiling choice: a pure function of (kernel description, target, solver)."""

    template: str
    axes: tuple[str, ...]  # axis names, loop order of the anchor
    tiles: tuple[int, ...]  # in-core tile size per axis
    cores: int  # cores used (parallel split x reduce split)
    reduce_split: int  # cores one row's reduce tiles are spread over (split-reduce)
    time_us: float  # predicted kernel time
    buffer_bytes: tuple[tuple[str, int], ...]  # occupancy per local level
    target: str
    solver: str
    evaluations: int = 0  # model evaluations the solver spent


# --- axis ordering ----------------------------------------------------------------------
def priority_key(v: Var, variant: str) -> tuple[int, int, int, int]:
    inner = int(v.innermost) if variant == "ge" else int(not v.innermost)
    return (int(v.parent), int(v.reduce), int(v.broadcast), inner)


def axis_order(model: TemplateModel, variant: str = "seed") -> list[Var]:
    """The model's variables from the highest priority down (Note [Axis-ordering solver])."""
    return sorted(model.vars, key=lambda v: tuple(-p for p in priority_key(v, variant)))


def _point(model: TemplateModel, val: dict[str, int]) -> list[int]:
    return [val[v.name] for v in model.vars]


def _largest_feasible(model: TemplateModel, val: dict[str, int], v: Var) -> int:
    """The largest candidate of ``v`` keeping the buffers within capacity (binary search)."""
    cands = v.candidates

    def ok(i: int) -> bool:
        val[v.name] = cands[i]
        return model.probe(_point(model, val))[1]

    if ok(len(cands) - 1):
        return cands[-1]
    lo, hi = 0, len(cands) - 1  # ok(hi) is False
    if not ok(lo):
        return cands[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return cands[lo]


def _core_step(c: int) -> int:
    return 1 if c <= 4 else 2 if c <= 16 else 4


def _most_cores(n: int, limit: int) -> int:
    """Walk block sizes (tiles per core) from large to small; the most cores used within
    ``limit``: 94 tiles on 48 cores -> blocks of 2 -> 47 cores (the seed's figure)."""
    return math.ceil(n / math.ceil(n / limit)) if n > 0 else 1


def _in_core(model: TemplateModel, val: dict[str, int], walk: list[Var]) -> dict[str, int]:
    val = dict(val)
    for v in walk:
        val[v.name] = _largest_feasible(model, val, v)
    return val


def _solve_axis(model: TemplateModel, variant: str) -> dict[str, int]:
    order = axis_order(model, variant)
    tiles = [v for v in order if v.kind == "tile"]
    low = {v.name: v.candidates[0] for v in model.vars}
    cores_max = model.target.cores
    if variant == "seed":
        # children first (reverse priority), then the parents: the core split
        val = _fit_cores(model, _in_core(model, low, list(reversed(tiles))), cores_max)
        if model.target.fork_join and val["c"] > 1:
            # not in the seed (Ascend has no such cost): on a target where using
            # several cores costs a fork/join, one core where the model says it is faster
            one = {**val, "c": 1, **({"k": 1} if "k" in val else {})}
            t1, ok1 = model.probe(_point(model, one))
            if ok1 and t1 < model.probe(_point(model, val))[0]:
                return one
        return val

    # GE: parents first -- the core split over the finest parallel tiling -- then the
    # in-core tiles from the highest priority down, kept within the core split (the
    # model's constraint c <= parallel tiles); then neighbouring core counts
    n_par, n_red = model.tile_counts(_point(model, low))

    def at(cores: int) -> dict[str, int]:
        val = dict(low)
        val["c"] = _most_cores(n_par, cores)
        if "k" in val:
            room = max(1, cores_max // val["c"])
            kvar = next(v for v in model.vars if v.name == "k")
            val["k"] = max((k for k in kvar.candidates if k <= min(room, n_red)), default=1)
        val = _in_core(model, val, tiles)
        np_, _ = model.tile_counts(_point(model, val))
        val["c"] = _most_cores(np_, val["c"])  # balance the last core's load
        return val

    c = _most_cores(n_par, cores_max)
    val = at(c)
    cur_t, cur_ok = model.probe(_point(model, val))
    for direction in (-1, 1):
        probe = c
        while True:
            nxt = max(1, min(cores_max, probe + direction * _core_step(probe)))
            if nxt == probe:
                break
            trial = at(nxt)
            t, ok = model.probe(_point(model, trial))
            if ok and (t < cur_t or not cur_ok):
                val, cur_t, cur_ok, probe = trial, t, ok, nxt
            else:
                break
    return val


def _fit_cores(model: TemplateModel, incore: dict[str, int], want: int) -> dict[str, int]:
    """The seed's multi-core pass for up to ``want`` cores from the in-core tiling.

    Block sizes are walked from large to small keeping the split that occupies the
    most cores within ``want``; if one tile per core still leaves cores idle, the
    parallel tile sizes (outer axes first) are walked from large to small the same
    way; in split-reduce the cores left over share out each row's reduce tiles.
    """
    val = dict(incore)
    n_par, _ = model.tile_counts(_point(model, val))
    val["c"] = _most_cores(n_par, want)
    if val["c"] < want:
        for v in model.vars:  # loop order: outer axes first
            if v.kind != "tile" or v.reduce or val["c"] >= want:
                continue
            keep, keep_cores = val[v.name], val["c"]
            for cand in reversed([c for c in v.candidates if c < keep]):
                val[v.name] = cand
                used = _most_cores(model.tile_counts(_point(model, val))[0], want)
                if used > keep_cores:
                    keep, keep_cores = cand, used
                if used >= want:
                    break
            val[v.name], val["c"] = keep, keep_cores
    if "k" in val:
        _, n_red = model.tile_counts(_point(model, val))
        room = max(1, want // val["c"])
        kvar = next(v for v in model.vars if v.name == "k")
        val["k"] = max((k for k in kvar.candidates if k <= min(room, n_red)), default=1)
    return val


# --- heuristic descent ---------------------------------------------------------------------
def _neighbours(model: TemplateModel, val: dict[str, int]):
    for v in model.vars:
        cur = val[v.name]
        if v.kind == "core":
            moves = {cur - 1, cur + 1, cur * 2, cur // 2, cur - _core_step(cur), cur + _core_step(cur)}
            moves = {m for m in moves if v.lo <= m <= v.hi and m != cur}
            if v.name == "k":
                moves = {m for m in moves if m in v.candidates}
        else:
            i = v.candidates.index(cur) if cur in v.candidates else int(np.searchsorted(v.candidates, cur))
            moves = {v.candidates[j] for j in (i - 1, i + 1) if 0 <= j < len(v.candidates)} - {cur}
        for m in sorted(moves):
            yield v.name, m


def _solve_descent(model: TemplateModel, start: dict[str, int], max_iter: int = 200) -> dict[str, int]:
    val = dict(start)
    cur_t, cur_ok = model.probe(_point(model, val))
    for _ in range(max_iter):
        best = None
        for name, m in _neighbours(model, val):
            trial = dict(val)
            trial[name] = m
            t, ok = model.probe(_point(model, trial))
            if ok and (not cur_ok or t < cur_t) and (best is None or t < best[0]):
                best = (t, trial)
        if best is None:
            break
        cur_t, val, cur_ok = best[0], best[1], True
    return val


# --- exhaustive ---------------------------------------------------------------------------
def _solve_exhaustive(model: TemplateModel, max_points: int = 4_000_000, chunk: int = 250_000) -> dict[str, int] | None:
    cands = [np.asarray(v.candidates, dtype=np.float64) for v in model.vars]
    total = math.prod(len(c) for c in cands)
    if total > max_points:
        raise ValueError(f"exhaustive: {total} points exceed {max_points}")
    best_t, best_x = math.inf, None
    shape = [len(c) for c in cands]
    for start in range(0, total, chunk):
        flat = np.arange(start, min(total, start + chunk))
        idx = np.unravel_index(flat, shape)
        cols = [c[i] for c, i in zip(cands, idx)]
        t, ok = model.evaluate_grid(cols)
        t = np.where(ok, t, np.inf)
        j = int(np.argmin(t))
        if t[j] < best_t:
            best_t, best_x = float(t[j]), [int(col[j]) for col in cols]
    if best_x is None:
        return None
    return dict(zip((v.name for v in model.vars), best_x))


# --- driver ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def models_for(desc: KernelDesc, target: Target, algebra: str = "fast") -> tuple[TemplateModel, ...]:
    """The kernel's template models, compiled by the fast algebra (the same numbers as
    the sympy form; Note [Fast model algebra])."""
    return tuple(TemplateModel(desc, target, tpl, algebra) for tpl in desc.templates)


def solve_template(model: TemplateModel, solver: str) -> dict[str, int] | None:
    """Variable values chosen by ``solver`` for one template, or None if none is feasible."""
    if solver in ("axis-seed", "axis-ge"):
        val = _solve_axis(model, solver.split("-")[1])
    elif solver == "descent":
        # several starts (both axis-ordering variants, the smallest tiles), keep the best
        best = None
        for start in (
            _solve_axis(model, "ge"),
            _solve_axis(model, "seed"),
            {v.name: v.candidates[0] for v in model.vars},
        ):
            cand = _solve_descent(model, start)
            t, ok = model.probe(_point(model, cand))
            if ok and (best is None or t < best[0]):
                best = (t, cand)
        if best is None:
            return None
        val = best[1]
    elif solver == "exhaustive":
        return _solve_exhaustive(model)
    else:
        raise KeyError(f"unknown solver {solver!r} ({', '.join(SOLVERS)})")
    return val if model.probe(_point(model, val))[1] else None


def _solution(model: TemplateModel, val: dict[str, int], solver: str, evaluations: int) -> TilingSolution:
    x = _point(model, val)
    t, _ = model.probe(x)
    levels = [lv.name for lv in model.target.local_levels]
    return TilingSolution(
        template=model.template,
        axes=tuple(a.name for a in model.desc.axes),
        tiles=model.tiles(x),
        cores=model.cores(x),
        reduce_split=int(val.get("k", 1)),
        time_us=t,
        buffer_bytes=tuple(zip(levels, model.buffer_bytes(x))),
        target=model.target.name,
        solver=solver,
        evaluations=evaluations,
    )


def _fewer_cores(model: TemplateModel, val: dict[str, int]) -> dict[str, int]:
    """``val`` on one core when the model predicts the split saves less than the
    target's ``parallel_margin`` (Note [Parallel margin] in target.py)."""
    margin = model.target.parallel_margin
    if margin <= 0 or val.get("c", 1) <= 1 or val.get("k", 1) > 1:
        return val
    one = {**val, "c": 1}
    t_one, ok = model.probe(_point(model, one))
    t_par, _ = model.probe(_point(model, val))
    return one if ok and t_one <= t_par * (1.0 + margin) else val


def solve(
    kernel: KernelDesc | Graph,
    target: Target | str,
    solver: str = "axis-ge",
    templates: Sequence[str] | None = None,
    one_core: bool = False,
) -> TilingSolution | None:
    """The best tiling over the kernel's templates (template selection), or None.

    Precondition: ``kernel`` is a memory-bound kernel graph or its description. None
    means no template has a tiling whose buffers fit the target's local levels.
    ``one_core``: as on ``target.replace(cores=1)``, on the target's own models
    (``TemplateModel.one_core``: no second build).
    """
    desc = kernel if isinstance(kernel, KernelDesc) else describe(kernel)
    tgt = get_target(target) if isinstance(target, str) else target
    models = [m for m in models_for(desc, tgt) if templates is None or m.template in templates]
    return best_over([m.one_core() for m in models] if one_core else models, solver)


def best_over(models: Sequence[TemplateModel], solver: str) -> TilingSolution | None:
    """The best tiling ``solver`` finds over these template models (template selection)."""
    best: TilingSolution | None = None
    for model in models:
        before = model.evaluations
        val = solve_template(model, solver)
        if val is None:
            continue
        val = _fewer_cores(model, val)
        sol = _solution(model, val, solver, model.evaluations - before)
        if best is None or sol.time_us < best.time_us:
            best = sol
    return best


def timed_solve(desc: KernelDesc, target: Target, solver: str) -> tuple[TilingSolution | None, float]:
    """``solve`` and its wall time in seconds (models built beforehand, as GE does at compile time)."""
    models_for(desc, target)
    t0 = time.perf_counter()
    sol = solve(desc, target, solver)
    return sol, time.perf_counter() - t0


_PREDICTED: dict[tuple[str, Target], float] = {}


def predict_latency_us(kgraph: Graph, target: Target | str = "cpu") -> float:
    """Predicted latency of a memory-bound kernel graph (the descent solver's tiling).

    ``inf`` when no tiling fits. Cached by the kernel's printed form, so structurally
    equal candidates cost one model build.
    """
    from korch.ir.text import print_graph

    tgt = get_target(target) if isinstance(target, str) else target
    key = (print_graph(kgraph), tgt)
    if key not in _PREDICTED:
        sol = solve(describe(kgraph), tgt, "descent")
        _PREDICTED[key] = math.inf if sol is None else sol.time_us
    return _PREDICTED[key]


def grid_points(model: TemplateModel) -> int:
    return math.prod(len(v.candidates) for v in model.vars)


__all__ = [
    "SOLVERS",
    "TilingSolution",
    "axis_order",
    "best_over",
    "grid_points",
    "models_for",
    "predict_latency_us",
    "priority_key",
    "solve",
    "solve_template",
    "timed_solve",
]
