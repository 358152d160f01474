"""Native TopK: an opaque ONNX TopK kernel run by korch's runtime (Note [Native TopK] in
``korch_rt.cc``), so that it can be a step of a native segment instead of an
onnxruntime session between two segments.

A kernel graph qualifies when its compute nodes are the OPAQUE outputs (values,
indices or both) of one default-domain TopK with ``sorted = 1``, a float32 input and a
constant K (an ``in{i}_c`` input, or the attribute before opset 10). The code the
runtime reads (``korch_linear_create``, op 2)::

    1, 2, n inputs, n outputs, 0, 0, x pos, 0, D, values shape[D],
    outer, axis length, inner, k, largest, per output (0 values, 1 indices), 0 steps
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.base import buffer_address
from korch.kernels.native.rtkernel import RuntimeKernel


class TopKSpec:
    """What the runtime needs of a TopK kernel graph: its input, axis, k and outputs."""

    def __init__(self, x_pos: int, k_pos: int | None, k_attr: int | None, axis: int, largest: bool, which):
        self.x_pos, self.k_pos, self.k_attr = x_pos, k_pos, k_attr
        self.axis, self.largest, self.which = axis, largest, list(which)


def topk_spec(kgraph: Graph) -> TopKSpec | None:
    """The kernel as a TopK the runtime runs, or None (module docstring)."""
    import onnx

    nodes = [kgraph.nodes[i] for i in kgraph.compute_ids()]
    if not nodes or any(n.op is not Op.OPAQUE for n in nodes) or len({n.attr("node") for n in nodes}) != 1:
        return None
    proto = onnx.NodeProto.FromString(nodes[0].attr("node"))
    if proto.op_type != "TopK" or proto.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
    if int(attrs.get("sorted", 1)) != 1:
        return None  # unsorted order is the implementation's: onnxruntime's is not specified
    outputs = [kgraph.nodes[nid] for nid in kgraph.outputs.values()]
    if any(n.op is not Op.OPAQUE for n in outputs):
        return None
    which = [int(n.attr("out_index")) for n in outputs]
    if len(set(which)) != len(which) or any(w not in (0, 1) for w in which):
        return None
    if any(o.dtype != ("float32" if w == 0 else "int64") for o, w in zip(outputs, which)):
        return None
    src = nodes[0].inputs
    names = {nid: name for name, nid in kgraph.inputs.items()}
    order = list(kgraph.inputs)
    if src[0] not in names or kgraph.nodes[src[0]].dtype != "float32":
        return None
    k_pos = k_attr = None
    if len(src) > 1:
        if src[1] not in names or not names[src[1]].endswith("_c"):
            return None  # K computed at run time
        k_pos = order.index(names[src[1]])
    elif "k" in attrs:
        k_attr = int(attrs["k"])
    else:
        return None
    rank = len(kgraph.nodes[src[0]].shape)
    axis = int(attrs.get("axis", -1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        return None
    return TopKSpec(order.index(names[src[0]]), k_pos, k_attr, axis, bool(int(attrs.get("largest", 1))), which)


def encode_topk(spec: TopKSpec, x_shape: Sequence[int], k: int, n_inputs: int) -> np.ndarray:
    shape = [int(s) for s in x_shape]
    length = shape[spec.axis]
    if not 1 <= k <= length:
        raise ValueError(f"TopK: k = {k} outside 1..{length}")
    out = [*shape[: spec.axis], k, *shape[spec.axis + 1 :]]
    outer, inner = math.prod(shape[: spec.axis]), math.prod(shape[spec.axis + 1 :])
    code = [1, 2, n_inputs, len(spec.which), 0, 0, spec.x_pos, 0, len(out), *out]
    code += [outer, length, inner, k, int(spec.largest), *spec.which, 0]
    return np.asarray(code, dtype=np.int64)


class NativeTopKKernel(RuntimeKernel):
    def __init__(self, spec: TopKSpec, k: int, input_shapes: Sequence[tuple[int, ...]], input_dtypes: Sequence[str]):
        self.spec, self.k = spec, int(k)
        self.input_shapes = [tuple(int(d) for d in s) for s in input_shapes]
        self.input_dtypes = [str(d) for d in input_dtypes]
        x_shape = self.input_shapes[spec.x_pos]
        self.out_shape = tuple(x_shape[: spec.axis]) + (self.k,) + tuple(x_shape[spec.axis + 1 :])
        self.out_dtypes = ["float32" if w == 0 else "int64" for w in spec.which]
        self._create(encode_topk(spec, x_shape, self.k, len(self.input_shapes)))
        self._ptrs = (ctypes.c_void_p * (len(self.input_shapes) + len(spec.which)))()

    def arg_specs(self) -> tuple[list[tuple[tuple[int, ...], str]], list[tuple[tuple[int, ...], str]]]:
        """(shape, dtype) of each input and output, as a segment lays them out."""
        return list(zip(self.input_shapes, self.input_dtypes)), [(self.out_shape, d) for d in self.out_dtypes]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = np.ascontiguousarray(inputs[self.spec.x_pos], dtype=np.float32)
        self._ptrs[self.spec.x_pos] = buffer_address(x)
        outs = [np.empty(self.out_shape, dtype=d) for d in self.out_dtypes]
        for j, o in enumerate(outs):
            self._ptrs[len(self.input_shapes) + j] = buffer_address(o)
        self._run("TopK")
        return outs

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        s = self.spec
        return {
            "backend": self.backend,
            "op": "topk",
            "x_pos": s.x_pos,
            "k_pos": s.k_pos,
            "k_attr": s.k_attr,
            "axis": s.axis,
            "largest": s.largest,
            "which": s.which,
            "k": self.k,
            "input_shapes": [list(x) for x in self.input_shapes],
            "input_dtypes": self.input_dtypes,
        }


def constant_k(kgraph: Graph, spec: TopKSpec, consts: dict[str, np.ndarray]) -> int:
    """The TopK's K: its constant input's one value, or the attribute."""
    if spec.k_pos is None:
        return int(spec.k_attr)  # type: ignore[arg-type]
    kv = np.asarray(consts[list(kgraph.inputs)[spec.k_pos]]).reshape(-1)
    if kv.size != 1:
        raise ValueError("TopK: K is not one value")
    return int(kv[0])


def build_topk(kgraph: Graph, spec: TopKSpec, consts: dict[str, np.ndarray]) -> NativeTopKKernel:
    k = constant_k(kgraph, spec, consts)
    shapes = [tuple(kgraph.nodes[nid].shape) for nid in kgraph.inputs.values()]
    dtypes = [kgraph.nodes[nid].dtype for nid in kgraph.inputs.values()]
    return NativeTopKKernel(spec, k, shapes, dtypes)


def load_topk(meta: dict[str, Any]) -> NativeTopKKernel:
    spec = TopKSpec(meta["x_pos"], meta["k_pos"], meta["k_attr"], meta["axis"], meta["largest"], meta["which"])
    return NativeTopKKernel(spec, meta["k"], [tuple(s) for s in meta["input_shapes"]], meta["input_dtypes"])
