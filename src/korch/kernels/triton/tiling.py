"""Choosing a Triton kernel's tiling: the row/column split and block sizes, from the
tiling model's tile (``korch.tiling``, target ``cuda``) or a heuristic, trying
``outer_axes`` from fewest rows up until the generator finds the split feasible."""

from __future__ import annotations

import dataclasses
import math

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp
from korch.kernels.triton.index import pow2_ceil, pow2_floor
from korch.kernels.triton.lower import Infeasible, TritonConfig, TritonSource, anchor_of, generate, has_reduce

MAX_ROW = 16384  # widest row a program holds whole (reductions over the columns)
MAX_TILE = 4096  # elements per program, GPU
MAX_TILE_INTERPRET = 1 << 16  # the interpreter runs programs one by one: fewer, larger ones
REDUCE_CHUNK = 2048


def _warps(elements: int) -> int:
    return max(1, min(8, pow2_floor(max(1, elements // 256))))


def heuristic_config(
    g: Graph, outer_axes: int, interpret: bool = False, cores: int = 132, model_tile: int | None = None
) -> TritonConfig:
    """Block sizes for one ``outer_axes`` by rule; ``model_tile`` (elements per program from
    the tiling model) replaces the rule's tile size when given. Under the interpreter
    (``interpret``), which runs programs one after another, tiles are as large as
    possible: the generated code is the same, with fewer and larger programs."""
    shape = g.nodes[anchor_of(g)].shape
    M = math.prod(shape[:outer_axes])
    N = math.prod(shape[outer_axes:])
    reduce = has_reduce(g)
    cap = MAX_TILE_INTERPRET if interpret else MAX_TILE
    tile = cap if model_tile is None or interpret else max(128, min(cap, pow2_floor(model_tile)))
    if reduce and N <= MAX_ROW:
        bn = pow2_ceil(N)
    else:
        bn = min(pow2_ceil(N), tile)
    bm = max(1, min(pow2_ceil(M), tile // bn))
    if not interpret:
        n_tiles = -(-N // bn)
        while bm > 1 and -(-M // bm) * n_tiles < 2 * cores:
            bm //= 2
    bk = min(pow2_ceil(max(1, N)), MAX_ROW) if reduce else 1
    bk = max(bk, REDUCE_CHUNK)
    elements = bm * bn
    stages = 2 if reduce and _max_reduce_extent(g) > bk else 1
    return TritonConfig(
        outer_axes, bm, bn, bk, _warps(elements), stages, "heuristic" if model_tile is None else "model"
    )


def _max_reduce_extent(g: Graph) -> int:
    best = 0
    for n in g.nodes:
        if n.op in GroupOp.REDUCE:
            s = g.nodes[n.inputs[0]].shape
            best = max(best, math.prod(s[a] for a in n.attr("axes")))
    return best


def model_tile(g: Graph) -> tuple[int, float] | None:
    """Elements per program and predicted time from the auto-tiling model (cuda target)."""
    try:
        from korch.tiling import solve

        sol = solve(g, "cuda", "axis-ge")
    except Exception:  # noqa: BLE001 - the model is advisory; the heuristic takes over
        return None
    if sol is None:
        return None
    return math.prod(sol.tiles), sol.time_us


def choose_and_generate(
    g: Graph, interpret: bool = False, use_model: bool = True, config: TritonConfig | None = None
) -> TritonSource:
    """Generate ``g`` with ``config``, or with the first feasible ``outer_axes`` (fewest rows)
    and block sizes from the tiling model (fallback: the heuristic)."""
    if config is not None:
        return generate(g, config)
    rank = len(g.nodes[anchor_of(g)].shape)
    # under the interpreter the model's tile would be overridden (heuristic_config): skip its solve
    mt = model_tile(g) if use_model and not interpret else None
    last: Exception | None = None
    for p in range(rank + 1):
        cfg = heuristic_config(g, p, interpret, model_tile=mt[0] if mt else None)
        if mt:
            cfg = dataclasses.replace(cfg, predicted_us=mt[1])
        try:
            return generate(g, cfg)
        except Infeasible as e:
            last = e
    raise ValueError(f"triton backend: no feasible row tiling ({last})")
