"""Native softmax: fission's softmax over trailing axes (REDUCE_MAX, BROADCAST, SUB, EXP,
REDUCE_SUM, BROADCAST, DIV), or its numerator alone (up to the EXP: a rewrite divides
after the matmul that reads it), run by korch's runtime (Note [Native softmax] in
``korch_rt.cc``) as one step of a native segment. It competes with TVM's kernels for
the same primitives: both are measured.

A kernel graph qualifies when its compute nodes are exactly that chain over one float32
input, the reductions over the same trailing axes. The code the runtime reads
(``korch_linear_create``, op 4)::

    1, 4, n inputs, 1, 0, 0, x pos, 0, D, shape[D], rows, row length, normalized, 0 steps
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.native.rtkernel import SpecKernel


@dataclass
class SoftmaxSpec:
    x_pos: int
    shape: tuple[int, ...]
    first_axis: int  # the reduced axes are first_axis .. rank - 1
    normalized: bool = True  # False: exp(x - max) alone, the sum and division elsewhere


def _through_broadcast(kgraph: Graph, nid: int, shape: tuple[int, ...]) -> int | None:
    """The statistic a BROADCAST back to ``shape`` spreads, or None."""
    node = kgraph.nodes[nid]
    if node.op is not Op.BROADCAST or tuple(node.shape) != shape:
        return None
    return node.inputs[0]


def softmax_spec(kgraph: Graph) -> SoftmaxSpec | None:
    """The kernel as a softmax the runtime runs, or None (module docstring)."""
    nodes = kgraph.nodes
    if len(kgraph.outputs) != 1:
        return None
    out_id = next(iter(kgraph.outputs.values()))
    out = nodes[out_id]
    if out.dtype != "float32":
        return None
    shape = tuple(int(d) for d in out.shape)
    chain = {out_id}
    e_id, sum_axes = out_id, None
    if out.op is Op.DIV:  # normalized; else the numerator alone (Note [Native softmax])
        e_id, rb = out.inputs
        red_sum = _through_broadcast(kgraph, rb, shape)
        if red_sum is None or nodes[red_sum].op is not Op.REDUCE_SUM or nodes[red_sum].inputs[0] != e_id:
            return None
        sum_axes = tuple(nodes[red_sum].attr("axes"))
        chain |= {rb, red_sum, e_id}
    if nodes[e_id].op is not Op.EXP:
        return None
    sub_id = nodes[e_id].inputs[0]
    sub = nodes[sub_id]
    if sub.op is not Op.SUB:
        return None
    x_id, mb = sub.inputs
    red_max = _through_broadcast(kgraph, mb, shape)
    if red_max is None or nodes[red_max].op is not Op.REDUCE_MAX or nodes[red_max].inputs[0] != x_id:
        return None
    x = nodes[x_id]
    if x.op is not Op.INPUT or x.dtype != "float32" or tuple(x.shape) != shape or not shape or 0 in shape:
        return None  # (an empty tensor has no rows for the runtime to run)
    axes = tuple(nodes[red_max].attr("axes"))
    rank = len(shape)
    first = rank - len(axes)
    if axes != tuple(range(first, rank)) or sum_axes not in (None, axes):
        return None  # not the trailing axes: a row is not contiguous
    chain |= {sub_id, mb, red_max}
    if chain != set(kgraph.compute_ids()):
        return None  # something else is computed
    return SoftmaxSpec(
        x_pos=list(kgraph.inputs.values()).index(x_id), shape=shape, first_axis=first, normalized=sum_axes is not None
    )


def encode_softmax(spec: SoftmaxSpec, n_inputs: int) -> np.ndarray:
    rows, length = math.prod(spec.shape[: spec.first_axis]), math.prod(spec.shape[spec.first_axis :])
    code = [1, 4, n_inputs, 1, 0, 0, spec.x_pos, 0, len(spec.shape), *spec.shape, rows, length]
    code += [int(spec.normalized), 0]
    return np.asarray(code, dtype=np.int64)


class NativeSoftmaxKernel(SpecKernel):
    op = "softmax"
    spec_type = SoftmaxSpec
    encoder = staticmethod(encode_softmax)
