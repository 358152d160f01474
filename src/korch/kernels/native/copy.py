"""Native strided copies: layout primitives over one input, each output maybe through
elementwise steps with a scalar operand, run by korch's runtime (Note [Native strided
copies] in ``korch_rt.cc``) as one step of a native segment. It competes with TVM's
kernel for the same primitives: both are measured.

A kernel graph qualifies when every compute node is a RESHAPE, TRANSPOSE, SLICE or
BROADCAST, a unary the runtime computes, or an ADD/SUB/MUL/DIV/MAX/MIN with one rank-0
constant operand; every such node reads one tensor, and all of them lead back to one
float32 input. Each output is then ``steps(view(x))``: the layout nodes on its path
make an index map that must be affine in the output's coordinates (an offset and a
stride per axis, which numpy's index arrays say exactly, whatever the reshapes), and the
elementwise nodes are its steps, in order (they commute with the layout nodes). At
least one node is a TRANSPOSE or SLICE: a reshape alone is a view (Note [Views in a
segment]), and a broadcast alone (a bias spread over rows: mlp's six) is TVM's, not
measured twice. The code the runtime reads
(``korch_linear_create``, op 6)::

    1, 6, n inputs, n outputs, 0, 0, x pos, 0, 1, n outputs,
    per output: D, shape[D], offset, strides[D], n steps, per step (op, value left, the scalar's float64 bits)
    0 steps
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.interp import IMPLS
from korch.ir.ops import Op
from korch.kernels.base import buffer_address
from korch.kernels.native.rtkernel import RuntimeKernel

_LAYOUT = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.SLICE, Op.BROADCAST})
_MOVES = frozenset({Op.TRANSPOSE, Op.SLICE})
_SCALAR = {Op.ADD: 1, Op.SUB: 2, Op.MUL: 3, Op.DIV: 4, Op.MAX: 5, Op.MIN: 6}
_UNARY = {Op.NEG: 11, Op.EXP: 12, Op.TANH: 13, Op.SIGMOID: 14, Op.ABS: 15, Op.ERF: 16}
MAX_ELEMENTS = 1 << 24  # the index arrays that find the strides: 128 MB at most


@dataclass(frozen=True)
class CopyOut:
    shape: tuple[int, ...]
    offset: int
    strides: tuple[int, ...]
    steps: tuple[tuple[int, int, float], ...]  # (op code, the value on the left, the scalar)


@dataclass(frozen=True)
class CopySpec:
    x_pos: int
    outs: tuple[CopyOut, ...]


def _affine(idx: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) with ``idx[i] == offset + sum(i * strides)``, or None."""
    if idx.size == 0:
        return None
    offset = int(idx.flat[0])
    strides = []
    for d, n in enumerate(idx.shape):
        strides.append(int(np.take(idx, 1, axis=d).flat[0]) - offset if n > 1 else 0)
    want = np.full(idx.shape, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(idx.shape, strides)):
        if n > 1 and s:
            want = want + (np.arange(n, dtype=np.int64) * s).reshape((1,) * d + (n,) + (1,) * (idx.ndim - d - 1))
    return (offset, tuple(strides)) if np.array_equal(idx, want) else None


def copy_spec(kgraph: Graph) -> CopySpec | None:
    """The kernel as strided copies the runtime runs, or None (module docstring)."""
    nodes = kgraph.nodes
    compute = kgraph.compute_ids()
    if not compute or not any(nodes[i].op in _MOVES for i in compute):
        return None
    data: dict[int, int] = {}  # compute node -> the one tensor it reads
    steps: dict[int, tuple[int, int, float] | None] = {}
    for nid in compute:
        node = nodes[nid]
        if node.dtype != "float32":
            return None
        if node.op in _LAYOUT or node.op in _UNARY:
            data[nid], steps[nid] = node.inputs[0], (None if node.op in _LAYOUT else (_UNARY[node.op], 1, 0.0))
            continue
        if node.op not in _SCALAR or len(node.inputs) != 2:
            return None
        scal = [i for i, s in enumerate(node.inputs) if nodes[s].is_scalar_const]
        if len(scal) != 1:
            return None
        k = scal[0]
        data[nid] = node.inputs[1 - k]
        steps[nid] = (_SCALAR[node.op], int(k == 1), float(nodes[node.inputs[k]].attr("value")))
    sources = {s for s in data.values() if s not in data}
    if len(sources) != 1:
        return None
    (x,) = sources
    xnode = nodes[x]
    if xnode.op is not Op.INPUT or xnode.dtype != "float32" or xnode.size > MAX_ELEMENTS:
        return None
    base = np.arange(xnode.size, dtype=np.int64).reshape(xnode.shape)
    outs = []
    for out_id in kgraph.outputs.values():
        if out_id not in data or nodes[out_id].size > MAX_ELEMENTS:
            return None
        path = [out_id]
        while path[-1] != x:
            path.append(data[path[-1]])
        idx = base
        chain = []
        for nid in reversed(path[:-1]):
            node = nodes[nid]
            if steps[nid] is None:
                idx = np.asarray(IMPLS[node.op](node, idx)).reshape(node.shape)
            else:
                chain.append(steps[nid])
        found = _affine(idx)
        if found is None:
            return None
        outs.append(CopyOut(tuple(int(d) for d in idx.shape), found[0], found[1], tuple(chain)))
    return CopySpec(list(kgraph.inputs.values()).index(x), tuple(outs))


def encode_copy(spec: CopySpec, n_inputs: int) -> np.ndarray:
    code = [1, 6, n_inputs, len(spec.outs), 0, 0, spec.x_pos, 0, 1, len(spec.outs)]
    for o in spec.outs:
        code += [len(o.shape), *o.shape, o.offset, *o.strides, len(o.steps)]
        for op, left, value in o.steps:
            code += [op, left, int(np.array(value, dtype=np.float64).view(np.int64))]
    code.append(0)
    return np.asarray(code, dtype=np.int64)


class NativeCopyKernel(RuntimeKernel):
    def __init__(self, spec: CopySpec, input_shapes: Sequence[tuple[int, ...]], input_dtypes: Sequence[str]):
        self.spec = spec
        self.input_shapes = [tuple(int(d) for d in s) for s in input_shapes]
        self.input_dtypes = [str(d) for d in input_dtypes]
        self._create(encode_copy(spec, len(self.input_shapes)))
        self._ptrs = (ctypes.c_void_p * (len(self.input_shapes) + len(spec.outs)))()

    def arg_specs(self) -> tuple[list[tuple[tuple[int, ...], str]], list[tuple[tuple[int, ...], str]]]:
        """(shape, dtype) of each input and output, as a segment lays them out."""
        return list(zip(self.input_shapes, self.input_dtypes)), [(o.shape, "float32") for o in self.spec.outs]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = np.ascontiguousarray(inputs[self.spec.x_pos], dtype=np.float32)
        self._ptrs[self.spec.x_pos] = buffer_address(x)
        outs = [np.empty(o.shape, dtype=np.float32) for o in self.spec.outs]
        for j, o in enumerate(outs):
            self._ptrs[len(self.input_shapes) + j] = buffer_address(o)
        self._run("strided copy")
        return outs

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "op": "copy",
            "x_pos": self.spec.x_pos,
            "outs": [[list(o.shape), o.offset, list(o.strides), [list(s) for s in o.steps]] for o in self.spec.outs],
            "input_shapes": [list(x) for x in self.input_shapes],
            "input_dtypes": self.input_dtypes,
        }

    @classmethod
    def of(cls, kgraph: Graph, spec: CopySpec) -> NativeCopyKernel:
        shapes = [tuple(kgraph.nodes[nid].shape) for nid in kgraph.inputs.values()]
        return cls(spec, shapes, [kgraph.nodes[nid].dtype for nid in kgraph.inputs.values()])

    @classmethod
    def load(cls, meta: dict[str, Any]) -> NativeCopyKernel:
        outs = tuple(
            CopyOut(tuple(s), int(off), tuple(st), tuple((int(a), int(b), float(c)) for a, b, c in steps))
            for s, off, st, steps in meta["outs"]
        )
        spec = CopySpec(int(meta["x_pos"]), outs)
        return cls(spec, [tuple(x) for x in meta["input_shapes"]], meta["input_dtypes"])
