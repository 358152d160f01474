"""Constant folding: Constant nodes, initializer-only subgraphs and Shape/Size chains.

Each round infers shapes, computes every Shape/Size whose input has a static shape
(numpy), collects every node whose inputs are all known constants, runs those in one
onnxruntime session, and turns the values that are still read into initializers.
Folding a Shape often makes a Reshape's target constant, which makes the next
round's shapes static, so rounds repeat until nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
_DEFAULT = ("", "ai.onnx")
MAX_ROUNDS = 32


def static_shape(tp: onnx.TypeProto | None) -> tuple[int, ...] | None:
    """The shape of a tensor type if every dimension is a number, else None."""
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in tp.tensor_type.shape.dim:
        if d.WhichOneof("value") != "dim_value":
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def fold_constants(model: onnx.ModelProto, infer: Callable[[onnx.ModelProto], onnx.ModelProto]) -> onnx.ModelProto:
    """Fold until a fixed point; ``infer`` is the caller's shape inference."""
    for _ in range(MAX_ROUNDS):
        model = infer(model)
        if not _fold_round(model):
            break
    return model


FOLD_MAX_ELEMENTS = 2**26  # a folded constant larger than this is left as a node


def _too_big(tp: onnx.TypeProto | None) -> bool:
    shape = static_shape(tp)
    return shape is not None and math.prod(shape) > FOLD_MAX_ELEMENTS


def _types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    return {vi.name: vi.type for vi in list(graph.input) + list(graph.value_info) + list(graph.output)}


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names that subgraphs of ``node`` read (outer-scope reads included)."""
    out: set[str] = set()
    for attr in node.attribute:
        for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for n in g.node:
                out.update(n.input)
                out |= subgraph_reads(n)
    return out


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(math.prod(shape), dtype=np.int64)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end")
    # Python slicing clamps exactly as the spec says (negative wraps once, then clamps).
    return np.array(shape[start:end], dtype=np.int64)


def _fold_round(model: onnx.ModelProto) -> bool:
    graph = model.graph
    types = _types(graph)
    inits = {t.name: t for t in graph.initializer}
    known = set(inits)
    values: dict[str, np.ndarray] = {}
    batch: list[int] = []
    folded: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.domain not in _DEFAULT or node.op_type in NONDETERMINISTIC or _has_subgraph(node):
            continue
        if node.op_type in ("Shape", "Size") and node.input[0] not in known:
            shape = static_shape(types.get(node.input[0]))
            if shape is not None:
                values[node.output[0]] = _shape_value(node, shape)
                known.add(node.output[0])
                folded.add(i)
            continue
        if any(_too_big(types.get(o)) for o in node.output if o):
            continue  # never materialise a huge constant; load_model reports the size
        if all(not name or name in known for name in node.input):
            batch.append(i)
            known.update(o for o in node.output if o)
            folded.add(i)
    if not folded:
        return False
    if batch:
        done = _run(model, [graph.node[i] for i in batch], values, inits)
        if len(done) != len(batch):  # some node failed in onnxruntime: leave it (and its users)
            folded -= {batch[k] for k in range(len(batch)) if k not in done}
            if not folded:
                return False
    read = {name for i, n in enumerate(graph.node) if i not in folded for name in n.input}
    read |= {vi.name for vi in graph.output}
    for i, n in enumerate(graph.node):
        if i not in folded:
            read |= subgraph_reads(n)
    remove_where(graph.node, lambda i, n: i in folded)
    for name, v in values.items():
        if name in read:
            add_initializer(graph, name, np.asarray(v))
    remove_where(graph.value_info, lambda i, v: v.name in values)
    return True


def remove_where(field, pred) -> None:
    """Delete the items of a repeated protobuf field in place (no copies of big tensors)."""
    for i in [i for i, item in enumerate(field) if pred(i, item)][::-1]:
        del field[i]


def add_initializer(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    """Append an initializer, writing numeric data straight into the new message."""
    t = graph.initializer.add()
    if value.dtype.kind in "biuf" and value.dtype.byteorder in "=<|":
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(value.dtype)
        t.dims.extend(value.shape)
        t.raw_data = np.ascontiguousarray(value).tobytes()
    else:
        t.CopyFrom(numpy_helper.from_array(value, name))


def _run(
    model: onnx.ModelProto,
    batch: list[onnx.NodeProto],
    values: dict[str, np.ndarray],
    inits: dict[str, onnx.TensorProto],
) -> set[int]:
    """Evaluate ``batch`` (adding to ``values``); returns the positions that succeeded.

    One onnxruntime session for the whole batch. If onnxruntime refuses it (an opset
    newer than it knows, say), node by node, with onnx's reference evaluator as the
    second try; a node both refuse is left unfolded with everything computed from it.
    """
    try:
        values.update(_evaluate(model, batch, values, inits, reference=False))
        return set(range(len(batch)))
    except Exception:
        pass
    done = set()
    for k, node in enumerate(batch):
        if any(name and name not in values and name not in inits for name in node.input):
            continue
        for reference in (False, True):
            try:
                values.update(_evaluate(model, [node], values, inits, reference=reference))
                done.add(k)
                break
            except Exception:
                continue
    return done


def _evaluate(model, nodes, values, inits, reference: bool) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    produced = {o for n in nodes for o in n.output if o}
    needed = {name for n in nodes for name in n.input if name and name not in produced}
    tensors = [inits[name] for name in needed if name in inits]
    tensors += [numpy_helper.from_array(np.asarray(values[name]), name) for name in needed if name not in inits]
    outs = [o for n in nodes for o in n.output if o]
    g = helper.make_graph(list(nodes), "fold", [], [helper.make_empty_tensor_value_info(o) for o in outs], tensors)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = min(model.ir_version or 10, 10)
    if reference:
        from onnx.reference import ReferenceEvaluator

        return dict(zip(outs, ReferenceEvaluator(m).run(outs, {})))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip(outs, sess.run(outs, {})))
