"""Tile configs for generated memory-bound CPU kernels, and the default choice.

Note [Row tiling]
~~~~~~~~~~~~~~~~~
A generated kernel is one loop nest built around an *anchor*: the largest output.
The anchor's leading ``parallel_axes`` axes are fused into one parallel loop; each
iteration of it computes one *row* (the block of the anchor those axes fix). Every
reduction and every materialised intermediate the anchor needs is computed inside
that loop (``compute_at``), on the part of it the row needs, so a softmax or a
layernorm is one pass over the rows with the row's intermediates in cache. All other
injective intermediates are inlined into their consumers (recomputed, never stored).

That is only free of redundant work when each row of the anchor needs a distinct row
of every tensor computed at the loop; ``row_aligned`` checks this on the graph: it
walks back from the anchor carrying the number of rows and fails where a primitive
mixes rows (a reduction or broadcast over a leading axis, a transpose that moves a
leading axis, ...). The default picks the fewest leading axes that still give every
thread several rows, among those that are aligned.

This module is pure (no TVM) so the analytical tiling model can import it.
"""

from __future__ import annotations

import dataclasses
import math

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp, Op

# Relative cost of one primitive per element when it is inlined (recomputed per use).
_TRANSCENDENTAL = frozenset({Op.EXP, Op.LOG, Op.TANH, Op.ERF, Op.SIGMOID, Op.POW, Op.SQRT})
_MATERIALISE_COST = 8


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """How one kernel is scheduled (see Note [Row tiling]).

    anchor: node id of the output whose loop nest hosts the others.
    parallel_axes: leading anchor axes fused into the parallel loop (0: no common loop;
        every block then gets its own parallel loop nest).
    inner_tile: when ``parallel_axes`` is the anchor's rank, the fused loop is split and
        this many consecutive elements form one iteration (0: no split).
    vector_width: lanes of the vectorised innermost loop (1: scalar).
    inline: intermediates inlined into their consumers.
    compute_at: blocks computed inside the parallel loop; other non-inlined blocks get a
        loop nest of their own at the root.
    vectorize_reductions: split row reductions into ``vector_width`` partial sums
        (rfactor) so that their inner loop vectorises.
    parallel: run the outer loops on the thread pool (off for tiny kernels, where a
        parallel launch costs more than it saves).
    """

    anchor: int
    parallel_axes: int
    inner_tile: int
    vector_width: int
    inline: tuple[int, ...]
    compute_at: tuple[int, ...]
    vectorize_reductions: bool = True
    parallel: bool = True


# Below this many elements touched, a kernel runs on one thread.
PARALLEL_MIN_ELEMENTS = 1 << 15


def _op_cost(op: Op) -> int:
    if op in _TRANSCENDENTAL:
        return 8
    if op in (Op.DIV, Op.RECIPROCAL):
        return 2
    if op in GroupOp.ELEMENTWISE:
        return 1
    return 0


def _consumers(g: Graph) -> list[list[int]]:
    return g.users()


def _ancestors(g: Graph, nid: int) -> set[int]:
    seen: set[int] = set()
    stack = [nid]
    while stack:
        n = stack.pop()
        for s in g.nodes[n].inputs:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return seen


def choose_inline(g: Graph) -> tuple[int, ...]:
    """Injective intermediates to inline: all but costly ones read by several blocks."""
    outputs = set(g.outputs.values())
    users = _consumers(g)
    cost: dict[int, int] = {}
    inline: list[int] = []
    for nid, node in enumerate(g.nodes):
        if node.op in GroupOp.SOURCE:
            continue
        c = _op_cost(node.op) + sum(cost.get(s, 0) for s in node.inputs)
        keep = nid in outputs or node.op in GroupOp.REDUCE or (len(users[nid]) >= 2 and c >= _MATERIALISE_COST)
        if keep:
            cost[nid] = 0
        else:
            cost[nid] = c
            inline.append(nid)
    return tuple(inline)


def prefix_axes(shape: tuple[int, ...], rows: int) -> int | None:
    """The fewest leading axes whose extents multiply to ``rows`` (None if none do)."""
    if rows == 1:
        return 0
    p = 1
    for k, d in enumerate(shape):
        p *= d
        if p == rows:
            return k + 1
        if p > rows:
            break
    return None


def _input_rows(g: Graph, nid: int, rows: int) -> list[int | None]:
    """Rows of each input of ``nid`` when ``nid`` is split into ``rows`` leading rows."""
    node = g.nodes[nid]
    k = prefix_axes(node.shape, rows)
    ins = [g.nodes[s] for s in node.inputs]
    if k is None:
        return [None] * len(ins)
    op = node.op
    if op in GroupOp.ELEMENTWISE or op is Op.CONCAT and node.attr("axis") >= k:
        return [rows if s.shape != () else 1 for s in ins]
    if op is Op.CONCAT:
        return [None] * len(ins)
    (src,) = ins
    ok: bool
    if op is Op.BROADCAST:
        ok = all(src.shape[i] == node.shape[i] for i in range(k))
    elif op in GroupOp.REDUCE:
        ok = all(a >= k for a in node.attr("axes"))
    elif op is Op.RESHAPE:
        ok = prefix_axes(src.shape, rows) is not None
    elif op is Op.TRANSPOSE:
        ok = tuple(node.attr("perm")[:k]) == tuple(range(k))
    elif op is Op.SLICE:
        ok = all(
            node.attr("starts")[i] == 0 and node.attr("steps")[i] == 1 and node.attr("lengths")[i] == src.shape[i]
            for i in range(k)
        )
    elif op is Op.PAD:
        ok = all(tuple(node.attr("pads")[i]) == (0, 0) for i in range(k))
    elif op is Op.GATHER:
        ok = node.attr("axis") >= k
    elif op is Op.WINDOW:
        ok = k <= len(src.shape) - len(node.attr("kernel"))
    else:
        ok = False
    return [rows if ok else None]


def row_aligned(g: Graph, anchor: int, parallel_axes: int, stored: set[int]) -> bool:
    """Whether every node in ``stored`` splits into the anchor's rows (Note [Row tiling])."""
    rows_of: dict[int, int | None] = {anchor: math.prod(g.nodes[anchor].shape[:parallel_axes])}
    for nid in range(anchor, -1, -1):
        if nid not in rows_of or g.nodes[nid].op in GroupOp.SOURCE:
            continue
        rows = rows_of[nid]
        if rows is None:
            if nid in stored:
                return False
            in_rows: list[int | None] = [None] * len(g.nodes[nid].inputs)
        else:
            in_rows = _input_rows(g, nid, rows)
        for src, r in zip(g.nodes[nid].inputs, in_rows):
            if src in rows_of and rows_of[src] != r:
                r = None
            rows_of[src] = r
    return all(rows_of.get(n) is not None for n in stored if n in rows_of)


def _vector_lanes(extent: int, lanes: int) -> int:
    while lanes > 1 and extent % lanes:
        lanes //= 2
    return lanes


def default_tile_config(g: Graph, num_threads: int, vector_bytes: int = 32) -> TileConfig:
    """A tile config by rule (Note [Row tiling]); ``g`` is an extracted memory-bound kernel.

    ``vector_bytes`` is the host's SIMD register width (16 SSE, 32 AVX2, 64 AVX-512).
    """
    outputs = list(dict.fromkeys(g.outputs.values()))
    anchor = max(outputs, key=lambda n: (g.nodes[n].size, n))
    node = g.nodes[anchor]
    rank = len(node.shape)
    inline = choose_inline(g)
    ancestors = _ancestors(g, anchor)
    stored = {n for n in ancestors if g.nodes[n].op not in GroupOp.SOURCE and n not in inline}
    itemsize = 1 if node.dtype == "bool" else max(1, _itemsize(node.dtype))
    lanes = max(1, vector_bytes // itemsize)

    p_max = rank
    while p_max > 0 and stored and not row_aligned(g, anchor, p_max, stored):
        p_max -= 1
    want = 4 * max(1, num_threads)
    if not stored:
        p = rank
    elif p_max == 0:
        p = 0
    else:
        p = p_max
        for k in range(1, p_max + 1):
            if math.prod(node.shape[:k]) >= want and (k < rank or k == p_max):
                p = k
                break
    inner_tile = 0
    if p == rank and rank > 0:
        inner_tile = _inner_tile(node.size, lanes, num_threads)
        vec = _vector_lanes(inner_tile, lanes) if inner_tile else 1
    else:
        vec = _vector_lanes(math.prod(node.shape[p:]), lanes)
    compute_at = tuple(sorted(stored)) if p > 0 else ()
    return TileConfig(
        anchor=anchor,
        parallel_axes=p,
        inner_tile=inner_tile,
        vector_width=vec,
        inline=inline,
        compute_at=compute_at,
        parallel=num_threads > 1 and _elements(g) >= PARALLEL_MIN_ELEMENTS,
    )


def _elements(g: Graph) -> int:
    """Elements read and written by the kernel."""
    ids = list(g.inputs.values()) + list(g.outputs.values())
    return sum(g.nodes[i].size for i in set(ids))


def _inner_tile(size: int, lanes: int, num_threads: int) -> int:
    """Elements per parallel iteration of a flat loop: a divisor of ``size``, a multiple
    of the lanes, at most 4096 and small enough to give each thread a few iterations."""
    if size <= lanes:
        return 0
    cap = max(lanes, min(4096, size // max(1, 4 * num_threads)))
    best = 0
    t = lanes
    while t <= cap:
        if size % t == 0:
            best = t
        t += lanes
    return best


def _itemsize(dtype: str) -> int:
    import numpy as np

    return np.dtype(dtype).itemsize


# --- tiling solutions -> tile configs (Note [Tiling to TileConfig]) -----------------------

# Note [Tiling to TileConfig]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The tiling model (``korch.tiling``) tiles the loop nest of its *description anchor*
# (the largest compute tensor or reduction input); the generated kernel tiles rows of
# its *schedule anchor* (the largest output). They meet in the count of parallel tiles
# ``n_par``, what the core split shares out:
#
# * core split: ``parallel`` iff the solution uses more than one core;
# * tile size: the schedule's row loop gets the fewest row-aligned leading axes whose
#   rows number at least ``n_par`` and hold at most the model's tile each (Note [Row
#   tiling]; a row cannot split a reduce axis, so a multi-pass tile of all 32
#   channels x 2 of 34 rows becomes rows of one channel, not one row of 32); when
#   the prefix is every axis, the fused loop is split into ``inner_tile`` elements, a
#   multiple of the lanes dividing the size, as close as possible to size / n_par;
# * where intermediates live: with a row-resident template (``elementwise``,
#   ``one-pass``, ``multi-pass``) the stored intermediates are computed per tile inside
#   the row loop (in cache); with ``split-reduce`` over several cores (a row's
#   reduction itself shared out) each block gets its own parallel nest and its
#   intermediates go through memory (``parallel_axes = 0``);
#   a multi-axis row whose last extent is not a multiple of the lanes becomes rows of
#   the last axis (vectorising across axis boundaries costs per-lane index math);
# * vector width: the target's lanes, halved until they divide the innermost tile (a
#   pooling window's axes excepted: vectors run along rows).
#
# Inlining is the rule's (``choose_inline``): the model has no recomputation term.


_REMAPS = (Op.PAD, Op.SLICE, Op.CONCAT, Op.GATHER, Op.WINDOW, Op.TRANSPOSE)


def _stored_and_pmax(g: Graph, anchor: int, inline: tuple[int, ...]) -> tuple[set[int], int]:
    stored = {n for n in _ancestors(g, anchor) if g.nodes[n].op not in GroupOp.SOURCE and n not in inline}
    p_max = len(g.nodes[anchor].shape)
    while p_max > 0 and stored and not row_aligned(g, anchor, p_max, stored):
        p_max -= 1
    return stored, p_max


def _closest_inner_tile(size: int, lanes: int, want: float) -> int:
    """A divisor of ``size`` that is a multiple of ``lanes`` and closest (in ratio) to ``want``."""
    best, best_d = 0, math.inf
    t = lanes
    while t <= min(size // 2, 1 << 16):
        if size % t == 0:
            d = abs(math.log(t / max(want, 1.0)))
            if d < best_d:
                best, best_d = t, d
        t += lanes
    return best


def tile_config_from_solution(g: Graph, sol, num_threads: int, vector_bytes: int = 32, desc=None) -> TileConfig:
    """The ``TileConfig`` applying tiling solution ``sol`` (a ``korch.tiling.TilingSolution``
    for ``g``'s description) to the generated kernel (Note [Tiling to TileConfig]).

    Pure; ``desc`` is ``korch.tiling.describe(g)`` when the caller has it.
    """
    if desc is None:
        from korch.tiling.describe import describe

        desc = describe(g)
    outputs = list(dict.fromkeys(g.outputs.values()))
    anchor = max(outputs, key=lambda n: (g.nodes[n].size, n))
    node = g.nodes[anchor]
    rank = len(node.shape)
    inline = choose_inline(g)
    stored, p_max = _stored_and_pmax(g, anchor, inline)
    itemsize = 1 if node.dtype == "bool" else max(1, _itemsize(node.dtype))
    lanes = max(1, vector_bytes // itemsize)
    tiles = dict(zip(sol.axes, sol.tiles))
    n_par = 1
    tile_elems = 1
    for a in desc.axes:
        t = max(1, min(a.extent, tiles.get(a.name, a.extent)))
        tile_elems *= t
        if not a.reduce:
            n_par *= math.ceil(a.extent / t)
    # vectors run along the last axis that is not a pooling window's: its tile bounds them
    free = [a for a in desc.axes if not a.fixed]
    inner_tile_len = None
    if free and free[-1].innermost and desc.kind != "fallback":  # a fallback's tiles are nominal
        inner_tile_len = max(1, min(free[-1].extent, tiles.get(free[-1].name, free[-1].extent)))
    parallel = num_threads > 1 and sol.cores > 1
    split_reduce = sol.template == "split-reduce" and sol.reduce_split > 1
    # the last axis that is not a unit one (a pooled [1,16,32,32,1,1]: the 32 columns):
    # "rows of the last axis" below are rows of this one
    last = max((d for d, e in enumerate(node.shape) if e > 1), default=rank - 1)
    if split_reduce or (stored and p_max == 0):
        p = 0
    elif not stored:
        p = rank
        # one flat loop over a ragged last axis remaps every lane's index when the
        # kernel pads, slices, concatenates, gathers or transposes: rows of the last
        # axis (a reflect pad of 32 32x32 planes: 23.4 -> 18.6 us; constant 19.4 -> 13.9).
        # So does a flat loop over a reduction's outputs (the reduction loops inside
        # it): a 5x5 max-pool of [1,16,36,36] took 84 us flat, 8.5 us in rows
        remaps = any(g.nodes[n].op in _REMAPS for n in g.compute_ids())
        ragged = remaps and node.shape[last] % lanes
        if 0 < last and (ragged or node.op in GroupOp.REDUCE) and math.prod(node.shape[:last]) >= n_par:
            p = last
    else:
        # the fewest leading axes giving at least as many rows as the model has tiles,
        # each row no larger than the model's tile (a multi-pass tiling splits the
        # reduce axes, which a row cannot: its rows must be small instead)
        p = next(
            (
                k
                for k in range(1, p_max + 1)
                if math.prod(node.shape[:k]) >= n_par and math.prod(node.shape[k:]) <= tile_elems
            ),
            p_max,
        )
        # a row of several axes whose last extent holds no whole vectors is vectorised
        # across axis boundaries (per-lane div/mod, padded tensors' bounds tests): rows
        # of the last axis instead (the grid: candy's [1,32,34,34] InstanceNorm
        # tail 45.5 -> 35.8 us, a YOLO pad [1,16,36,36] 20.8 -> 14.6 us)
        last_row = min(p_max, last)
        if 0 < p < last_row and node.shape[last] % lanes and math.prod(node.shape[:last_row]) >= n_par:
            p = last_row
    inner_tile = 0
    if p == rank and rank > 0:
        inner_tile = _closest_inner_tile(node.size, lanes, node.size / max(1, n_par))
        contiguous = inner_tile or node.size
    else:
        contiguous = math.prod(node.shape[p:]) if p > 0 else node.shape[-1] if rank else 1
    vec = _vector_lanes(contiguous, lanes)
    # a row reduction is vectorised by ``vector_width`` partial sums, which must divide
    # its extent: when the anchor's rows are narrower (InstanceNorm's per-channel
    # 1/std, [1,32,1,1] from 32x32 rows), the widest such reduction sets the width
    # (candy: 30.1 us with one lane, the reduction scalar; predicted 6.2 us)
    for n in stored | {anchor}:
        red = g.nodes[n]
        if red.op in GroupOp.REDUCE and vec < lanes:
            src = g.nodes[red.inputs[0]].shape
            if len(src) - 1 in red.attr("axes"):
                vec = max(vec, _vector_lanes(math.prod(src[a] for a in red.attr("axes")), lanes))
    if inner_tile_len:
        while vec > 1 and vec > inner_tile_len:
            vec //= 2
    return TileConfig(
        anchor=anchor,
        parallel_axes=p,
        inner_tile=inner_tile,
        vector_width=max(1, vec),
        inline=inline,
        compute_at=tuple(sorted(stored)) if p > 0 else (),
        parallel=parallel,
    )


# Note [Loop nests of a generated kernel]
# The fused schedule (tvm_schedule) runs a kernel as one loop nest only when every
# stored block lands under the anchor's row loop. TVM cannot ``compute_at`` a block
# with a consumer outside the loop, so an output that is also read inside the kernel
# (copied out by an ``o{j}`` block) pins itself and everything it reads to the root
# whenever its copy cannot merge into the loop (the scheduler refuses that merge when
# an uncopied reduction is under the loop). YOLO's SPPF chain (three 5x5 max-pools,
# each pool an output) ran as eight nests; with each nest parallel it took 103-118 us
# against 43 us on one core (2 cores): every parallel nest pays the
# target's fork-join. ``root_nests`` predicts the nest count without scheduling (the
# model sees one launch), and ``model_tile_config`` charges the extra nests'
# fork-joins before choosing between the cores the model wanted and one core.


def rfactored(g: Graph, nid: int, cfg: TileConfig) -> bool:
    """Whether the schedule splits reduction ``nid`` into ``vector_width`` partial
    results (``tvm_schedule._Scheduler.rfactor_row``: an extra block, its own nest
    when the reduction is not under the row loop)."""
    node = g.nodes[nid]
    if node.op not in GroupOp.REDUCE:
        return False
    in_shape = g.nodes[node.inputs[0]].shape
    axes = node.attr("axes")
    width = cfg.vector_width
    if width <= 1 or not cfg.vectorize_reductions or len(in_shape) - 1 not in axes:
        return False
    ext = math.prod(in_shape[a] for a in axes)
    return ext % width == 0 and ext >= 2 * width


def root_nests(g: Graph, cfg: TileConfig) -> int:
    """How many loop nests ``tvm_schedule.schedule(..., cfg)`` leaves at the root of
    ``g``'s kernel (Note [Loop nests of a generated kernel]); assumes every inline and
    every row-aligned ``compute_at`` of ``cfg`` succeeds, as the scheduler tries them."""
    users = g.users()
    inline = set(cfg.inline)
    blocks = [n for n, node in enumerate(g.nodes) if node.op not in GroupOp.SOURCE and n not in inline]
    copy_of: dict[int, int] = {}  # source node -> number of copy blocks
    seen: set[int] = set()
    for nid in g.outputs.values():
        if users[nid] or nid in seen:
            copy_of[nid] = copy_of.get(nid, 0) + 1
        seen.add(nid)
    n_copies = sum(copy_of.values())
    anchor = cfg.anchor
    rf = {n for n in blocks if rfactored(g, n, cfg)}
    simple = len(blocks) + len(rf) + n_copies  # one nest per block, rfactor blocks too
    if cfg.parallel_axes == 0:
        return simple

    def stored_consumers(n: int) -> set[int]:
        out: set[int] = set()
        for u in users[n]:
            out |= stored_consumers(u) if u in inline else {u}
        return out

    anchor_copied = anchor in copy_of
    is_reduce = {n: g.nodes[n].op in GroupOp.REDUCE for n in blocks}
    targets = sorted((set(cfg.compute_at) | ({anchor} if anchor_copied else set())) & set(blocks), reverse=True)
    # copies besides the anchor's own first copy, which the anchor's loop computes
    other = {n: k - (1 if n == anchor else 0) for n, k in copy_of.items()}
    copied = {n for n, k in other.items() if k > 0}
    merge_ok = all(n in copied for n in targets if is_reduce[n])
    node = g.nodes[anchor]
    rank = len(node.shape)
    rows = math.prod(node.shape[: cfg.parallel_axes])
    if cfg.parallel_axes == rank and cfg.inner_tile and rows > cfg.inner_tile:
        rows = -(-rows // cfg.inner_tile)
    merged = {n for n in copied if n in targets and merge_ok and prefix_axes(g.nodes[n].shape, rows)}
    under = {anchor} if not anchor_copied else set()
    for n in targets:
        # its copies outside the loop, or a consumer block outside it, pin it to the root
        if (other.get(n, 0) and n not in merged) or not stored_consumers(n) <= under | {anchor}:
            if n == anchor or n in rf:
                return simple  # a half-placed pair: the scheduler starts again, simply
            continue
        under.add(n)
    at_root = [n for n in blocks if n not in under and (n != anchor or anchor_copied)]
    loose_copies = sum(k for n, k in other.items() if n not in merged)
    return 1 + len(at_root) + len(rf & set(at_root)) + loose_copies


def config_key(cfg: TileConfig) -> str:
    """The measurement-database ``config`` string of a tile config: its fields as
    compact, sorted JSON (the tiling stored as data with its measurement)."""
    import json

    return "tile:" + json.dumps(dataclasses.asdict(cfg), sort_keys=True, separators=(",", ":"))


def config_from_key(key: str) -> TileConfig | None:
    """Inverse of ``config_key`` (None for keys that are not tile configs)."""
    import json

    if not key.startswith("tile:"):
        return None
    d = json.loads(key[5:])
    d["inline"], d["compute_at"] = tuple(d["inline"]), tuple(d["compute_at"])
    return TileConfig(**d)


def model_tile_config(
    g: Graph, num_threads: int, vector_bytes: int = 32, target="cpu", solver: str = "descent"
) -> tuple[TileConfig, object | None]:
    """(the tile config the tiling model chooses for ``g``, its ``TilingSolution``);
    the rule's ``default_tile_config`` and None when the model has no tiling for it."""
    from korch.tiling.describe import describe
    from korch.tiling.solvers import solve
    from korch.tiling.target import get_target

    tgt = get_target(target) if isinstance(target, str) else target
    if tgt.cores != num_threads:
        tgt = tgt.replace(cores=max(1, num_threads))
    try:
        desc = describe(g)
        sol = solve(desc, tgt, solver)
    except ValueError:
        sol = None
    if sol is None:
        return default_tile_config(g, num_threads, vector_bytes), None
    cfg = tile_config_from_solution(g, sol, num_threads, vector_bytes, desc)
    nests = root_nests(g, cfg) if cfg.parallel else 1
    if nests > 1 and tgt.fork_join:
        # every parallel nest beyond the first pays a fork-join the model did not see
        # (Note [Loop nests of a generated kernel]): keep the split only if it still wins
        par = dataclasses.replace(sol, time_us=sol.time_us + (nests - 1) * tgt.fork_join * tgt.unit_us)
        one = solve(desc, tgt, solver, one_core=True)
        if one is not None and one.time_us <= par.time_us:
            return tile_config_from_solution(g, one, num_threads, vector_bytes, desc), one
        return cfg, par
    return cfg, sol
