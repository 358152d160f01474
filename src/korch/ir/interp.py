"""The numpy reference interpreter: the meaning of every primitive."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

Impl = Callable[[Node, Sequence[np.ndarray]], np.ndarray]


def _erf(x: np.ndarray) -> np.ndarray:
    vec = np.vectorize(math.erf, otypes=[np.float64])
    return vec(x).astype(x.dtype)


def _slice(node: Node, x: np.ndarray) -> np.ndarray:
    idx = []
    for st, sp, ln in zip(node.attr("starts"), node.attr("steps"), node.attr("lengths")):
        idx.append(np.arange(ln, dtype=np.int64) * sp + st)
    return x[np.ix_(*idx)] if idx else x


def _pad(node: Node, x: np.ndarray) -> np.ndarray:
    mode = node.attr("mode", "constant")
    pads = [tuple(p) for p in node.attr("pads")]
    if mode == "constant":
        return np.pad(x, pads, mode="constant", constant_values=node.attr("value", 0.0))
    return np.pad(x, pads, mode={"reflect": "reflect", "edge": "edge"}[mode])


def _gather(node: Node, x: np.ndarray) -> np.ndarray:
    idx = node.gather_indices()
    return np.take(x, idx, axis=node.attr("axis"))


def _window(node: Node, x: np.ndarray) -> np.ndarray:
    kernel, strides, dil = node.attr("kernel"), node.attr("strides"), node.attr("dilations")
    nsp = len(kernel)
    lead = x.ndim - nsp
    out = np.empty(node.shape, dtype=x.dtype)
    out_sp = node.shape[lead : lead + nsp]
    for kidx in np.ndindex(*kernel):
        sl = [slice(None)] * lead
        for i in range(nsp):
            start = kidx[i] * dil[i]
            sl.append(slice(start, start + (out_sp[i] - 1) * strides[i] + 1, strides[i]))
        out[(Ellipsis,) + tuple(kidx)] = x[tuple(sl)]
    return out


def _matmul(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b)


def _conv(node: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    strides, dil, pads, group = node.attr("strides"), node.attr("dilations"), node.attr("pads"), node.attr("group")
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i]) for i in range(nsp)])
    ksp = w.shape[2:]
    out_sp = node.shape[2:]
    n, cin = x.shape[:2]
    cout = w.shape[0]
    cg, og = cin // group, cout // group
    out = np.zeros(node.shape, dtype=np.float64)
    for kidx in np.ndindex(*ksp):
        sl = [slice(None), slice(None)]
        for i in range(nsp):
            st = kidx[i] * dil[i]
            sl.append(slice(st, st + (out_sp[i] - 1) * strides[i] + 1, strides[i]))
        patch = xp[tuple(sl)]  # n, cin, *out_sp
        wk = w[(slice(None), slice(None)) + tuple(kidx)]  # cout, cg
        for g in range(group):
            pg = patch[:, g * cg : (g + 1) * cg]
            wg = wk[g * og : (g + 1) * og]
            out[:, g * og : (g + 1) * og] += np.einsum("nc...,oc->no...", pg, wg, dtype=np.float64)
    return out.astype(x.dtype)


def _opaque(node: Node, *xs: np.ndarray) -> np.ndarray:
    from korch.ir.opaque import run_opaque

    return run_opaque(node, xs)


def _cast(node: Node, x: np.ndarray) -> np.ndarray:
    return x.astype(node.attr("to"))


IMPLS: dict[Op, Callable[..., np.ndarray]] = {
    Op.NEG: lambda n, x: -x,
    Op.EXP: lambda n, x: np.exp(x),
    Op.LOG: lambda n, x: np.log(x),
    Op.SQRT: lambda n, x: np.sqrt(x),
    Op.RECIPROCAL: lambda n, x: np.reciprocal(x),
    Op.TANH: lambda n, x: np.tanh(x),
    Op.ERF: lambda n, x: _erf(x),
    Op.SIGMOID: lambda n, x: (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype),
    Op.ABS: lambda n, x: np.abs(x),
    Op.FLOOR: lambda n, x: np.floor(x),
    Op.CEIL: lambda n, x: np.ceil(x),
    Op.NOT: lambda n, x: np.logical_not(x),
    Op.CAST: _cast,
    Op.ADD: lambda n, a, b: a + b,
    Op.SUB: lambda n, a, b: a - b,
    Op.MUL: lambda n, a, b: a * b,
    Op.DIV: lambda n, a, b: (
        (a / b) if np.issubdtype(np.result_type(a, b), np.floating) else np.trunc(a / b).astype(np.result_type(a, b))
    ),
    Op.POW: lambda n, a, b: np.power(a, b),
    Op.MAX: lambda n, a, b: np.maximum(a, b),
    Op.MIN: lambda n, a, b: np.minimum(a, b),
    Op.EQUAL: lambda n, a, b: np.equal(a, b),
    Op.LESS: lambda n, a, b: np.less(a, b),
    Op.GREATER: lambda n, a, b: np.greater(a, b),
    Op.AND: lambda n, a, b: np.logical_and(a, b),
    Op.OR: lambda n, a, b: np.logical_or(a, b),
    Op.WHERE: lambda n, c, a, b: np.where(c, a, b),
    Op.REDUCE_SUM: lambda n, x: np.sum(x, axis=n.attr("axes"), keepdims=True),
    Op.REDUCE_MAX: lambda n, x: np.max(x, axis=n.attr("axes"), keepdims=True),
    Op.REDUCE_MIN: lambda n, x: np.min(x, axis=n.attr("axes"), keepdims=True),
    Op.BROADCAST: lambda n, x: np.broadcast_to(x, n.shape),
    Op.RESHAPE: lambda n, x: np.reshape(x, n.shape),
    Op.TRANSPOSE: lambda n, x: np.transpose(x, n.attr("perm")),
    Op.SLICE: _slice,
    Op.CONCAT: lambda n, *xs: np.concatenate(xs, axis=n.attr("axis")),
    Op.PAD: _pad,
    Op.GATHER: _gather,
    Op.WINDOW: _window,
    Op.MATMUL: _matmul,
    Op.CONV: _conv,
    Op.OPAQUE: _opaque,
}


def eval_node(
    graph: Graph,
    nid: int,
    args: Sequence[np.ndarray],
    opaque: Callable[[Node, Sequence[np.ndarray]], Any] | None = None,
) -> np.ndarray:
    """Evaluate one primitive on concrete inputs; the result has the node's shape and dtype.

    ``opaque``: how to run an OPAQUE node (default: ONNX's reference evaluator)."""
    node = graph.nodes[nid]
    if node.op is Op.CONST:
        return graph.const_value(nid)
    out = opaque(node, args) if opaque is not None and node.op is Op.OPAQUE else IMPLS[node.op](node, *args)
    out = np.asarray(out)
    if out.dtype != np.dtype(node.dtype):
        out = out.astype(node.dtype)
    return np.ascontiguousarray(out).reshape(node.shape)  # ascontiguousarray makes 0-d arrays 1-d


def evaluate(
    graph: Graph,
    inputs: Mapping[str, np.ndarray],
    keep_all: bool = False,
    opaque: Callable[[Node, Sequence[np.ndarray]], Any] | None = None,
) -> dict:
    """Run the graph on numpy inputs keyed by input name; returns outputs keyed by name.

    With ``keep_all`` it returns ``{node_id: value}`` for every node instead. ``opaque``
    runs OPAQUE nodes (``eval_node``).
    """
    values: list[np.ndarray | None] = [None] * len(graph.nodes)
    for nid, node in enumerate(graph.nodes):
        if node.op is Op.INPUT:
            name = node.attr("name")
            if name not in inputs:
                raise KeyError(f"missing input {name!r}")
            values[nid] = np.asarray(inputs[name], dtype=node.dtype).reshape(node.shape)
        else:
            # IEEE semantics (NaN/Inf results) as onnxruntime gives them, without numpy's warnings
            with np.errstate(all="ignore"):
                values[nid] = eval_node(graph, nid, [values[i] for i in node.inputs], opaque)  # type: ignore[misc]
    if keep_all:
        return dict(enumerate(values))
    return {name: values[nid] for name, nid in graph.outputs.items()}
