"""Native transpose: a TRANSPOSE between RESHAPEs over one float32 input, run by korch's
runtime (Note [Native transpose] in ``korch_rt.cc``) as one step of a native segment.
It competes with TVM's kernel for the same primitives: both are measured.

A kernel graph qualifies when its compute nodes are a chain input -> RESHAPE* ->
TRANSPOSE -> RESHAPE* -> output (a RESHAPE moves no data) and the permutation, with
size-1 axes dropped and adjacent axes that stay adjacent merged, is a batch of matrix
transposes of rows: (1, 0), (0, 2, 1), (1, 0, 2) or (0, 2, 1, 3), read as
``Y[b, n, m, c] = X[b, m, n, c]``. The code the runtime reads (``korch_linear_create``,
op 5)::

    1, 5, n inputs, 1, 0, 0, x pos, 0, D, out shape[D], B, M, N, C, 0 steps
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.native.rtkernel import SpecKernel


@dataclass
class TransposeSpec:
    x_pos: int
    shape: tuple[int, ...]  # the kernel's output
    bmnc: tuple[int, int, int, int]  # Y[b, n, m, c] = X[b, m, n, c]


def merged_transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """``np.transpose(x.reshape(shape), perm)`` as (B, M, N, C) of ``Y[b, n, m, c] =
    X[b, m, n, c]`` over the same buffers, or None when it is not one (module docstring)."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    renum = {a: i for i, a in enumerate(kept)}
    order = [renum[a] for a in perm if a in renum]  # input axes in output order
    groups: list[list[int]] = []  # runs of input axes that stay adjacent
    for a in order:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    size = [math.prod(shape[kept[a]] for a in g) for g in groups]
    by_input = sorted(range(len(groups)), key=lambda i: groups[i][0])
    gperm = tuple(by_input.index(i) for i in range(len(groups)))  # output group i is input group gperm[i]
    s = [size[i] for i in by_input]  # group sizes in input order
    if gperm == (1, 0):
        return 1, s[0], s[1], 1
    if gperm == (0, 2, 1):
        return s[0], s[1], s[2], 1
    if gperm == (1, 0, 2):
        return 1, s[0], s[1], s[2]
    if gperm == (0, 2, 1, 3):
        return s[0], s[1], s[2], s[3]
    return None


def transpose_spec(kgraph: Graph) -> TransposeSpec | None:
    """The kernel as a transpose the runtime runs, or None (module docstring)."""
    nodes = kgraph.nodes
    if len(kgraph.outputs) != 1:
        return None
    out_id = next(iter(kgraph.outputs.values()))
    out = nodes[out_id]
    if out.dtype != "float32" or 0 in out.shape:
        return None
    chain, nid, tr = set(), out_id, None
    while nodes[nid].op is not Op.INPUT:
        node = nodes[nid]
        if node.op is Op.TRANSPOSE and tr is None:
            tr = nid
        elif node.op is not Op.RESHAPE:
            return None
        chain.add(nid)
        nid = node.inputs[0]
    x = nodes[nid]
    if tr is None or x.dtype != "float32" or chain != set(kgraph.compute_ids()):
        return None
    t = nodes[tr]
    bmnc = merged_transpose(tuple(int(d) for d in nodes[t.inputs[0]].shape), tuple(int(a) for a in t.attr("perm")))
    if bmnc is None:
        return None
    return TransposeSpec(list(kgraph.inputs.values()).index(nid), tuple(int(d) for d in out.shape), bmnc)


def encode_transpose(spec: TransposeSpec, n_inputs: int) -> np.ndarray:
    code = [1, 5, n_inputs, 1, 0, 0, spec.x_pos, 0, len(spec.shape), *spec.shape, *spec.bmnc, 0]
    return np.asarray(code, dtype=np.int64)


class NativeTransposeKernel(SpecKernel):
    op = "transpose"
    spec_type = TransposeSpec
    encoder = staticmethod(encode_transpose)
