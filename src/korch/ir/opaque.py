"""Opaque primitives: ONNX operators without a fission rule.

The reference interpreter runs one with ONNX's own reference evaluator
(``onnx.reference``, numpy); executables run them through a backend (onnxruntime:
``korch.kernels.ort``), which may pass its own runner to ``korch.ir.interp.evaluate``.

An OPAQUE node carries the original NodeProto (serialized, inputs renamed ``in0..``,
outputs ``out0..``), the opset imports, and which of the node's outputs it stands
for. Every output of a multi-output operator is its own OPAQUE node; each runs the
whole operator (a small redundancy we accept for operators that are rare).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from korch.ir.graph import Node


def opaque_model_bytes(node: Node, in_shapes: Sequence[tuple], in_dtypes: Sequence[str]) -> bytes:
    """A one-node ONNX model computing ``node`` (all outputs, ``out_index`` first listed)."""
    import onnx
    from onnx import helper

    proto = onnx.NodeProto()
    proto.ParseFromString(node.attr("node"))
    inputs = []
    it = iter(zip(in_shapes, in_dtypes))
    for name in proto.input:
        if name == "":
            continue
        shape, dtype = next(it)
        inputs.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))
        )
    out_name = proto.output[node.attr("out_index")]
    outputs = [
        helper.make_tensor_value_info(out_name, helper.np_dtype_to_tensor_dtype(np.dtype(node.dtype)), list(node.shape))
    ]
    graph = helper.make_graph([proto], "opaque", inputs, outputs)
    opsets = [helper.make_opsetid(d, v) for d, v in node.attr("opset")]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)
    return model.SerializeToString()


@functools.lru_cache(maxsize=256)
def _evaluator(model_bytes: bytes):
    import onnx
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(onnx.load_model_from_string(model_bytes))


def opaque_input_names(node: Node) -> list[str]:
    """The names of the operator's present inputs, in order."""
    import onnx

    proto = onnx.NodeProto()
    proto.ParseFromString(node.attr("node"))
    return [n for n in proto.input if n]


def run_opaque(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    """The reference value of an OPAQUE node on ``xs`` (ONNX's reference evaluator)."""
    model = opaque_model_bytes(node, [x.shape for x in xs], [str(x.dtype) for x in xs])
    (out,) = _evaluator(model).run(None, dict(zip(opaque_input_names(node), xs)))
    return np.asarray(out)


# Note [Index operands]
# ~~~~~~~~~~~~~~~~~~~~~
# Some opaque operators read an integer operand as positions along an axis of another
# operand, and fail on a position out of range. A kernel measured alone gets random
# inputs (``korch.profile.timing.random_inputs``); small integers in [0, 4) are valid
# positions for a table of four or more rows, but roberta's token-type Gather reads a
# table of two rows at positions computed in the model (always 0 there), so every
# measurement of it failed ("indices element out of data bounds, idx=3"). The inputs
# of a kernel that feed such an operand directly are drawn below the size of the axis
# they index. ONNX operators, the default domain:
#   Gather, GatherElements, ScatterElements (indices: input 1, into input 0 at ``axis``)
#   GatherND, ScatterND (the last axis of input 1 indexes the axes of input 0 after
#   ``batch_dims``: below the smallest of them)
_AXIS_INDEXED = frozenset({"Gather", "GatherElements", "ScatterElements", "Scatter"})
_ND_INDEXED = frozenset({"GatherND", "ScatterND"})


def index_bounds(node: Node, in_shapes: Sequence[tuple]) -> dict[int, int]:
    """Of an OPAQUE node with inputs of ``in_shapes``: for each input position read as
    positions along an axis of another input, that axis's size (valid positions are
    ``[0, size)``). Note [Index operands]."""
    import onnx
    from onnx import helper

    proto = onnx.NodeProto()
    proto.ParseFromString(node.attr("node"))
    if proto.domain not in ("", "ai.onnx") or len(in_shapes) < 2:
        return {}
    attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
    data, idx = tuple(in_shapes[0]), tuple(in_shapes[1])
    if proto.op_type in _AXIS_INDEXED and data:
        return {1: int(data[int(attrs.get("axis", 0)) % len(data)])}
    if proto.op_type in _ND_INDEXED and idx:
        b = int(attrs.get("batch_dims", 0))
        dims = data[b : b + int(idx[-1])]
        return {1: int(min(dims))} if dims else {}
    return {}
