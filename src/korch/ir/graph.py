"""The primitive graph: one frozen node type, a graph, and a builder with shape rules."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from korch.ir.ops import GroupOp, Op

Shape = tuple[int, ...]


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return tuple(_freeze(v) for v in value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclasses.dataclass(frozen=True)
class Node:
    """One primitive. ``inputs`` are ids of earlier nodes in the same graph."""

    op: Op
    inputs: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    shape: Shape
    dtype: str

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_scalar_const(self) -> bool:
        return self.op is Op.CONST and self.attr("value") is not None

    def gather_indices(self) -> np.ndarray:
        """A GATHER's indices as an int64 array of their stored shape."""
        return np.array(self.attr("indices"), dtype=np.int64).reshape(self.attr("indices_shape"))


@dataclasses.dataclass
class Graph:
    """A primitive graph in topological order (node id = position in ``nodes``).

    ``inputs`` and ``outputs`` map ONNX tensor names to node ids; ``consts`` holds the
    values of CONST nodes that carry a ``name`` attribute (scalars carry ``value``).
    """

    nodes: list[Node] = dataclasses.field(default_factory=list)
    inputs: dict[str, int] = dataclasses.field(default_factory=dict)
    outputs: dict[str, int] = dataclasses.field(default_factory=dict)
    consts: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.nodes)

    def users(self) -> list[list[int]]:
        """users()[i] lists the ids of nodes reading node i (with repeats removed)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for nid, node in enumerate(self.nodes):
            for src in dict.fromkeys(node.inputs):
                out[src].append(nid)
        return out

    def compute_ids(self) -> list[int]:
        """Ids of the primitives that kernels compute (everything but sources)."""
        return [i for i, n in enumerate(self.nodes) if n.op not in GroupOp.SOURCE]

    def const_value(self, nid: int) -> np.ndarray:
        node = self.nodes[nid]
        assert node.op is Op.CONST
        if node.attr("value") is not None:
            return np.array(node.attr("value"), dtype=node.dtype)
        return self.consts[node.attr("name")]

    def count(self) -> dict[str, int]:
        from korch.ir.ops import category

        out: dict[str, int] = {}
        for n in self.nodes:
            c = category(n.op)
            out[c] = out.get(c, 0) + 1
        return out


def _broadcast_shapes(*shapes: Shape) -> Shape:
    return tuple(np.broadcast_shapes(*shapes))


def infer(op: Op, in_shapes: Sequence[Shape], in_dtypes: Sequence[str], attrs: dict) -> tuple[Shape, str]:
    """Shape and dtype of a primitive's output. Raises ValueError on a misuse."""
    if op in GroupOp.ELEMENTWISE:
        non_scalar = [s for s in in_shapes if s != ()]
        shape = non_scalar[0] if non_scalar else ()
        for s in non_scalar:
            if s != shape:
                raise ValueError(f"{op.value}: input shapes differ {list(in_shapes)}")
        if op is Op.CAST:
            return shape, attrs["to"]
        if op in GroupOp.COMPARE or op in (Op.AND, Op.OR, Op.NOT):
            return shape, "bool"
        if op is Op.WHERE:
            return shape, in_dtypes[1]
        return shape, in_dtypes[0]
    if op in GroupOp.REDUCE:
        (shape,) = in_shapes
        axes = attrs["axes"]
        return tuple(1 if i in axes else d for i, d in enumerate(shape)), in_dtypes[0]
    if op is Op.BROADCAST:
        (shape,) = in_shapes
        target = tuple(attrs["shape"])
        if len(target) != len(shape) or any(a != b and a != 1 for a, b in zip(shape, target)):
            raise ValueError(f"broadcast: cannot expand {shape} to {target}")
        return target, in_dtypes[0]
    if op is Op.RESHAPE:
        (shape,) = in_shapes
        target = tuple(attrs["shape"])
        if math.prod(target) != math.prod(shape):
            raise ValueError(f"reshape: {shape} to {target}")
        return target, in_dtypes[0]
    if op is Op.TRANSPOSE:
        (shape,) = in_shapes
        perm = attrs["perm"]
        if sorted(perm) != list(range(len(shape))):
            raise ValueError(f"transpose: bad perm {perm} for {shape}")
        return tuple(shape[p] for p in perm), in_dtypes[0]
    if op is Op.SLICE:
        (shape,) = in_shapes
        starts, steps, lengths = attrs["starts"], attrs["steps"], attrs["lengths"]
        for d, st, sp, ln in zip(shape, starts, steps, lengths):
            if ln < 0 or (ln > 0 and not (0 <= st < d and 0 <= st + (ln - 1) * sp < d)):
                raise ValueError(f"slice: out of range on {shape}")
        return tuple(lengths), in_dtypes[0]
    if op is Op.CONCAT:
        axis = attrs["axis"]
        base = list(in_shapes[0])
        for s in in_shapes[1:]:
            if len(s) != len(base) or any(a != b for i, (a, b) in enumerate(zip(s, base)) if i != axis):
                raise ValueError(f"concat: shapes {list(in_shapes)}")
        base[axis] = sum(s[axis] for s in in_shapes)
        return tuple(base), in_dtypes[0]
    if op is Op.PAD:
        (shape,) = in_shapes
        pads = attrs["pads"]  # ((before, after), ...)
        if attrs.get("mode", "constant") == "reflect":
            for d, (b, a) in zip(shape, pads):
                if b >= d or a >= d:
                    raise ValueError("pad: reflect pad larger than the axis")
        return tuple(d + b + a for d, (b, a) in zip(shape, pads)), in_dtypes[0]
    if op is Op.GATHER:
        (shape,) = in_shapes
        axis = attrs["axis"]
        idx_shape = tuple(attrs["indices_shape"])
        for i in attrs["indices"]:
            if not 0 <= i < shape[axis]:
                raise ValueError("gather: index out of range")
        return shape[:axis] + idx_shape + shape[axis + 1 :], in_dtypes[0]
    if op is Op.WINDOW:
        (shape,) = in_shapes
        kernel, strides, dil = attrs["kernel"], attrs["strides"], attrs["dilations"]
        nsp = len(kernel)
        lead, spatial = shape[: len(shape) - nsp], shape[len(shape) - nsp :]
        out = tuple((d - (k - 1) * dl - 1) // s + 1 for d, k, s, dl in zip(spatial, kernel, strides, dil))
        if any(o <= 0 for o in out):
            raise ValueError("window: empty output")
        return lead + out + tuple(kernel), in_dtypes[0]
    if op is Op.MATMUL:
        a, b = in_shapes
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            raise ValueError(f"matmul: {a} x {b}")
        if len(b) != 2 and b[:-2] != a[:-2]:
            raise ValueError(f"matmul: batch dims differ {a} x {b}")
        return a[:-1] + (b[-1],), in_dtypes[0]
    if op is Op.CONV:
        x, w = in_shapes
        nsp = len(x) - 2
        strides, dil, pads, group = attrs["strides"], attrs["dilations"], attrs["pads"], attrs["group"]
        if x[1] != w[1] * group or w[0] % group:
            raise ValueError(f"conv: channels {x} vs {w} group {group}")
        out = tuple(
            (x[2 + i] + pads[i] + pads[nsp + i] - dil[i] * (w[2 + i] - 1) - 1) // strides[i] + 1 for i in range(nsp)
        )
        return (x[0], w[0]) + out, in_dtypes[0]
    raise ValueError(f"no shape rule for {op}")


class GraphBuilder:
    """Appends nodes in topological order, inferring shapes. Used by fission and rewrites."""

    def __init__(self, graph: Graph | None = None):
        self.graph = graph if graph is not None else Graph()
        self._memo: dict[Node, int] = {}
        for i, n in enumerate(self.graph.nodes):
            self._memo.setdefault(n, i)

    def node(self, nid: int) -> Node:
        return self.graph.nodes[nid]

    def add(self, op: Op, inputs: Iterable[int] = (), **attrs: Any) -> int:
        inputs = tuple(int(i) for i in inputs)
        attrs = {k: _freeze(v) for k, v in attrs.items()}
        if op in GroupOp.SOURCE or op is Op.OPAQUE:
            shape, dtype = tuple(attrs.pop("shape")), attrs.pop("dtype")
        else:
            nodes = self.graph.nodes
            shape, dtype = infer(op, [nodes[i].shape for i in inputs], [nodes[i].dtype for i in inputs], attrs)
        node = Node(op, inputs, tuple(sorted(attrs.items())), tuple(int(d) for d in shape), dtype)
        # Hash-consing: identical primitives on identical inputs are one node (CSE for free).
        if op is not Op.INPUT and node in self._memo:
            return self._memo[node]
        self.graph.nodes.append(node)
        nid = len(self.graph.nodes) - 1
        self._memo[node] = nid
        return nid

    # --- sources ---------------------------------------------------------------
    def input(self, name: str, shape: Shape, dtype: str) -> int:
        nid = self.add(Op.INPUT, name=name, shape=shape, dtype=dtype)
        self.graph.inputs[name] = nid
        return nid

    def const(self, value: Any, dtype: str | None = None, name: str | None = None) -> int:
        """A constant. Scalars (size 1, rank 0) are kept inline; arrays go to ``consts``."""
        arr = np.asarray(value, dtype=dtype)
        if arr.ndim == 0:
            return self.add(Op.CONST, value=arr.item(), shape=(), dtype=str(arr.dtype))
        if name is None:
            name = f"c{len(self.graph.consts)}"
            while name in self.graph.consts:
                name += "_"
        # Identical arrays share one constant.
        for cname, cval in self.graph.consts.items():
            if cval.shape == arr.shape and cval.dtype == arr.dtype and np.array_equal(cval, arr):
                name = cname
                break
        else:
            self.graph.consts[name] = np.ascontiguousarray(arr)
        return self.add(Op.CONST, name=name, shape=arr.shape, dtype=str(arr.dtype))

    def output(self, name: str, nid: int) -> None:
        self.graph.outputs[name] = nid

    # --- conveniences used by fission rules -------------------------------------
    def shape(self, nid: int) -> Shape:
        return self.graph.nodes[nid].shape

    def dtype(self, nid: int) -> str:
        return self.graph.nodes[nid].dtype

    def reshape(self, x: int, shape: Sequence[int]) -> int:
        if tuple(shape) == self.shape(x):
            return x
        return self.add(Op.RESHAPE, [x], shape=tuple(shape))

    def broadcast_to(self, x: int, shape: Sequence[int]) -> int:
        """numpy broadcasting made explicit: reshape to the rank, then BROADCAST."""
        shape = tuple(shape)
        s = self.shape(x)
        if s == shape:
            return x
        if s == () and self.node(x).is_scalar_const:
            return x  # scalar constants are inlined by every kernel
        if self.node(x).op is Op.CONST and math.prod(s) == 1 and len(s) <= len(shape):
            # Note [One-element constants are scalars] (korch.rewrite.rules.layout)
            return self.const(self.graph.const_value(x).reshape(()))
        if len(s) < len(shape):
            x = self.reshape(x, (1,) * (len(shape) - len(s)) + s)
        return self.add(Op.BROADCAST, [x], shape=shape)

    def binary(self, op: Op, a: int, b: int) -> int:
        shape = _broadcast_shapes(self.shape(a), self.shape(b))
        return self.add(op, [self.broadcast_to(a, shape), self.broadcast_to(b, shape)])

    def unary(self, op: Op, x: int, **attrs: Any) -> int:
        return self.add(op, [x], **attrs)

    def scalar(self, value: float, like: int) -> int:
        return self.const(np.array(value, dtype=self.dtype(like)))

    def reduce(self, op: Op, x: int, axes: Sequence[int], keepdims: bool = True) -> int:
        rank = len(self.shape(x))
        axes = tuple(sorted({a % rank for a in axes}))
        if not axes:
            return x
        y = self.add(op, [x], axes=axes)
        if not keepdims:
            y = self.reshape(y, [d for i, d in enumerate(self.shape(x)) if i not in axes])
        return y

    def transpose(self, x: int, perm: Sequence[int]) -> int:
        if list(perm) == list(range(len(perm))):
            return x
        return self.add(Op.TRANSPOSE, [x], perm=tuple(perm))


def strip_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` without its leading ones."""
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return tuple(shape[i:])
