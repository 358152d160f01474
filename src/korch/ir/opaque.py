"""Opaque primitives: ONNX operators without a fission rule, run by onnxruntime.

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
def _session(model_bytes: bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def run_opaque(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    import onnx

    model = opaque_model_bytes(node, [x.shape for x in xs], [str(x.dtype) for x in xs])
    sess = _session(model)
    proto = onnx.NodeProto()
    proto.ParseFromString(node.attr("node"))
    names = [n for n in proto.input if n]
    (out,) = sess.run(None, dict(zip(names, xs)))
    return out
