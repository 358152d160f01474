"""The fission driver: ONNX graph in, primitive graph out (see Note [Fission rules])."""

from __future__ import annotations

import functools

import onnx
from onnx import helper, numpy_helper

from korch.errors import ModelError
from korch.fission.registry import RULES, Ctx, Unsupported, Value
from korch.frontend import tensor_types
from korch.frontend.fold import subgraph_reads
from korch.frontend.load import DEFAULT_DOMAINS, node_label, one_line
from korch.ir import Graph, GraphBuilder, Op, verify


def fission(model: onnx.ModelProto) -> Graph:
    """Split every operator of ``model`` into primitives; the rest become OPAQUE.

    Precondition: ``model`` comes from ``korch.frontend.load_model`` (static shapes on
    every value, nodes in topological order). The result passes ``korch.ir.verify``;
    its inputs and outputs keep the ONNX names, initializers become named constants.
    """
    graph = model.graph
    types = tensor_types(model)
    opset = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 1)
    opsets = tuple(sorted((o.domain, int(o.version)) for o in model.opset_import))
    used = {name for node in graph.node for name in node.input if name}
    used |= {vi.name for vi in graph.output}
    for node in graph.node:
        used |= subgraph_reads(node)

    b = GraphBuilder()
    env: dict[str, int] = {}
    for vi in graph.input:
        if vi.name not in types:
            raise ModelError(f"input {vi.name!r} has no static shape (load the model with korch.frontend.load_model)")
        env[vi.name] = b.input(vi.name, *types[vi.name])
    for init in graph.initializer:
        env[init.name] = b.const(numpy_helper.to_array(init), name=init.name)

    for node in graph.node:
        out_types = [types.get(o) if o else None for o in node.output]
        needed = [k for k, o in enumerate(node.output) if o in used]
        for name in node.input:
            if name and name not in env:
                raise ModelError(
                    f"{node_label(node)}: input {name!r} is undefined (nodes must be topologically sorted)"
                )
        try:
            result = _apply_rule(b, node, env, opset, out_types, needed)
        except _RuleMismatch:
            # ONNX shape inference can pass a node whose operands do not fit together
            # (found by fuzzing: InstanceNormalization with x and scale swapped); if
            # onnxruntime cannot run it either, the model is wrong, not the rule.
            problem = _ort_cannot_run(model, node, {n: b.node(env[n]) for n in node.input if n})
            if problem:
                raise ModelError(f"{node_label(node)}: its inputs do not fit together: {problem}") from None
            raise
        if result is None:
            result = _opaque(b, node, env, opsets, out_types, needed)
        for k in needed:
            env[node.output[k]] = result[k]

    for vi in graph.output:
        b.output(vi.name, env[vi.name])
    out = _prune(b.graph)
    verify(out)
    return out


def _attrs(node: onnx.NodeProto) -> dict | None:
    """Attribute values as Python/numpy values; None if one is a subgraph or sparse."""
    out = {}
    A = onnx.AttributeProto
    for a in node.attribute:
        if (
            a.type in (A.GRAPH, A.GRAPHS, A.SPARSE_TENSOR, A.SPARSE_TENSORS, A.TYPE_PROTO, A.TYPE_PROTOS)
            or a.ref_attr_name
        ):
            return None
        v = helper.get_attribute_value(a)
        if a.type == A.STRING:
            v = v.decode()
        elif a.type == A.STRINGS:
            v = [s.decode() for s in v]
        elif a.type == A.TENSOR:
            v = numpy_helper.to_array(v)
        elif a.type == A.TENSORS:
            v = [numpy_helper.to_array(t) for t in v]
        elif a.type in (A.INTS, A.FLOATS):
            v = list(v)
        out[a.name] = v
    return out


class _RuleMismatch(RuntimeError):
    """A rule built an output whose type differs from ONNX's inference."""


def _ort_cannot_run(model: onnx.ModelProto, node: onnx.NodeProto, inputs: dict) -> str | None:
    """Why onnxruntime fails to run ``node`` alone on zeros of its inputs' types, or None."""
    import numpy as np
    import onnxruntime as ort

    try:
        ins = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)), list(v.shape))
            for n, v in inputs.items()
        ]
        outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        m = helper.make_model(helper.make_graph([node], "check", ins, outs), opset_imports=list(model.opset_import))
        m.ir_version = min(model.ir_version or 10, 10)
        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # the failure is reported as a ModelError, not logged
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        run_opts = ort.RunOptions()
        run_opts.log_severity_level = 4
        sess.run(None, {n: np.zeros(v.shape, v.dtype) for n, v in inputs.items()}, run_opts)
    except Exception as e:  # noqa: BLE001 - the reason is the answer
        return one_line(e)[:300]
    return None


def _apply_rule(b, node, env, opset, out_types, needed) -> list | None:
    fn = RULES.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
    if fn is None:
        return None
    attrs = _attrs(node)
    if attrs is None or not set(attrs) <= fn.attr_names:
        return None
    inputs = list(node.input)
    while inputs and not inputs[-1]:
        inputs.pop()
    if fn.max_inputs is not None and len(inputs) > fn.max_inputs:
        return None
    if any(name in attrs for name in fn.input_names[: len(inputs)]):
        return None  # an attribute and an input both give one parameter (a malformed node)
    ctx = Ctx(b, opset, out_types)
    try:
        result = fn(ctx, *[Value(env[n]) if n else None for n in inputs], **attrs)
    except Unsupported:
        return None
    except ModelError as e:
        raise ModelError(f"{node_label(node)}: {e}") from None
    except ValueError as e:  # a shape rule refused its operands: ONNX inference let an inconsistency through
        msg = " ".join(str(e).split())[:300]
        raise ModelError(f"{node_label(node)}: its inputs do not fit together: {msg}") from None
    result = list(result) if isinstance(result, (tuple, list)) else [result]
    result += [None] * (len(node.output) - len(result))
    if any(result[k] is None for k in needed):
        return None
    for k in needed:
        got = (b.shape(result[k]), b.dtype(result[k]))
        if out_types[k] is not None and got != out_types[k]:
            raise _RuleMismatch(
                f"fission rule {node.op_type} ({node_label(node)}) built output {k} as {got[1]}{list(got[0])}, "
                f"ONNX infers {out_types[k][1]}{list(out_types[k][0])}"
            )
    return result


def _opaque(b, node, env, opsets, out_types, needed) -> list:
    """One OPAQUE primitive per used output, carrying the renamed NodeProto."""
    outer = _outer_reads(node)
    if outer:
        raise ModelError(f"{node_label(node)}: its subgraph reads outer value {sorted(outer)[0]!r}; not supported")
    problem = _ort_rejects(opsets)
    if problem:
        raise ModelError(
            f"{node_label(node)} has no fission rule and onnxruntime cannot run the model's opsets: {problem}"
        )
    proto = onnx.NodeProto()
    proto.CopyFrom(node)
    proto.name = ""  # structurally equal operators are the same primitive
    del proto.input[:]
    proto.input.extend(f"in{k}" if n else "" for k, n in enumerate(node.input))
    del proto.output[:]
    proto.output.extend(f"out{k}" if n else "" for k, n in enumerate(node.output))
    blob = proto.SerializeToString(deterministic=True)
    ins = [env[n] for n in node.input if n]
    result: list = [None] * len(node.output)
    for k in needed:
        if out_types[k] is None:
            raise ModelError(f"{node_label(node)}: output {node.output[k]!r} has no static shape")
        shape, dtype = out_types[k]
        result[k] = b.add(Op.OPAQUE, ins, node=blob, out_index=k, opset=opsets, shape=shape, dtype=dtype)
    return result


@functools.lru_cache(maxsize=64)
def _ort_rejects(opsets: tuple[tuple[str, int], ...]) -> str | None:
    """Why onnxruntime refuses a model with these opset imports (too new, say), or None."""
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        return one_line(e)
    return None


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names a subgraph of ``node`` reads from outside itself (none for plain operators)."""
    out: set[str] = set()
    for a in node.attribute:
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            defined = {vi.name for vi in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                out |= {i for i in n.input if i and i not in defined}
                out |= _outer_reads(n) - defined
                defined.update(n.output)
    return out


def _prune(graph: Graph) -> Graph:
    """Keep graph inputs and the nodes some output needs (failed rules leave dead nodes)."""
    live = set(graph.outputs.values()) | set(graph.inputs.values())
    for nid in range(len(graph.nodes) - 1, -1, -1):
        if nid in live:
            live.update(graph.nodes[nid].inputs)
    if len(live) == len(graph.nodes):
        return graph
    b = GraphBuilder()
    remap: dict[int, int] = {}
    for nid, node in enumerate(graph.nodes):
        if nid not in live:
            continue
        attrs = dict(node.attrs)
        if node.op is Op.INPUT:
            remap[nid] = b.input(attrs["name"], node.shape, node.dtype)
            continue
        if node.op is Op.CONST and "name" in attrs:
            b.graph.consts[attrs["name"]] = graph.consts[attrs["name"]]
        if node.op in (Op.CONST, Op.OPAQUE):
            attrs.update(shape=node.shape, dtype=node.dtype)
        remap[nid] = b.add(node.op, [remap[i] for i in node.inputs], **attrs)
    for name, nid in graph.outputs.items():
        b.output(name, remap[nid])
    return b.graph


__all__ = ["fission"]
