"""Primitive graph -> TVM tensor expression (TE) -> unscheduled TensorIR PrimFunc.

Every compute primitive becomes one ``te.compute`` stage (one TensorIR block named
``n{id}``) whose value matches ``korch.ir.interp`` for that primitive. Scalar
constants are literals. A GATHER whose indices are not an arithmetic progression
reads them from a hidden int32 input appended after the kernel's outputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import te, tirx

from korch.ir.graph import Graph, Node
from korch.ir.ops import GroupOp, Op
from korch.kernels.tvm import fastmath

FLOAT_DTYPES = ("float32", "float64", "float16")
SUPPORTED_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")
_FLOAT_ONLY = frozenset({Op.EXP, Op.LOG, Op.SQRT, Op.TANH, Op.ERF, Op.SIGMOID, Op.POW, Op.FLOOR, Op.CEIL})


_FAST_F32 = {
    Op.EXP: fastmath.exp_f32,
    Op.ERF: fastmath.erf_f32,
    Op.TANH: fastmath.tanh_f32,
    Op.SIGMOID: fastmath.sigmoid_f32,
}


@dataclasses.dataclass
class Lowered:
    func: tirx.PrimFunc
    input_names: list[str]
    output_names: list[str]
    hidden: list[np.ndarray]  # extra int32 arrays passed after the outputs
    block_of: dict[int, str]  # compute node id -> block name
    copies: dict[int, str]  # output position -> name of the block copying it out


def unsupported_reason(g: Graph) -> str | None:
    """Why ``lower`` cannot take ``g`` (None when it can)."""
    for node in g.nodes:
        if node.op in GroupOp.SOURCE:
            if node.op is Op.CONST and not node.is_scalar_const:
                return "array constant inside a kernel graph"
        elif node.op not in GroupOp.MEMORY_BOUND:
            return f"{node.op.value} is not memory-bound"
        if node.dtype not in SUPPORTED_DTYPES:
            return f"dtype {node.dtype}"
        if node.op in _FLOAT_ONLY and node.dtype not in FLOAT_DTYPES:
            return f"{node.op.value} on {node.dtype}"
        if node.op in (Op.CAST,) and node.attr("to") not in SUPPORTED_DTYPES:
            return f"cast to {node.attr('to')}"
    if not g.outputs:
        return "no outputs"
    for nid in g.outputs.values():
        if g.nodes[nid].op in GroupOp.SOURCE:
            return "an output is an input"
    return None


def _const(value, dtype: str):
    if dtype == "bool":
        return tirx.const(bool(value), "bool")
    return tirx.const(value, dtype)


def _unflatten(flat, shape):
    idx = []
    for d in reversed(shape):
        idx.append(tirx.floormod(flat, d) if d != 1 else 0)
        flat = tirx.floordiv(flat, d)
    return idx[::-1]


def _flatten(idx, shape):
    flat = 0 if not idx else None
    for i, d in zip(idx, shape):
        flat = i if flat is None else flat * d + i
    return flat


def _reshape_index(out_idx, out_shape, in_shape):
    """Map an index of ``out_shape`` to ``in_shape``, matching equal leading/trailing dims."""
    out_shape, in_shape = list(out_shape), list(in_shape)
    head: list = []
    while out_shape and in_shape and out_shape[0] == in_shape[0]:
        head.append(out_idx[0])
        out_idx, out_shape, in_shape = out_idx[1:], out_shape[1:], in_shape[1:]
    tail: list = []
    while out_shape and in_shape and out_shape[-1] == in_shape[-1]:
        tail.insert(0, out_idx[-1])
        out_idx, out_shape, in_shape = out_idx[:-1], out_shape[:-1], in_shape[:-1]
    out_idx = [i for i, d in zip(out_idx, out_shape) if d != 1]
    out_shape = [d for d in out_shape if d != 1]
    if not in_shape:
        mid = []
    elif not out_shape:
        mid = [0 for _ in in_shape]
    else:
        mid = _unflatten(_flatten(out_idx, out_shape), in_shape)
    return head + mid + tail


# TVM's registered max/min reducers (identity: the lowest/highest finite value) so
# that rfactor can vectorise them; a row of only -inf therefore reduces to the lowest
# finite float, not -inf (documented limitation).
_REDUCERS = {Op.REDUCE_SUM: te.sum, Op.REDUCE_MAX: te.max, Op.REDUCE_MIN: te.min}


def _arith_progression(values) -> tuple[int, int] | None:
    if len(values) == 1:
        return values[0], 0
    step = values[1] - values[0]
    if all(values[i] == values[0] + i * step for i in range(len(values))):
        return values[0], step
    return None


class _Lowerer:
    def __init__(self, g: Graph, dynamic: Dynamic | None = None):
        self.g = g
        self.tensors: dict[int, te.Tensor] = {}
        self.hidden: list[tuple[te.Tensor, np.ndarray]] = []
        self.dyn = dynamic

    def shape(self, nid: int) -> tuple:
        """Node ``nid``'s shape, its dynamic dims (if any) the symbol."""
        shape = self.g.nodes[nid].shape
        if self.dyn is None or not self.dyn.dims.get(nid):
            return shape
        return tuple(self.dyn.n if j in self.dyn.dims[nid] else d for j, d in enumerate(shape))

    def value(self, nid: int, idx) -> tirx.PrimExpr:
        node = self.g.nodes[nid]
        if node.is_scalar_const:
            return _const(node.attr("value"), node.dtype)
        t = self.tensors[nid]
        if node.shape == ():
            return t()
        return t[tuple(idx)]

    def lower(self, nid: int) -> te.Tensor:
        node = self.g.nodes[nid]
        name = f"n{nid}"
        shape = self.shape(nid)
        if self.dyn is not None:
            self.check_dynamic(nid)
        if node.op in GroupOp.ELEMENTWISE:
            fn = lambda *i: self.elementwise(node, list(i))
        elif node.op in GroupOp.REDUCE:
            return self.reduce(nid, name)
        else:
            fn = lambda *i: self.layout(node, nid, list(i))
        return te.compute(shape, fn, name=name)

    # -- elementwise -----------------------------------------------------------------
    def elementwise(self, node: Node, idx) -> tirx.PrimExpr:
        args = [self.value(s, idx if self.g.nodes[s].shape != () else []) for s in node.inputs]
        op, dt = node.op, node.dtype
        if op is Op.CAST:
            (a,) = args
            if dt == "bool":
                return tirx.NE(a, _const(0, str(a.dtype)))
            return a.astype(dt)
        if dt == "float32" and op in _FAST_F32:
            return _FAST_F32[op](args[0])
        if op in _FLOAT_ONLY and dt == "float16":
            # compute transcendental functions in float32 like numpy does
            args = [a.astype("float32") for a in args]
            if op in _FAST_F32:
                return _FAST_F32[op](args[0]).astype("float16")
            return self._elementwise(op, args, "float32").astype("float16")
        return self._elementwise(op, args, dt)

    @staticmethod
    def _elementwise(op: Op, args, dt: str) -> tirx.PrimExpr:
        if op is Op.NEG:
            return tirx.const(0, dt) - args[0] if dt.startswith("uint") else -args[0]
        unary = {
            Op.EXP: te.exp,
            Op.LOG: te.log,
            Op.SQRT: te.sqrt,
            Op.TANH: tirx.tanh,
            Op.ERF: tirx.erf,
            Op.SIGMOID: tirx.sigmoid,
            Op.ABS: tirx.abs,
            Op.FLOOR: tirx.floor,
            Op.CEIL: tirx.ceil,
            Op.NOT: tirx.Not,
        }
        if op in unary:
            return unary[op](args[0])
        if op is Op.RECIPROCAL:
            return tirx.const(1, dt) / args[0] if dt in FLOAT_DTYPES else tirx.truncdiv(tirx.const(1, dt), args[0])
        if op is Op.WHERE:
            return tirx.Select(args[0], args[1], args[2])
        a, b = args
        if op is Op.ADD:
            return a + b
        if op is Op.SUB:
            return a - b
        if op is Op.MUL:
            return a * b
        if op is Op.DIV:
            return a / b if dt in FLOAT_DTYPES else tirx.truncdiv(a, b)
        if op is Op.POW:
            return tirx.power(a, b)
        if op is Op.MAX:
            return tirx.max(a, b)
        if op is Op.MIN:
            return tirx.min(a, b)
        if op is Op.EQUAL:
            return tirx.EQ(a, b)
        if op is Op.LESS:
            return tirx.LT(a, b)
        if op is Op.GREATER:
            return tirx.GT(a, b)
        if op is Op.AND:
            return tirx.And(a, b)
        if op is Op.OR:
            return tirx.Or(a, b)
        raise NotImplementedError(op)

    # -- reduce ------------------------------------------------------------------------
    def reduce(self, nid: int, name: str) -> te.Tensor:
        node = self.g.nodes[nid]
        (src,) = node.inputs
        in_shape = self.g.nodes[src].shape
        axes = node.attr("axes")
        raxes = {a: te.reduce_axis((0, in_shape[a]), f"r{a}") for a in axes}
        reducer = _REDUCERS[node.op]

        def fn(*i):
            idx = [raxes[a] if a in raxes else i[a] for a in range(len(in_shape))]
            return reducer(self.value(src, idx), axis=[raxes[a] for a in axes])

        return te.compute(self.shape(nid), fn, name=name)

    # -- broadcast and layout ----------------------------------------------------------
    def layout(self, node: Node, nid: int, idx) -> tirx.PrimExpr:
        op = node.op
        srcs = [self.g.nodes[s] for s in node.inputs]
        src = node.inputs[0]
        s_shape = srcs[0].shape
        zero = 0
        if op is Op.BROADCAST:
            return self.value(src, [i if d != 1 else zero for i, d in zip(idx, s_shape)])
        if op is Op.RESHAPE:
            return self.value(src, _reshape_index(idx, node.shape, s_shape))
        if op is Op.TRANSPOSE:
            perm = node.attr("perm")
            in_idx = [None] * len(perm)
            for j, p in enumerate(perm):
                in_idx[p] = idx[j]
            return self.value(src, in_idx)
        if op is Op.SLICE:
            starts, steps = node.attr("starts"), node.attr("steps")
            return self.value(src, [i * sp + st for i, st, sp in zip(idx, starts, steps)])
        if op is Op.CONCAT:
            axis = node.attr("axis")
            offsets = np.cumsum([0] + [s.shape[axis] for s in srcs]).tolist()
            i = idx[axis]
            expr = None
            for k in range(len(srcs) - 1, -1, -1):
                sub = list(idx)
                sub[axis] = i - offsets[k]
                v = self.value(node.inputs[k], sub)
                expr = v if expr is None else tirx.if_then_else(i < offsets[k + 1], v, expr)
            return expr
        if op is Op.PAD:
            return self.pad(node, src, s_shape, idx)
        if op is Op.GATHER:
            return self.gather(node, nid, src, s_shape, idx)
        if op is Op.WINDOW:
            kernel, strides, dil = node.attr("kernel"), node.attr("strides"), node.attr("dilations")
            nsp = len(kernel)
            lead = len(s_shape) - nsp
            in_idx = list(idx[:lead])
            for a in range(nsp):
                in_idx.append(idx[lead + a] * strides[a] + idx[lead + nsp + a] * dil[a])
            return self.value(src, in_idx)
        raise NotImplementedError(op)

    def pad(self, node: Node, src: int, s_shape, idx) -> tirx.PrimExpr:
        mode = node.attr("mode", "constant")
        pads = node.attr("pads")
        in_idx = [i - b for i, (b, _) in zip(idx, pads)]
        if mode == "constant":
            conds = []
            for r, d, (b, a) in zip(in_idx, s_shape, pads):
                if b > 0:
                    conds.append(r >= 0)
                if a > 0:
                    conds.append(r < d)
            v = self.value(src, in_idx)
            if not conds:
                return v
            return tirx.if_then_else(tirx.all(*conds), v, _const(node.attr("value", 0.0), node.dtype))
        fixed = []
        for r, d, (b, a) in zip(in_idx, s_shape, pads):
            if b == 0 and a == 0:
                fixed.append(r)
            elif mode == "edge":
                fixed.append(tirx.max(tirx.min(r, d - 1), 0))
            else:  # reflect: -r below, 2(d-1) - r above (pads are < d)
                r2 = tirx.Select(r < 0, -r, r)
                fixed.append(tirx.Select(r2 >= d, 2 * (d - 1) - r2, r2))
        return self.value(src, fixed)

    def gather(self, node: Node, nid: int, src: int, s_shape, idx) -> tirx.PrimExpr:
        axis = node.attr("axis")
        ishape = tuple(node.attr("indices_shape"))
        indices = list(node.attr("indices"))
        gi = idx[axis : axis + len(ishape)]
        flat = _flatten(gi, ishape) if ishape else 0
        prog = _arith_progression(indices)
        if prog is not None:
            start, step = prog
            pos = flat * step + start if step else start
        else:
            t = self._hidden(nid, np.asarray(indices, dtype=np.int32))
            pos = t[flat]
        in_idx = list(idx[:axis]) + [pos] + list(idx[axis + len(ishape) :])
        return self.value(src, in_idx)

    def check_dynamic(self, nid: int) -> None:
        """Refuse a primitive whose index arithmetic would use a dynamic dim's extent
        (Note [Dynamic kernels] in tvm_dynamic): the lowering writes static extents
        there. Elementwise, broadcast, transpose and row reductions are free of them."""
        node, g = self.g.nodes[nid], self.g
        src = node.inputs[0] if node.inputs else None
        dyn_out = set(self.dyn.dims.get(nid, ()))
        dyn_in = set(self.dyn.dims.get(src, ())) if src is not None else set()
        what = None
        if node.op in GroupOp.REDUCE and dyn_in & set(node.attr("axes")):
            what = "reduces over it"
        elif node.op is Op.RESHAPE:
            s_shape, o_shape = g.nodes[src].shape, node.shape
            head = 0
            while head < min(len(s_shape), len(o_shape)) and s_shape[head] == o_shape[head]:
                head += 1
            # only the head (the dims _reshape_index passes through unchanged, before
            # the first that differs) may be dynamic, at the same positions
            if dyn_in != dyn_out or any(d >= head for d in dyn_out):
                what = "reshapes it"
        elif node.op is Op.PAD:
            if any(tuple(node.attr("pads")[d]) != (0, 0) for d in dyn_in):
                what = "pads it"
        elif node.op in (Op.SLICE, Op.CONCAT, Op.GATHER, Op.WINDOW):
            axes = {node.attr("axis")} if node.op in (Op.CONCAT, Op.GATHER) else set()
            if node.op is Op.SLICE:
                starts, steps = node.attr("starts"), node.attr("steps")
                s_shape = g.nodes[src].shape
                axes = {d for d, (st, sp) in enumerate(zip(starts, steps)) if (st, sp) != (0, 1)}
                axes |= {d for d, (a, b) in enumerate(zip(s_shape, node.shape)) if a != b}
            if node.op is Op.WINDOW:
                axes = set(range(len(g.nodes[src].shape) - len(node.attr("kernel")), len(g.nodes[src].shape)))
            if axes & (dyn_in | dyn_out):
                what = f"{node.op.value}s along it"
        if what:
            raise ValueError(f"n{nid} ({node.op.value}) {what}: the dynamic dim must pass through unchanged")

    def _hidden(self, nid: int, arr: np.ndarray) -> te.Tensor:
        t = te.placeholder(arr.shape, "int32", name=f"gidx{nid}")
        self.hidden.append((t, arr))
        return t


@dataclasses.dataclass(frozen=True)
class Dynamic:
    """A dynamic dimension: the symbol ``n`` and, per node, the dims that are it."""

    n: tirx.Var
    dims: dict[int, tuple[int, ...]]


def lower(g: Graph, dynamic: Dynamic | None = None) -> Lowered:
    """The kernel graph ``g`` (extract form) as an unscheduled PrimFunc.

    Parameters are the inputs in ``g.inputs`` order, then the outputs in ``g.outputs``
    order, then hidden index arrays. With ``dynamic``, the dims it names have the
    symbol's extent (bound from the arguments' shapes at call time); a primitive that
    would need their extent in its index arithmetic is refused with ValueError.
    """
    reason = unsupported_reason(g)
    if reason:
        raise ValueError(f"tvm backend cannot lower this kernel: {reason}")
    lw = _Lowerer(g, dynamic)
    input_names = list(g.inputs)
    for name, nid in g.inputs.items():
        node = g.nodes[nid]
        lw.tensors[nid] = te.placeholder(lw.shape(nid), node.dtype, name=name)
    block_of: dict[int, str] = {}
    for nid, node in enumerate(g.nodes):
        if node.op in GroupOp.SOURCE:
            continue
        lw.tensors[nid] = lw.lower(nid)
        block_of[nid] = f"n{nid}"
    # An output read inside the kernel is computed into an internal buffer and copied
    # to its output by an extra block ``o{j}`` (TVM cannot compute_at an output block).
    # A node written to two outputs is copied likewise.
    users = g.users()
    outs: list[te.Tensor] = []
    seen: set[int] = set()
    copies: dict[int, str] = {}
    for j, nid in enumerate(g.outputs.values()):
        if users[nid] or nid in seen:
            name = f"o{j}"
            outs.append(_copy(lw.tensors[nid], name))
            copies[j] = name
        else:
            outs.append(lw.tensors[nid])
        seen.add(nid)
    args = [lw.tensors[g.inputs[n]] for n in input_names] + outs
    args += [t for t, _ in lw.hidden]
    func = te.create_prim_func(args)
    return Lowered(func, input_names, list(g.outputs), [a for _, a in lw.hidden], block_of, copies)


def _copy(t: te.Tensor, name: str) -> te.Tensor:
    return te.compute(t.shape, lambda *i: t(*i), name=name)


def tvm_version() -> str:
    return str(tvm.__version__)
