"""Primitive graph -> Triton kernel source (the ``cuda`` target's generator).

Note [Triton row tiles]
~~~~~~~~~~~~~~~~~~~~~~~
A generated kernel iterates over its *anchor* (the largest output, as in Note [Row
tiling]). The anchor's first ``outer_axes`` axes, flattened, are the *rows* ``rm``;
the rest, flattened, the *columns* ``rn``. Program (pid_m, pid_n) computes a
``[BM, BN]`` tile of the anchor. Every primitive is generated lazily as a Triton
expression *at an index*: a tuple of integer block expressions, one per dim of the
primitive's shape, each depending on some of the tile variables (``rm``, ``rn`` and
reduction columns). Layout primitives and broadcasts are index arithmetic (a transpose
permutes the index, a reshape flattens and unflattens it, a pad reflects it, a concat
selects between clamped indices), elementwise primitives are Triton arithmetic on
their inputs at the same index, and kernel inputs are ``tl.load`` with computed
offsets and the mask of the tile variables the index depends on. Equal (primitive,
index) pairs are generated once (CSE), so a layernorm loads its row once when its
reductions run over the anchor's columns.

A reduction evaluated at an index that depends on the rows only gets a fresh column
variable over its reduced dims (``[1, BK]``), evaluates its input on ``[BM, BK]`` and
reduces along axis 1 (in a loop over chunks when the reduced extent exceeds the
block), giving a ``[BM, 1]`` value. If a reduction is needed at an index that depends
on a column variable, the tile would need a third dimension: that ``outer_axes`` is
infeasible and the generator tries the next (more rows, fewer columns). With all axes
as rows every reduction is feasible unless two reductions nest across different axes.

Values in masked-out lanes are never stored and never reduced (reductions select the
identity there); loads are masked, and concat/pad clamp their indices so that
in-tile lanes never read out of bounds.

Outputs other than the anchor are stored from the same tile: through a projection
onto anchor dims of equal extent (the anchor index being 0 on the other dims), or, if
that needs an infeasible reduction, through the anchor's flat index.

This module is pure Python (no triton import): it produces source text. Index
arithmetic lives in ``triton_index``, the choice of tiling in ``triton_tiling``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from korch.ir.graph import Graph, Node
from korch.ir.ops import GroupOp, Op
from korch.kernels.triton.expr import FLOAT_DTYPES, TL_DTYPE, TRANSCENDENTAL, ew_code, literal
from korch.kernels.triton.index import (
    C,
    Ix,
    flatten,
    ix_add,
    ix_max,
    ix_min,
    ix_mul,
    ix_sub,
    paren,
    pow2_ceil,
    reshape_index,
    unflatten,
)

SUPPORTED_DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")


class Infeasible(Exception):
    """This tiling cannot generate the kernel (a reduction would need a 3-D tile)."""


def unsupported_reason(g: Graph) -> str | None:
    """Why the Triton generator cannot take ``g`` (None when it can). Pure and cheap."""
    for node in g.nodes:
        if node.op in GroupOp.SOURCE:
            if node.op is Op.CONST and not node.is_scalar_const:
                return "array constant inside a kernel graph"
        elif node.op not in GroupOp.MEMORY_BOUND:
            return f"{node.op.value} is not memory-bound"
        if node.dtype not in SUPPORTED_DTYPES:
            return f"dtype {node.dtype}"
        ins = [g.nodes[i].dtype for i in node.inputs]
        if node.op in TRANSCENDENTAL and node.dtype not in ("float32", "float16"):
            return f"{node.op.value} on {node.dtype}"
        if node.op in (Op.DIV, Op.RECIPROCAL, Op.FLOOR, Op.CEIL) and node.dtype not in FLOAT_DTYPES:
            return f"{node.op.value} on {node.dtype}"
        if node.op in GroupOp.REDUCE and node.dtype == "bool":
            return "reduction of bool"
        if node.op is Op.CAST and node.attr("to") not in SUPPORTED_DTYPES:
            return f"cast to {node.attr('to')}"
        if node.op is Op.NOT and ins and ins[0] != "bool":
            return "not on non-bool"
    if not g.outputs:
        return "no outputs"
    for nid in g.outputs.values():
        if g.nodes[nid].op in GroupOp.SOURCE:
            return "an output is an input"
    return None


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """How one kernel is tiled (Note [Triton row tiles])."""

    outer_axes: int  # anchor axes flattened into rows
    block_m: int  # rows per program
    block_n: int  # columns per program
    block_k: int  # most reduction columns per chunk (a loop runs over larger extents)
    num_warps: int = 4
    num_stages: int = 1
    source: str = "heuristic"  # "model" (korch.tiling, cuda target) or "heuristic"
    predicted_us: float | None = None


@dataclasses.dataclass
class TritonSource:
    text: str
    name: str
    grid: tuple[int, int]
    inputs: list[tuple[tuple[int, ...], str]]
    outputs: list[tuple[tuple[int, ...], str]]
    hidden: list[np.ndarray]  # int32 gather tables passed after the outputs
    config: TritonConfig

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class _Col:
    name: str
    mask: str
    loop: bool


class _Gen:
    """Generates one kernel body for one tiling (raises Infeasible)."""

    def __init__(self, g: Graph, anchor: int, cfg: TritonConfig):
        self.g = g
        self.cfg = cfg
        self.top: list[str] = []
        self.top_memo: dict[object, tuple[str, frozenset[str]]] = {}
        self.loop: list[str] | None = None
        self.loop_var: str | None = None
        self.loop_memo: dict[object, tuple[str, frozenset[str]]] = {}
        self.masks: dict[str, str] = {}
        self.counter = 0
        self.hidden: list[np.ndarray] = []
        self.hidden_names: dict[int, str] = {}
        self.cols: dict[tuple, _Col] = {}
        self.input_pos = {nid: i for i, nid in enumerate(g.inputs.values())}
        node = g.nodes[anchor]
        self.anchor = anchor
        shape = node.shape
        p = cfg.outer_axes
        self.M = math.prod(shape[:p])
        self.N = math.prod(shape[p:])
        self.BM, self.BN = cfg.block_m, cfg.block_n
        self.grid = (-(-self.M // self.BM), -(-self.N // self.BN))
        self.top.append(f"rm = tl.program_id(0) * {self.BM} + tl.arange(0, {self.BM})[:, None]")
        self.top.append(f"mmask = rm < {self.M}")
        if self.grid[1] > 1:
            self.top.append(f"rn = tl.program_id(1) * {self.BN} + tl.arange(0, {self.BN})[None, :]")
        else:
            self.top.append(f"rn = tl.arange(0, {self.BN})[None, :]")
            self.cols[(self.BN, self.N, False)] = _Col("rn", "nmask", False)
        self.top.append(f"nmask = rn < {self.N}")
        self.masks = {"rm": "mmask", "rn": "nmask"}
        rows = unflatten(Ix("rm", frozenset({"rm"})), shape[:p], self.M)
        cols = unflatten(Ix("rn", frozenset({"rn"})), shape[p:], self.N)
        self.anchor_idx = [self.bind(i) for i in rows + cols]

    # -- emission ---------------------------------------------------------------------
    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _scope(self, deps: frozenset[str]):
        if self.loop is not None and self.loop_var in deps:
            return self.loop, self.loop_memo
        return self.top, self.top_memo

    def emit(self, key: object, code: str, deps: frozenset[str], prefix: str = "v") -> str:
        lines, memo = self._scope(deps)
        if key in memo:
            return memo[key][0]
        name = self.fresh(prefix)
        lines.append(f"{name} = {code}")
        memo[key] = (name, deps)
        return name

    def bind(self, ix: Ix) -> Ix:
        if ix.const is not None or ix.code.isidentifier():
            return ix
        return Ix(self.emit(("ix", ix.code), ix.code, ix.deps, "i"), ix.deps)

    def mask_of(self, deps: frozenset[str]) -> str | None:
        parts = sorted(self.masks[d] for d in deps)
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return self.emit(("mask", tuple(parts)), " & ".join(parts), deps, "mk")

    # -- values -----------------------------------------------------------------------
    def value(self, nid: int, idx: list[Ix]) -> tuple[str, frozenset[str]]:
        """A Triton expression (a name or a literal) for node ``nid`` at ``idx``."""
        node = self.g.nodes[nid]
        if node.is_scalar_const:
            return literal(node.attr("value"), node.dtype), frozenset()
        idx = [self.bind(i) for i in idx]
        key = ("val", nid, tuple(i.code for i in idx))
        for memo in (self.loop_memo, self.top_memo) if self.loop is not None else (self.top_memo,):
            if key in memo:
                return memo[key]
        if node.op is Op.INPUT:
            code, deps = self.load(nid, idx)
        elif node.op in GroupOp.ELEMENTWISE:
            code, deps = self.elementwise(node, idx)
        elif node.op in GroupOp.REDUCE:
            name, deps = self.reduce(nid, node, idx)
            self.top_memo[key] = (name, deps)
            return name, deps
        else:
            return self.layout(nid, node, idx)
        name = self.emit(key, code, deps)
        return name, deps

    def load(self, nid: int, idx: list[Ix]) -> tuple[str, frozenset[str]]:
        node = self.g.nodes[nid]
        off = self.bind(flatten(idx, node.shape))
        ptr = f"in{self.input_pos[nid]}_ptr"
        mask = self.mask_of(off.deps)
        addr = ptr if off.const == 0 else f"{ptr} + {paren(off.code)}"
        if mask is None:
            return f"tl.load({addr})", off.deps
        return f"tl.load({addr}, mask={mask}, other=0)", off.deps

    def elementwise(self, node: Node, idx: list[Ix]) -> tuple[str, frozenset[str]]:
        args, deps = [], frozenset()
        for s in node.inputs:
            sidx = idx if self.g.nodes[s].shape != () else []
            code, d = self.value(s, sidx)
            args.append(code)
            deps |= d
        return ew_code(node, args, [self.g.nodes[s].dtype for s in node.inputs]), deps

    def reduce(self, nid: int, node: Node, idx: list[Ix]) -> tuple[str, frozenset[str]]:
        (src,) = node.inputs
        s_shape = self.g.nodes[src].shape
        axes = tuple(node.attr("axes"))
        keep = [idx[d] for d in range(len(s_shape)) if d not in axes]
        kdeps = frozenset().union(*(i.deps for i in keep)) if keep else frozenset()
        if kdeps - {"rm"}:
            raise Infeasible(f"reduction %{nid} needed at an index that depends on columns")
        K = math.prod(s_shape[a] for a in axes)
        BK = min(pow2_ceil(K), self.cfg.block_k)
        loop = K > BK
        # save any loop in progress: this reduction is emitted at the top level
        saved = (self.loop, self.loop_var, self.loop_memo)
        self.loop, self.loop_var, self.loop_memo = None, None, {}
        dt = node.dtype
        acc_dt = "float32" if dt == "float16" else dt
        op = node.op
        if op is Op.REDUCE_SUM:
            ident = literal(0, acc_dt)
        elif dt in FLOAT_DTYPES:
            ident = 'float("-inf")' if op is Op.REDUCE_MAX else 'float("inf")'
        else:
            info = np.iinfo(np.dtype(dt))
            ident = str(int(info.min if op is Op.REDUCE_MAX else info.max))
        combine = {
            Op.REDUCE_SUM: "{a} + {b}",
            Op.REDUCE_MAX: "tl.maximum({a}, {b})",
            Op.REDUCE_MIN: "tl.minimum({a}, {b})",
        }[op]
        final = {Op.REDUCE_SUM: "tl.sum", Op.REDUCE_MAX: "tl.max", Op.REDUCE_MIN: "tl.min"}[op]
        try:
            if loop:
                col = self.fresh("rk")
                acc = self.fresh("acc")
                self.top.append(f"{acc} = tl.full([{self.BM}, {BK}], {ident}, {TL_DTYPE[acc_dt]})")
                body: list[str] = []
                self.loop, self.loop_var, self.loop_memo = body, col, {}
                self.masks[col] = f"{col}_mask"
                body.append(f"{col} = k0 + tl.arange(0, {BK})[None, :]")
                body.append(f"{col}_mask = {col} < {K}")
            else:
                c = self.cols.get((BK, K, False))
                if c is None:
                    name = self.fresh("rk")
                    self.top.append(f"{name} = tl.arange(0, {BK})[None, :]")
                    self.top.append(f"{name}_mask = {name} < {K}")
                    c = self.cols[(BK, K, False)] = _Col(name, f"{name}_mask", False)
                    self.masks[name] = c.mask
                col = c.name
            kidx = unflatten(Ix(col, frozenset({col})), tuple(s_shape[a] for a in axes), K)
            sidx: list[Ix] = []
            it = iter(kidx)
            ki = iter(keep)
            for d in range(len(s_shape)):
                sidx.append(next(it) if d in axes else next(ki))
            v, vdeps = self.value(src, sidx)
            if acc_dt != dt:
                v = f"{paren(v)}.to({TL_DTYPE[acc_dt]})"
            mask = self.mask_of(kdeps | {col} | {"rm"})
            sel = f"tl.where({mask}, {v}, {ident})"
            if loop:
                assert self.loop is not None
                self.loop.append(f"{acc} = {combine.format(a=acc, b=sel)}")
                self.top.append(f"for k0 in range(0, {K}, {BK}):")
                self.top.extend("    " + line for line in self.loop)
                red = f"{final}({acc}, axis=1)[:, None]"
            else:
                red = f"{final}({sel}, axis=1)[:, None]"
            if acc_dt != dt:
                red = f"{red}.to({TL_DTYPE[dt]})"
        finally:
            self.loop, self.loop_var, self.loop_memo = saved
        name = self.fresh("r")
        self.top.append(f"{name} = {red}")
        return name, kdeps | frozenset({"rm"})

    def layout(self, nid: int, node: Node, idx: list[Ix]) -> tuple[str, frozenset[str]]:
        op = node.op
        src = node.inputs[0]
        s_shape = self.g.nodes[src].shape
        if op is Op.BROADCAST:
            return self.value(src, [C(0) if d == 1 else i for i, d in zip(idx, s_shape)])
        if op is Op.RESHAPE:
            return self.value(src, reshape_index(idx, node.shape, s_shape))
        if op is Op.TRANSPOSE:
            perm = node.attr("perm")
            in_idx: list[Ix] = [C(0)] * len(perm)
            for j, p in enumerate(perm):
                in_idx[p] = idx[j]
            return self.value(src, in_idx)
        if op is Op.SLICE:
            starts, steps = node.attr("starts"), node.attr("steps")
            return self.value(src, [ix_add(ix_mul(i, sp), C(st)) for i, st, sp in zip(idx, starts, steps)])
        if op is Op.WINDOW:
            kernel, strides, dil = node.attr("kernel"), node.attr("strides"), node.attr("dilations")
            nsp = len(kernel)
            lead = len(s_shape) - nsp
            w_idx = list(idx[:lead])
            for a in range(nsp):
                w_idx.append(ix_add(ix_mul(idx[lead + a], strides[a]), ix_mul(idx[lead + nsp + a], dil[a])))
            return self.value(src, w_idx)
        if op is Op.GATHER:
            return self.gather(nid, node, idx, s_shape)
        if op is Op.CONCAT:
            return self.concat(nid, node, idx)
        if op is Op.PAD:
            return self.pad(nid, node, idx, s_shape)
        raise NotImplementedError(op)

    def gather(self, nid: int, node: Node, idx: list[Ix], s_shape) -> tuple[str, frozenset[str]]:
        axis = node.attr("axis")
        ishape = tuple(node.attr("indices_shape"))
        indices = [int(i) for i in node.attr("indices")]
        gi = idx[axis : axis + len(ishape)]
        flat = flatten(gi, ishape) if ishape else C(0)
        step = indices[1] - indices[0] if len(indices) > 1 else 0
        if all(indices[i] == indices[0] + i * step for i in range(len(indices))):
            pos = ix_add(ix_mul(flat, step), C(indices[0]))
        else:
            if nid not in self.hidden_names:
                self.hidden_names[nid] = f"g{len(self.hidden)}_ptr"
                self.hidden.append(np.asarray(indices, dtype=np.int32))
            flat = self.bind(flat)
            mask = self.mask_of(flat.deps)
            ptr = self.hidden_names[nid]
            load = f"tl.load({ptr} + {paren(flat.code)}" + (f", mask={mask}, other=0)" if mask else ")")
            pos = Ix(self.emit(("gidx", nid, flat.code), load, flat.deps, "i"), flat.deps)
        return self.value(node.inputs[0], list(idx[:axis]) + [pos] + list(idx[axis + len(ishape) :]))

    def concat(self, nid: int, node: Node, idx: list[Ix]) -> tuple[str, frozenset[str]]:
        axis = node.attr("axis")
        srcs = node.inputs
        exts = [self.g.nodes[s].shape[axis] for s in srcs]
        offsets = np.cumsum([0] + exts).tolist()
        i = idx[axis]
        if i.const is not None:
            k = int(np.searchsorted(offsets, i.const, side="right") - 1)
            sub = list(idx)
            sub[axis] = C(i.const - offsets[k])
            return self.value(srcs[k], sub)
        vals = []
        deps = i.deps
        for k, s in enumerate(srcs):
            r = ix_sub(i, C(offsets[k]))
            if k > 0:
                r = ix_max(r, 0)
            if k < len(srcs) - 1:
                r = ix_min(r, exts[k] - 1)
            sub = list(idx)
            sub[axis] = r
            code, d = self.value(s, sub)
            vals.append(code)
            deps |= d
        expr = vals[-1]
        for k in range(len(srcs) - 2, -1, -1):
            expr = f"tl.where({i.code} < {offsets[k + 1]}, {vals[k]}, {expr})"
        return self.emit(("concat", nid, tuple(x.code for x in idx)), expr, deps), deps

    def pad(self, nid: int, node: Node, idx: list[Ix], s_shape) -> tuple[str, frozenset[str]]:
        mode = node.attr("mode", "constant")
        pads = node.attr("pads")
        fixed: list[Ix] = []
        conds: list[str] = []
        for i, d, (b, a) in zip(idx, s_shape, pads):
            r = ix_sub(i, C(b))
            if b == 0 and a == 0:
                fixed.append(r)
                continue
            r = self.bind(r)
            if mode == "constant":
                if b > 0:
                    conds.append(f"({r.code} >= 0)")
                if a > 0:
                    conds.append(f"({r.code} < {d})")
                fixed.append(self.bind(ix_min(ix_max(r, 0), d - 1)))
            elif mode == "edge":
                fixed.append(self.bind(ix_min(ix_max(r, 0), d - 1)))
            else:  # reflect: -r below, 2(d-1) - r above (pads are < d)
                r2 = self.bind(Ix(f"tl.where({r.code} < 0, -{r.code}, {r.code})", r.deps))
                fixed.append(self.bind(Ix(f"tl.where({r2.code} >= {d}, {2 * (d - 1)} - {r2.code}, {r2.code})", r.deps)))
        v, deps = self.value(node.inputs[0], fixed)
        if mode != "constant" or not conds:
            return v, deps
        cdeps = frozenset().union(*(i.deps for i in idx))
        val = literal(node.attr("value", 0.0), node.dtype)
        code = f"tl.where({' & '.join(conds)}, {v}, {val})"
        return self.emit(("pad", nid, tuple(x.code for x in idx)), code, deps | cdeps), deps | cdeps

    # -- outputs ------------------------------------------------------------------------
    _STATE = ("top", "top_memo", "counter", "hidden", "hidden_names", "cols", "masks")

    def _snapshot(self) -> dict:
        import copy

        return {k: copy.copy(getattr(self, k)) for k in self._STATE}

    def _restore(self, snap: dict) -> None:
        for k, v in snap.items():
            setattr(self, k, v)

    def store(self, j: int, nid: int) -> None:
        node = self.g.nodes[nid]
        a_shape = self.g.nodes[self.anchor].shape
        tries = []
        if nid == self.anchor:
            tries.append(("same", list(self.anchor_idx), []))
        else:
            for proj in _projections(node.shape, a_shape):
                o_idx = [C(0) if src is None else self.anchor_idx[src] for src in proj]
                used = {s for s in proj if s is not None}
                extra = [self.anchor_idx[d] for d in range(len(a_shape)) if d not in used and a_shape[d] > 1]
                tries.append(("proj", o_idx, extra))
            flat = self.bind(flatten(self.anchor_idx, a_shape))
            tries.append(
                ("flat", unflatten(flat, node.shape, node.size), [flat] if node.size < math.prod(a_shape) else [])
            )
        err: Exception | None = None
        for kind, o_idx, extra in tries:
            snapshot = self._snapshot()
            try:
                v, vdeps = self.value(nid, o_idx)
            except Infeasible as e:
                self._restore(snapshot)
                err = e
                continue
            off = self.bind(flatten(o_idx, node.shape))
            conds = ["mmask", "nmask"]
            if kind == "proj":
                conds += [f"({e.code} == 0)" for e in extra]
            elif kind == "flat" and extra:
                conds.append(f"({extra[0].code} < {node.size})")
            full = f"[{self.BM}, {self.BN}]"
            offc = (
                off.code if off.deps == frozenset({"rm", "rn"}) else f"tl.zeros({full}, tl.int32) + {paren(off.code)}"
            )
            if vdeps != frozenset({"rm", "rn"}):
                v = f"tl.broadcast_to({v}, {full})"
            self.top.append(f"tl.store(out{j}_ptr + {paren(offc)}, {v}, mask={' & '.join(conds)})")
            return
        raise err or Infeasible("output")


def _projections(o_shape: tuple[int, ...], a_shape: tuple[int, ...]) -> list[list[int | None]]:
    """Ways to map each dim of ``o_shape`` (extent > 1) to an anchor dim of equal extent,
    in order: greedy from the left and from the right."""
    out = []
    for reverse in (False, True):
        proj: list[int | None] = [None] * len(o_shape)
        dims = list(range(len(o_shape)))
        adims = list(range(len(a_shape)))
        if reverse:
            dims.reverse()
            adims.reverse()
        pos = 0
        ok = True
        for d in dims:
            if o_shape[d] == 1:
                continue
            while pos < len(adims) and a_shape[adims[pos]] != o_shape[d]:
                pos += 1
            if pos == len(adims):
                ok = False
                break
            proj[d] = adims[pos]
            pos += 1
        if ok and proj not in out:
            out.append(proj)
    return out


def anchor_of(g: Graph) -> int:
    outputs = list(dict.fromkeys(g.outputs.values()))
    return max(outputs, key=lambda n: (g.nodes[n].size, n))


def has_reduce(g: Graph) -> bool:
    return any(n.op in GroupOp.REDUCE for n in g.nodes)


def generate(g: Graph, cfg: TritonConfig, name: str = "korch_kernel") -> TritonSource:
    """The kernel ``g`` (extract form) as Triton source for the tiling ``cfg`` (may raise Infeasible)."""
    reason = unsupported_reason(g)
    if reason:
        raise ValueError(f"triton backend cannot generate this kernel: {reason}")
    anchor = anchor_of(g)
    gen = _Gen(g, anchor, cfg)
    out_ids = list(g.outputs.values())
    for j, nid in enumerate(out_ids):
        gen.store(j, nid)
    params = [f"in{i}_ptr" for i in range(len(g.inputs))]
    params += [f"out{j}_ptr" for j in range(len(out_ids))]
    params += [f"g{k}_ptr" for k in range(len(gen.hidden))]
    lines = [
        f'"""korch generated Triton kernel: outer_axes={cfg.outer_axes} BM={cfg.block_m} BN={cfg.block_n}'
        f' BK={cfg.block_k} warps={cfg.num_warps} stages={cfg.num_stages} ({cfg.source})"""',
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def {name}({', '.join(params)}):",
    ]
    lines += ["    " + line for line in gen.top]
    text = "\n".join(lines) + "\n"
    inputs = [(g.nodes[n].shape, g.nodes[n].dtype) for n in g.inputs.values()]
    outputs = [(g.nodes[n].shape, g.nodes[n].dtype) for n in out_ids]
    return TritonSource(text, name, gen.grid, inputs, outputs, gen.hidden, cfg)
