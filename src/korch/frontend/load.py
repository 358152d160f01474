"""Loading an ONNX model into the static form fission needs.

Note [Frontend contract]
~~~~~~~~~~~~~~~~~~~~~~~~
``load_model`` returns a new ModelProto (the caller's is never changed) that
* passes ``onnx.checker``, with nodes in topological order and model-local functions
  inlined;
* lists only runtime inputs as graph inputs (initializers are not inputs), each with
  a fully static shape (symbolic dims bound from ``shapes``);
* has no Constant node, no node computed from initializers alone and no Shape/Size
  node on a static shape: all are folded into initializers (see fold.py), so sizes
  that exporters compute at run time (torch's Pad and Reshape chains) are constants;
* has no node that cannot reach a graph output;
* gives every value (input, node output, output) a static tensor type in
  ``graph.input``, ``graph.value_info`` or ``graph.output``.

Everything wrong with the file is a ``ModelError`` with a one-line message naming the
node (``name`` and op type) or input concerned.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.message import DecodeError
from onnx import helper

from korch.errors import ModelError
from korch.frontend.fold import fold_constants, remove_where, static_shape, subgraph_reads

DEFAULT_DOMAINS = ("", "ai.onnx")
MAX_LEARN_ROUNDS = 64


def one_line(msg: object) -> str:
    """The text of an onnx/onnxruntime error squeezed onto one line."""
    text = str(msg).replace("==> Context:", ";")
    text = re.sub(r"\s+", " ", text).strip(" ;")
    return text[:400]


def node_label(node: onnx.NodeProto) -> str:
    name = f"{node.name!r} " if node.name else ""
    dom = f"{node.domain}." if node.domain not in DEFAULT_DOMAINS else ""
    return f"node {name}({dom}{node.op_type})"


def parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse a ``--shape`` argument ``NAME=d0,d1,...`` (``NAME=`` for a scalar)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise ModelError(f"bad --shape {text!r}: expected NAME=d0,d1,...")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        raise ModelError(f"bad --shape {text!r}: dimensions must be integers") from None
    if any(d < 1 for d in shape):
        raise ModelError(f"bad --shape {text!r}: dimensions must be >= 1")
    return name, shape


def load_model(
    path_or_model: str | os.PathLike | bytes | onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> onnx.ModelProto:
    """Load, check, bind shapes, fold constants and infer static shapes.

    ``shapes`` maps input names to concrete shapes; it must cover every symbolic or
    unknown input dimension. See Note [Frontend contract] for what comes back.
    """
    model, where = _read(path_or_model)
    shapes = dict(shapes or {})
    if not model.HasField("graph") or not model.graph.output:
        raise ModelError(f"{where}: not an ONNX model (no graph outputs)")
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    graph = model.graph
    _drop_initializer_inputs(graph)
    model.ir_version = max(model.ir_version, 4)  # IR < 4 requires initializers among the inputs
    _toposort(graph, where)
    try:
        if model.ByteSize() < 2**31 - 2**20:
            onnx.checker.check_model(model)
        elif os.path.exists(where):  # the checker reads models over 2 GB from their file
            onnx.checker.check_model(where)
    except (onnx.checker.ValidationError, ValueError) as e:
        raise ModelError(f"{where}: invalid ONNX model: {one_line(e)}") from None
    _check_initializers(graph, where)
    _bind_shapes(graph, shapes, where)
    del graph.value_info[:]  # exporters' symbolic shapes would mask the bound ones
    for out in graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    for _ in range(MAX_LEARN_ROUNDS):
        model = fold_constants(model, lambda m: infer_shapes(m, where, strict=False))
        if not _learn_types(model, where):
            break
    _prune_dead(model.graph)
    model = infer_shapes(model, where)
    _check_foreign_ops(model, where)
    _require_static(model.graph, where)
    _check_sizes(tensor_types(model), where)  # and every element type has a numpy equivalent
    return model


def _check_initializers(graph: onnx.GraphProto, where: str) -> None:
    """Each initializer holds as many values as its dims say (the checker does not look)."""
    for t in graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if any(d < 0 for d in t.dims):
            raise ModelError(f"{where}: initializer {t.name!r} has a negative dimension {list(t.dims)}")
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
            field = helper.tensor_dtype_to_field(t.data_type)
        except (KeyError, TypeError, ValueError, RuntimeError):
            raise ModelError(f"{where}: initializer {t.name!r} has unknown element type {t.data_type}") from None
        if dtype.kind not in "biuf" or t.data_type in _PACKED_TYPES:
            continue  # other types are rejected later (tensor_types) or packed sub-byte
        want = math.prod(t.dims)
        have = len(t.raw_data) / dtype.itemsize if t.raw_data else len(getattr(t, field))
        if have != want:
            raise ModelError(
                f"{where}: initializer {t.name!r} has dims {list(t.dims)} ({want} values) but holds {have:g} values"
            )


_PACKED_TYPES = {
    getattr(onnx.TensorProto, n)
    for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, n)
}

MAX_ELEMENTS = 2**31 - 1  # generated kernels index with 32-bit integers


def _check_sizes(types: dict[str, tuple[tuple[int, ...], str]], where: str) -> None:
    for name, (shape, _) in types.items():
        size = math.prod(shape)
        if size > MAX_ELEMENTS:
            raise ModelError(
                f"{where}: value {name!r} has shape {list(shape)} ({size:.3g} elements); "
                f"korch supports tensors of at most 2^31 - 1 elements"
            )


BIG_INITIALIZER = 4096  # elements; larger ones cannot be shape data


def infer_shapes(model: onnx.ModelProto, where: str, strict: bool = True) -> onnx.ModelProto:
    """ONNX shape inference (with data propagation) into ``model``; errors become ModelError.

    Inference runs on a skeleton whose large initializers are typed inputs instead:
    onnx serializes the model for every call, and weights are most of its bytes.
    """
    skeleton = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    g, sg = model.graph, skeleton.graph
    sg.name = g.name
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    sg.value_info.extend(g.value_info)
    for t in g.initializer:
        if math.prod(t.dims) <= BIG_INITIALIZER:
            sg.initializer.append(t)
        else:
            sg.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=strict, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError) as e:
        raise ModelError(f"{where}: shape inference failed: {one_line(e)}") from None
    del g.value_info[:]
    g.value_info.extend(inferred.graph.value_info)
    del g.output[:]
    g.output.extend(inferred.graph.output)
    return model


def _read(src) -> tuple[onnx.ModelProto, str]:
    if isinstance(src, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(src)
        return model, "model"
    if isinstance(src, bytes):
        where = "model"
        loader = lambda: onnx.load_from_string(src)  # noqa: E731
    else:
        where = os.fspath(src)
        loader = lambda: onnx.load(where)  # noqa: E731
    try:
        return loader(), where
    except DecodeError:
        raise ModelError(f"{where}: not a valid ONNX file (truncated or not protobuf)") from None
    except OSError as e:
        raise ModelError(f"{where}: cannot read: {one_line(e.strerror or e)}") from None
    except Exception as e:  # external data errors and the like surface as assorted types
        raise ModelError(f"{where}: cannot load ONNX model: {one_line(e)}") from None


def _drop_initializer_inputs(graph: onnx.GraphProto) -> None:
    """Old exporters list initializers as inputs; they are constants to us."""
    inits = {t.name for t in graph.initializer}
    keep = [vi for vi in graph.input if vi.name not in inits]
    if len(keep) != len(graph.input):
        del graph.input[:]
        graph.input.extend(keep)


def _toposort(graph: onnx.GraphProto, where: str) -> None:
    """Sort nodes topologically (stable); report dangling inputs and cycles by node."""
    available = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in available:
                raise ModelError(f"{where}: {node_label(node)} output {out!r} is defined twice")
            producer[out] = i
    deps: list[set[int]] = []
    for node in graph.node:
        d = set()
        for name in node.input:
            if not name or name in available:
                continue
            if name not in producer:
                raise ModelError(
                    f"{where}: {node_label(node)} input {name!r} is not produced by any node, input or initializer"
                )
            d.add(producer[name])
        deps.append(d)
    for vi in graph.output:
        if vi.name not in producer and vi.name not in available:
            raise ModelError(f"{where}: graph output {vi.name!r} is not produced by any node")
    users: list[list[int]] = [[] for _ in graph.node]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    missing = [len(d) for d in deps]
    ready = [i for i, m in enumerate(missing) if m == 0]
    order: list[int] = []
    while ready:
        i = min(ready)  # stable: keep the file's order where it is already valid
        ready.remove(i)
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                ready.append(u)
    if len(order) != len(graph.node):
        stuck = next(i for i, m in enumerate(missing) if m)
        raise ModelError(f"{where}: the graph has a cycle through {node_label(graph.node[stuck])}")
    if order != sorted(order):
        nodes = [graph.node[i] for i in order]
        copies = [onnx.NodeProto() for _ in nodes]
        for c, n in zip(copies, nodes):
            c.CopyFrom(n)
        del graph.node[:]
        graph.node.extend(copies)


def _bind_shapes(graph: onnx.GraphProto, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    names = [vi.name for vi in graph.input]
    for name in shapes:
        if name not in names:
            raise ModelError(f"{where}: --shape names {name!r}, which is not an input; inputs are: {', '.join(names)}")
    for vi in graph.input:
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"{where}: input {vi.name!r} is not a tensor")
        tt = vi.type.tensor_type
        given = shapes.get(vi.name)
        if not tt.HasField("shape"):
            if given is None:
                raise ModelError(f"{where}: input {vi.name!r} has unknown rank; pass --shape {vi.name}=d0,d1,...")
        else:
            dims = tt.shape.dim
            if given is not None and len(given) != len(dims):
                raise ModelError(f"{where}: --shape {vi.name} has rank {len(given)} but the input has rank {len(dims)}")
            for i, dim in enumerate(dims):
                fixed = dim.dim_value if dim.WhichOneof("value") == "dim_value" else None
                if given is None:
                    if fixed is None:
                        what = f"{dim.dim_param!r}" if dim.dim_param else "unknown"
                        raise ModelError(
                            f"{where}: input {vi.name!r} dimension {i} ({what}) is symbolic; "
                            f"pass --shape {vi.name}=d0,d1,..."
                        )
                elif fixed is not None and fixed != given[i]:
                    raise ModelError(
                        f"{where}: --shape {vi.name} dimension {i} is {given[i]} but the model fixes it to {fixed}"
                    )
        if given is not None:
            tt.ClearField("shape")
            tt.shape.SetInParent()
            for d in given:
                tt.shape.dim.add().dim_value = int(d)


def _prune_dead(graph: onnx.GraphProto) -> None:
    """Drop nodes no graph output depends on, then initializers nothing reads."""
    live = {vi.name for vi in graph.output}
    dead = set()
    for i in range(len(graph.node) - 1, -1, -1):
        node = graph.node[i]
        if any(o in live for o in node.output if o):
            live.update(node.input)
            live |= subgraph_reads(node)
        else:
            dead.add(i)
    remove_where(graph.node, lambda i, n: i in dead)
    produced = {o for n in graph.node for o in n.output}
    remove_where(graph.value_info, lambda i, v: v.name not in produced)
    remove_where(graph.initializer, lambda i, t: t.name not in live)


def _copy(msg):
    c = type(msg)()
    c.CopyFrom(msg)
    return c


def _value_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    out = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        out[vi.name] = vi.type
    for t in graph.initializer:
        out[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return out


def _untyped(tp: onnx.TypeProto | None) -> bool:
    """No inferred tensor type at all (a partial shape means inference ran: keep it)."""
    if tp is None or not tp.HasField("tensor_type"):
        return True
    return tp.tensor_type.elem_type == 0 or not tp.tensor_type.HasField("shape")


def _learn_types(model: onnx.ModelProto, where: str) -> bool:
    """Give types to outputs shape inference cannot type, by running the node once.

    ONNX has no inference for some function operators (GroupNormalization) and none
    for other domains; such a node with static inputs runs once in onnxruntime on
    zeros and its output shapes are recorded. (An operator with data-dependent
    shapes, NonZero say, does get a partial type from ONNX and is not run.)
    """
    graph = model.graph
    types = _value_types(graph)
    used = _used_names(graph)
    learned = False
    for node in graph.node:
        outs = [o for o in node.output if o]
        if not any(_untyped(types.get(o)) for o in outs if o in used):
            continue
        ins = [(name, types.get(name)) for name in node.input if name]
        if any(static_shape(t) is None for _, t in ins):
            continue
        if node.domain in DEFAULT_DOMAINS and _has_inference(node, model):
            infer_shapes(model, where)  # inference ran and failed: strict mode says why
            continue
        sess = _session(model, node, ins, where)
        feeds = {name: np.zeros(static_shape(t), _np_dtype(t)) for name, t in ins}
        try:
            values = sess.run(None, feeds)
        except Exception as e:
            raise ModelError(f"{where}: {node_label(node)}: onnxruntime failed to run it: {one_line(e)}") from None
        for name, val in zip(outs, values):
            if not _untyped(types.get(name)):
                continue
            vi = helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.asarray(val).dtype), list(np.shape(val))
            )
            target = next((o for o in graph.output if o.name == name), None)
            if target is not None:
                target.CopyFrom(vi)
            else:
                graph.value_info.append(vi)
            types[name] = vi.type
            learned = True
    return learned


def _has_inference(node: onnx.NodeProto, model: onnx.ModelProto) -> bool:
    version = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 1)
    try:
        return onnx.defs.get_schema(node.op_type, version).has_type_and_shape_inference_function
    except onnx.defs.SchemaError:
        return False


def _check_foreign_ops(model: onnx.ModelProto, where: str) -> None:
    """Operators outside the ONNX domain become opaque: onnxruntime must run them."""
    types = _value_types(model.graph)
    for node in model.graph.node:
        if node.domain not in DEFAULT_DOMAINS:
            _session(model, node, [(name, types.get(name)) for name in node.input if name], where)


def _np_dtype(tp: onnx.TypeProto) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type))


def _session(model, node, ins, where):
    import onnxruntime as ort

    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    try:
        if any(t is None for _, t in ins):
            raise ValueError("an input has no type")
        m = _single_node_model(model, node, ins, outs)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ModelError(f"{where}: {node_label(node)}: onnxruntime cannot run it: {one_line(e)}") from None


def _single_node_model(model, node, ins, outputs) -> onnx.ModelProto:
    inputs = [helper.make_value_info(name, t) for name, t in ins]
    g = helper.make_graph([node], "check", inputs, outputs)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = min(model.ir_version or 10, 10)
    return m


def _used_names(graph: onnx.GraphProto) -> set[str]:
    used = {name for n in graph.node for name in n.input} | {vi.name for vi in graph.output}
    for n in graph.node:
        used |= subgraph_reads(n)
    return used


def _require_static(graph: onnx.GraphProto, where: str) -> None:
    """Every value something reads has a static shape (unread optional outputs need not)."""
    types = _value_types(graph)
    used = _used_names(graph)
    for vi in graph.input:
        if static_shape(vi.type) is None:
            raise ModelError(f"{where}: input {vi.name!r} has no static shape")
    for node in graph.node:
        for out in node.output:
            if out in used and (out not in types or static_shape(types[out]) is None):
                raise ModelError(
                    f"{where}: {node_label(node)} output {out!r} has no static shape after binding and folding "
                    "(data-dependent shapes are not supported)"
                )


def tensor_types(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, numpy dtype name)}`` for every value of a loaded model."""
    out = {}
    for name, tp in _value_types(model.graph).items():
        shape = static_shape(tp)
        if shape is None or not tp.HasField("tensor_type"):
            continue
        elem = tp.tensor_type.elem_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name
        except (RuntimeError, KeyError, TypeError):
            dtype = None
        if dtype is None or np.dtype(dtype).kind not in "biuf":
            type_name = onnx.TensorProto.DataType.Name(elem) if elem else "undefined"
            raise ModelError(f"value {name!r} has element type {type_name}, which korch does not support")
        out[name] = (shape, dtype)
    return out


__all__ = ["load_model", "parse_shape_arg", "tensor_types", "infer_shapes", "one_line", "node_label"]
