"""Kernel description: a memory-bound kernel graph as a tiled loop nest.

Note [Kernel description]
~~~~~~~~~~~~~~~~~~~~~~~~~
The loop nest iterates over the *anchor*: the largest compute tensor of the kernel
(the last one among equals, so a transpose iterates over its output and a softmax over
its full-size result). Each anchor dim of extent > 1 is one loop axis, flagged
``reduce`` (some REDUCE folds it), ``broadcast`` (some BROADCAST expands along it) and
``innermost`` (the anchor's last axis, and the last non-unit dim of every GM tensor,
which is what a transpose needs contiguous on both sides). A tile variable ``t_i``
(1 <= t_i <= extent) splits axis i into a parent (the tile loop, shared out across
cores) and a child (the in-core tile).

Every tensor is mapped onto the anchor axes by propagating dim correspondences through
the graph in both directions (elementwise: same dims; reduce/broadcast: unit dims;
transpose: permuted; reshape: merged/split groups; window: a strided window; slice,
pad, concat, gather: scaled or unknown). A tensor dim maps to a product of *terms*
``(axis, scale, offset)`` whose tile extent is ``min(dim, ceil(scale * t_axis + offset))``;
``()`` is a unit dim and ``None`` a dim we could not map, loaded whole (conservative).
If some compute tensor cannot be mapped at all, the kernel is described conservatively
as one elementwise-like nest over the largest output, every tensor's tile being the
anchor tile scaled by its relative size (``fallback=True``).

Tensors: GM inputs (loaded through a double-buffered queue), outputs (stored from a
double-buffered queue), local intermediates (one buffer each; RESHAPE is a view).
``live_sets`` are the sets of tensors alive at each step of the per-tile program; the
occupancy model takes the largest. ``pass_of`` supports the multi-pass template:
when a reduce axis is tiled, a value that depends on a reduction is only usable in
the pass after the reduction completes (softmax: max, then exp-sum, then normalise).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp, Op

Term = tuple[int, Fraction, Fraction]  # (axis, scale, offset)
DimMap = "tuple[Term, ...] | None"

_API = {
    Op.ADD: "add",
    Op.SUB: "add",
    Op.MUL: "mul",
    Op.DIV: "div",
    Op.RECIPROCAL: "div",
    Op.EXP: "exp",
    Op.LOG: "log",
    Op.SQRT: "sqrt",
    Op.TANH: "tanh",
    Op.ERF: "erf",
    Op.SIGMOID: "sigmoid",
    Op.POW: "exp",
    Op.CAST: "cast",
    Op.WHERE: "select",
    Op.EQUAL: "compare",
    Op.LESS: "compare",
    Op.GREATER: "compare",
    Op.BROADCAST: "broadcast",
    Op.TRANSPOSE: "transpose",
    Op.SLICE: "copy",
    Op.CONCAT: "copy",
    Op.GATHER: "gather",
    Op.WINDOW: "copy",
}


def _api(graph: Graph, node, stored: bool = False) -> str:
    """The vector API a primitive costs as. A transpose that keeps the innermost axis
    innermost (a head split: [1,64,4,32] -> [1,4,64,32]) moves whole rows, a copy; one
    that moves it is priced as the calibrated transpose (attention's 8k-element head
    splits were predicted 10.5-12 us and ran in 3.1-3.9). A pooling window
    read by its reduction is a view (a copy); one written out as a kernel output is a
    gather whose every lane reads elsewhere, priced as a transpose (YOLO's materialised
    5x5 windows, 409,600 elements: 330-440 us measured, ~0.8-1 ns an element, against
    the calibrated transpose's 0.84; predicted 22-37 us as copies)."""
    if node.op is Op.WINDOW and stored:
        return "transpose"
    if node.op is Op.TRANSPOSE:
        src = graph.nodes[node.inputs[0]].shape
        out_axes = [d for d, e in enumerate(node.shape) if e > 1]
        in_axes = [d for d, e in enumerate(src) if e > 1]
        if out_axes and in_axes and node.attr("perm")[out_axes[-1]] == in_axes[-1]:
            return "copy"
        return "transpose"
    if node.op is Op.PAD:
        # inlined into its consumer, a pad is a bounds test per element (constant) or
        # index arithmetic (reflect, edge): candy's reflect pads ran 3.2x their price
        # as a copy
        return "pad" if node.attr("mode", "constant") == "constant" else "pad_reflect"
    return _API.get(node.op, "add")


@dataclasses.dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    reduce: bool = False
    broadcast: bool = False
    innermost: bool = False
    fixed: bool = False  # tile always the full extent (a pooling window's kernel axes)

    @property
    def parallel(self) -> bool:
        return not self.reduce


@dataclasses.dataclass(frozen=True)
class TensorDesc:
    node: int
    level: str  # "gm" (kernel inputs) or "local" (tiles of computed values)
    role: str  # "input", "output" (computed and stored) or "temp"
    dtype: str
    shape: tuple[int, ...]
    dims: tuple  # per dim: tuple of Terms, () for a unit dim, None when unmapped
    scale: float = 1.0  # fallback: footprint multiplier relative to the anchor tile
    alias: bool = False  # a view of its input (RESHAPE): no allocation, no work

    @property
    def name(self) -> str:
        return f"%{self.node}"

    @property
    def itemsize(self) -> int:
        return 1 if self.dtype == "bool" else np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class ApiCall:
    api: str  # the vector-pipe API (see target.VEC_APIS)
    node: int
    tensor: int  # node whose tile size is the element count per call
    itemsize: int


@dataclasses.dataclass(frozen=True)
class KernelDesc:
    axes: tuple[Axis, ...]
    tensors: tuple[TensorDesc, ...]
    calls: tuple[ApiCall, ...]
    live_sets: tuple[tuple[int, ...], ...]  # node ids alive at once, per step
    pass_nodes: tuple[tuple[int, ...], ...]  # per pass of the multi-pass template: nodes read or computed
    pass_of: tuple[tuple[int, int], ...]  # (compute node, the pass that computes it)
    kind: str  # "elementwise", "reduce", "transpose", "window" or "fallback"
    fallback: bool = False

    def tensor(self, node: int) -> TensorDesc:
        for t in self.tensors:
            if t.node == node:
                return t
        raise KeyError(node)

    @property
    def reduce_axes(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.axes) if a.reduce)

    @property
    def passes(self) -> int:
        return len(self.pass_nodes)

    @property
    def templates(self) -> tuple[str, ...]:
        if not self.reduce_axes:
            return ("elementwise",)
        if all(self.axes[i].fixed for i in self.reduce_axes):
            return ("one-pass",)
        return ("one-pass", "multi-pass", "split-reduce")


class Ghost(tuple):
    """A unit dim left by a reduction, remembering the axis terms it folded, so a later
    BROADCAST back to full size maps onto the same axes. Behaves as ``()`` elsewhere."""

    terms: tuple

    def __new__(cls, terms):
        obj = super().__new__(cls, ())
        obj.terms = terms
        return obj


def _reshape_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Pair dims of two shapes into groups of equal product (unit dims stand alone)."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if i < len(a) and a[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < len(b) and b[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(a) or j >= len(b):
            return None
        gi, gj, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                if i >= len(a):
                    return None
                gi.append(i)
                pa *= a[i]
                i += 1
            else:
                if j >= len(b):
                    return None
                gj.append(j)
                pb *= b[j]
                j += 1
        groups.append((gi, gj))
    return groups


def _map_reshape(src_map: tuple, src: tuple[int, ...], dst: tuple[int, ...]) -> tuple | None:
    groups = _reshape_groups(src, dst)
    if groups is None:
        return None
    out: list = [None] * len(dst)
    for gs, gd in groups:
        for j in gd:
            out[j] = () if dst[j] == 1 else None
        if not gs or not gd:
            continue
        if len(gs) == 1 and len(gd) == 1:
            out[gd[0]] = src_map[gs[0]]
        elif len(gd) == 1:  # merge: the product of the sources' terms
            entries = [src_map[i] for i in gs]
            if all(e is not None for e in entries):
                out[gd[0]] = tuple(t for e in entries for t in e)
        elif len(gs) == 1 and src_map[gs[0]] is not None and len(src_map[gs[0]]) == 1:
            # split: the innermost part carries the tile, outer parts a fraction of it
            (ax, sc, off) = src_map[gs[0]][0]
            inner = 1
            for j in reversed(gd):
                out[j] = ((ax, sc / inner, off / inner),)
                inner *= dst[j]
    return tuple(out)


def _quality(m: tuple | None) -> int:
    return -1 if m is None else sum(e is not None for e in m)


class _Mapper:
    def __init__(self, graph: Graph, anchor: int):
        self.g = graph
        n = graph.nodes[anchor]
        self.axis_of_dim = {}
        for d, ext in enumerate(n.shape):
            if ext > 1:
                self.axis_of_dim[d] = len(self.axis_of_dim)
        self.anchor_shape = n.shape
        self.anchor_map = tuple(
            ((self.axis_of_dim[d], Fraction(1), Fraction(0)),) if ext > 1 else () for d, ext in enumerate(n.shape)
        )
        self.maps: dict[int, tuple] = {anchor: self.anchor_map}

    def _unit(self, shape, m):
        return tuple(() if d == 1 and not isinstance(e, Ghost) else e for d, e in zip(shape, m))

    def forward(self, nid: int, ins: list[tuple | None]) -> tuple | None:
        node, g = self.g.nodes[nid], self.g
        op = node.op
        srcs = [(g.nodes[i], m) for i, m in zip(node.inputs, ins) if g.nodes[i].shape != () and m is not None]
        if not srcs:
            return None
        src, m = srcs[0]
        if op in GroupOp.ELEMENTWISE or op in (Op.PAD, Op.SLICE):
            return self._unit(node.shape, m)
        if op in GroupOp.REDUCE:
            return tuple(
                Ghost(e) if d in node.attr("axes") and e else () if d in node.attr("axes") else e
                for d, e in enumerate(m)
            )
        if op is Op.BROADCAST:
            return tuple(
                e if a == b else e.terms if isinstance(e, Ghost) else None for a, b, e in zip(src.shape, node.shape, m)
            )
        if op is Op.TRANSPOSE:
            return tuple(m[p] for p in node.attr("perm"))
        if op is Op.RESHAPE:
            return _map_reshape(m, src.shape, node.shape)
        if op is Op.CONCAT:
            ax = node.attr("axis")
            return tuple(None if d == ax else e for d, e in enumerate(m))
        if op is Op.WINDOW:
            lead = len(src.shape) - len(node.attr("kernel"))
            return tuple(m[:lead]) + (None,) * (len(node.shape) - lead)
        if op is Op.GATHER:
            ax, idx = node.attr("axis"), tuple(node.attr("indices_shape"))
            return tuple(m[:ax]) + (None,) * len(idx) + tuple(m[ax + 1 :])
        return None

    def backward(self, nid: int, k: int, m: tuple) -> tuple | None:
        node, g = self.g.nodes[nid], self.g
        src = g.nodes[node.inputs[k]]
        op = node.op
        if src.shape == ():
            return None
        if op in GroupOp.ELEMENTWISE or op is Op.PAD:
            return self._unit(src.shape, m)
        if op is Op.SLICE:
            return tuple(
                None if e is None else tuple((a, sc * st, off) for a, sc, off in e) if d > 1 else ()
                for e, st, d in zip(m, node.attr("steps"), src.shape)
            )
        if op in GroupOp.REDUCE:
            axes = node.attr("axes")
            kept = self._unit(src.shape, m)
            if src.shape == self.anchor_shape and all(
                kept[d] == self.anchor_map[d] for d in range(len(kept)) if d not in axes
            ):
                # a reduction over a tensor shaped like the anchor whose kept dims sit
                # where the anchor's do (a second row reduction beside the anchor's,
                # e.g. LayerNorm's mean of the next residual sum): same loop nest
                return self.anchor_map
            return tuple(None if d in axes and src.shape[d] > 1 else e for d, e in enumerate(kept))
        if op is Op.BROADCAST:
            return self._unit(src.shape, m)
        if op is Op.TRANSPOSE:
            out: list = [None] * len(src.shape)
            for i, p in enumerate(node.attr("perm")):
                out[p] = m[i]
            return tuple(out)
        if op is Op.RESHAPE:
            return _map_reshape(m, node.shape, src.shape)
        if op is Op.CONCAT:
            ax = node.attr("axis")
            frac = Fraction(src.shape[ax], node.shape[ax])
            return tuple(
                (None if e is None else tuple((a, sc * frac, off * frac) for a, sc, off in e)) if d == ax else e
                for d, e in enumerate(self._unit(src.shape, m))
            )
        if op is Op.WINDOW:
            kernel, strides, dil = node.attr("kernel"), node.attr("strides"), node.attr("dilations")
            lead = len(src.shape) - len(kernel)
            out = list(m[:lead])
            for i, (kk, s, dl) in enumerate(zip(kernel, strides, dil)):
                e = m[lead + i]
                if e is not None and len(e) == 1 and src.shape[lead + i] > 1:
                    a, sc, off = e[0]
                    span = (kk - 1) * dl + 1
                    out.append(((a, sc * s, off * s + span - s),))
                else:
                    out.append(() if src.shape[lead + i] == 1 else None)
            return tuple(out)
        if op is Op.GATHER:
            ax, nidx = node.attr("axis"), len(node.attr("indices_shape"))
            return tuple(m[:ax]) + (None,) + tuple(m[ax + nidx :])
        return None

    def run(self) -> dict[int, tuple]:
        g, maps = self.g, self.maps
        changed = True
        while changed:
            changed = False
            for nid, node in enumerate(g.nodes):
                if node.op in GroupOp.SOURCE:
                    continue
                ins = [maps.get(i) for i in node.inputs]
                fwd = self.forward(nid, ins)
                if _quality(fwd) > _quality(maps.get(nid)):
                    maps[nid], changed = fwd, True
                m = maps.get(nid)
                if m is None:
                    continue
                for k, src in enumerate(node.inputs):
                    bwd = self.backward(nid, k, m)
                    if _quality(bwd) > _quality(maps.get(src)):
                        maps[src], changed = bwd, True
        return maps


def _compute_nodes(graph: Graph) -> list[int]:
    return [i for i, n in enumerate(graph.nodes) if n.op not in GroupOp.SOURCE]


def _gm_inputs(graph: Graph, compute: list[int]) -> list[int]:
    used = {s for n in compute for s in graph.nodes[n].inputs}
    return [i for i in sorted(used) if graph.nodes[i].op in GroupOp.SOURCE and not graph.nodes[i].is_scalar_const]


def _passes(graph: Graph, compute: list[int]) -> dict[int, int]:
    """Pass in which each node is computed when reduce axes are tiled (Note [Kernel description])."""
    avail: dict[int, int] = {}
    pass_of: dict[int, int] = {}
    for n in compute:
        node = graph.nodes[n]
        p = max((avail.get(i, 0) for i in node.inputs), default=0)
        pass_of[n] = p
        avail[n] = p + 1 if node.op in GroupOp.REDUCE else p
    return pass_of


def describe(graph: Graph) -> KernelDesc:
    """The loop-nest description of a memory-bound kernel graph (Note [Kernel description]).

    Precondition: ``graph`` holds only sources and memory-bound primitives (e.g. the
    output of ``korch.ir.subgraph.extract`` for a 'memory' candidate) and has outputs.
    """
    compute = _compute_nodes(graph)
    if not compute:
        raise ValueError("describe: a kernel needs at least one compute primitive")
    bad = {graph.nodes[n].op for n in compute} - GroupOp.MEMORY_BOUND
    if bad:
        raise ValueError(f"describe: not memory-bound: {sorted(o.value for o in bad)}")
    # the iteration space: the largest computed tensor or reduction input (a global
    # pool iterates over its input); among equals a reduction input (it spans the
    # reduce axes), then the last computed one
    reduced = {graph.nodes[n].inputs[0] for n in compute if graph.nodes[n].op in GroupOp.REDUCE}
    anchor = max(set(compute) | reduced, key=lambda n: (graph.nodes[n].size, n in reduced, n in compute, n))
    maps = _Mapper(graph, anchor).run()
    inputs = _gm_inputs(graph, compute)
    # a gathered axis is legitimately loaded whole; any other unmapped dim means we do
    # not understand the access pattern: describe the kernel conservatively instead
    gathered = {
        (graph.nodes[n].inputs[0], graph.nodes[n].attr("axis")) for n in compute if graph.nodes[n].op is Op.GATHER
    }

    def unmapped(n: int) -> bool:
        m, shape = maps.get(n), graph.nodes[n].shape
        if m is None:
            return graph.nodes[n].size > 1
        return any(e is None and d > 1 and (n, i) not in gathered for i, (e, d) in enumerate(zip(m, shape)))

    fallback = any(unmapped(n) for n in compute + inputs)
    if fallback:
        outs = list(graph.outputs.values()) or compute
        anchor = max(outs, key=lambda n: (graph.nodes[n].size, n))
    a_node = graph.nodes[anchor]
    mapper_axes = [d for d, ext in enumerate(a_node.shape) if ext > 1]

    # --- axes --------------------------------------------------------------------------
    reduce_ax: set[int] = set()
    bcast_ax: set[int] = set()
    inner_ax: set[int] = set()
    fixed_ax: set[int] = set()

    def axes_of(m: tuple | None, dims) -> set[int]:
        if m is None:
            return set()
        return {t[0] for d in dims if m[d] for t in m[d]}

    if not fallback:
        for n in compute:
            node = graph.nodes[n]
            if node.op in GroupOp.REDUCE:
                reduce_ax |= axes_of(maps.get(node.inputs[0]), node.attr("axes"))
            elif node.op is Op.BROADCAST:
                src = graph.nodes[node.inputs[0]].shape
                expanded = [d for d, (a, b) in enumerate(zip(src, node.shape)) if a != b]
                bcast_ax |= axes_of(maps.get(n), expanded)
            elif node.op is Op.WINDOW:
                nk = len(node.attr("kernel"))
                fixed_ax |= axes_of(maps.get(n), range(len(node.shape) - nk, len(node.shape)))
        for n in [anchor, *inputs, *graph.outputs.values()]:
            shape = graph.nodes[n].shape
            last = [d for d, ext in enumerate(shape) if ext > 1]
            if last and maps.get(n) is not None and maps[n][last[-1]]:
                inner_ax.add(maps[n][last[-1]][-1][0])
    elif mapper_axes:
        inner_ax.add(len(mapper_axes) - 1)
    axes = tuple(
        Axis(
            f"a{d}",
            a_node.shape[d],
            reduce=i in reduce_ax,
            broadcast=i in bcast_ax,
            innermost=i in inner_ax,
            fixed=i in fixed_ax,
        )
        for i, d in enumerate(mapper_axes)
    )

    # --- tensors -----------------------------------------------------------------------
    outputs = set(graph.outputs.values())
    users: dict[int, list[int]] = {}
    for n in compute:
        for s in graph.nodes[n].inputs:
            users.setdefault(s, []).append(n)

    def dims_of(n: int) -> tuple[tuple, float]:
        node = graph.nodes[n]
        if fallback:
            full = tuple(((i, Fraction(1), Fraction(0)),) for i in range(len(axes)))
            return full, node.size / max(a_node.size, 1)
        return maps[n] if maps.get(n) is not None else tuple(None if d > 1 else () for d in node.shape), 1.0

    tensors = []
    for n in inputs:
        dims, scale = dims_of(n)
        node = graph.nodes[n]
        tensors.append(TensorDesc(n, "gm", "input", node.dtype, node.shape, dims, scale))
    for n in compute:
        dims, scale = dims_of(n)
        node = graph.nodes[n]
        role = "output" if n in outputs else "temp"
        tensors.append(TensorDesc(n, "local", role, node.dtype, node.shape, dims, scale, alias=node.op is Op.RESHAPE))

    # --- vector API calls per tile -----------------------------------------------------
    calls = []
    for n in compute:
        node = graph.nodes[n]
        itemsize = 1 if node.dtype == "bool" else np.dtype(node.dtype).itemsize
        if node.op is Op.RESHAPE:
            continue
        if node.op in GroupOp.REDUCE:
            calls.append(ApiCall("reduce", n, node.inputs[0], itemsize))
        else:
            calls.append(ApiCall(_api(graph, node, n in outputs), n, n, itemsize))

    # --- liveness over the per-tile program -------------------------------------------
    last_use = {n: max(users.get(n, [n])) for n in inputs + compute}
    for n in outputs:
        last_use[n] = compute[-1]
    live_sets = []
    for step in compute:
        alive = [n for n in inputs if last_use[n] >= step]
        alive += [n for n in compute if n <= step and last_use[n] >= step]
        live_sets.append(tuple(alive))
    uniq = tuple(dict.fromkeys(tuple(s) for s in live_sets))

    pass_of = _passes(graph, compute)
    passes = 1 + max(pass_of.values())
    pass_nodes = []
    for p in range(passes):
        # what pass p computes: its own nodes plus everything they read that is not a
        # reduction completed in an earlier pass (recomputed, inputs reloaded)
        need: set[int] = set()
        stack = [n for n in compute if pass_of[n] == p]
        while stack:
            n = stack.pop()
            if n in need:
                continue
            need.add(n)
            for s in graph.nodes[n].inputs:
                snode = graph.nodes[s]
                if snode.is_scalar_const or s in need:
                    continue
                if snode.op in GroupOp.REDUCE and pass_of[s] < p:
                    continue
                stack.append(s)
        pass_nodes.append(tuple(sorted(need)))

    ops = {graph.nodes[n].op for n in compute}
    if fallback:
        kind = "fallback"
    elif Op.WINDOW in ops:
        kind = "window"
    elif reduce_ax:
        kind = "reduce"
    elif Op.TRANSPOSE in ops:
        kind = "transpose"
    else:
        kind = "elementwise"
    return KernelDesc(
        axes=axes,
        tensors=tuple(tensors),
        calls=tuple(calls),
        live_sets=uniq,
        pass_nodes=tuple(pass_nodes),
        pass_of=tuple(sorted(pass_of.items())),
        kind=kind,
        fallback=fallback,
    )
