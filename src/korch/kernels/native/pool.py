"""Native pooling: MaxPool and AveragePool as fission writes them (PAD + WINDOW +
REDUCE_MAX/REDUCE_SUM + RESHAPE, then a DIV by one number for an average), run by
korch's runtime (Note [Native pooling] in ``korch_rt.cc``) as one step of a native
segment. It competes with TVM's kernel for the same primitives: both are measured.

A kernel graph qualifies when its compute nodes are exactly that chain over one
float32 NCHW input: the PAD (if any) constant, on the two spatial axes only, with the
value that leaves the result unchanged (-inf for a max, 0 for a sum), so the runtime
skips padded taps. The code the runtime reads (``korch_linear_create``, op 3)::

    1, 3, n inputs, 1, 0, 0, x pos, 0, 4, out shape[4],
    N, C, H, W, kh, kw, sh, sw, dh, dw, pad top, pad left, Ho, Wo, max, divisor (float64 bits), 0 steps
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.native.rtkernel import SpecKernel


@dataclass
class PoolSpec:
    x_pos: int
    x_shape: tuple[int, ...]  # N, C, H, W
    out_shape: tuple[int, ...]  # N, C, Ho, Wo
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]  # top, left (the bottom and right ones are implied by the sizes)
    is_max: bool
    divisor: float  # 1.0 for a max or a plain sum


def pool_spec(kgraph: Graph) -> PoolSpec | None:
    """The kernel as a pooling the runtime runs, or None (module docstring)."""
    nodes = kgraph.nodes
    if len(kgraph.outputs) != 1:
        return None
    cur = next(iter(kgraph.outputs.values()))
    chain = []
    divisor = 1.0
    if nodes[cur].op is Op.DIV:
        x, d = nodes[cur].inputs
        if not nodes[d].is_scalar_const or float(nodes[d].attr("value")) == 0.0:
            return None
        divisor = float(nodes[d].attr("value"))
        chain.append(cur)
        cur = x
    if nodes[cur].op is not Op.RESHAPE:
        return None
    chain.append(cur)
    out_shape = tuple(int(s) for s in nodes[cur].shape)
    cur = nodes[cur].inputs[0]
    red = nodes[cur]
    if red.op not in (Op.REDUCE_MAX, Op.REDUCE_SUM) or (red.op is Op.REDUCE_MAX and divisor != 1.0):
        return None
    chain.append(cur)
    cur = red.inputs[0]
    win = nodes[cur]
    if win.op is not Op.WINDOW or len(win.attr("kernel")) != 2 or len(win.shape) != 6:
        return None
    if tuple(red.attr("axes")) != (4, 5) or out_shape != tuple(win.shape[:4]):
        return None
    chain.append(cur)
    cur = win.inputs[0]
    pads = (0, 0)
    if nodes[cur].op is Op.PAD:
        pad = nodes[cur]
        want = -math.inf if red.op is Op.REDUCE_MAX else 0.0
        pp = [tuple(int(v) for v in p) for p in pad.attr("pads")]
        if pad.attr("mode", "constant") != "constant" or float(pad.attr("value", 0.0)) != want:
            return None
        if len(pp) != 4 or pp[0] != (0, 0) or pp[1] != (0, 0) or min(v for p in pp for v in p) < 0:
            return None
        pads = (pp[2][0], pp[3][0])
        chain.append(cur)
        cur = pad.inputs[0]
    x = nodes[cur]
    if x.op is not Op.INPUT or x.dtype != "float32" or len(x.shape) != 4 or nodes[chain[0]].dtype != "float32":
        return None
    if set(chain) != set(kgraph.compute_ids()):
        return None  # something else is computed
    return PoolSpec(
        x_pos=list(kgraph.inputs.values()).index(cur),
        x_shape=tuple(int(s) for s in x.shape),
        out_shape=out_shape,
        kernel=tuple(int(k) for k in win.attr("kernel")),
        strides=tuple(int(s) for s in win.attr("strides")),
        dilations=tuple(int(d) for d in win.attr("dilations")),
        pads=pads,
        is_max=red.op is Op.REDUCE_MAX,
        divisor=divisor,
    )


def encode_pool(spec: PoolSpec, n_inputs: int) -> np.ndarray:
    bits = int(np.array(spec.divisor, dtype=np.float64).view(np.int64))
    code = [1, 3, n_inputs, 1, 0, 0, spec.x_pos, 0, 4, *spec.out_shape, *spec.x_shape]
    code += [*spec.kernel, *spec.strides, *spec.dilations, *spec.pads, *spec.out_shape[2:], int(spec.is_max), bits, 0]
    return np.asarray(code, dtype=np.int64)


class NativePoolKernel(SpecKernel):
    op = "pool"
    spec_type = PoolSpec
    encoder = staticmethod(encode_pool)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.spec.out_shape
