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
