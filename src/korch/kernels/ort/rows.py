"""Row islands: token-wise chains of a transformer as 2-D tensors (Note [Row islands]).

Used by ``korch.kernels.ort.export`` on every model it exports; an ONNX-to-ONNX pass, so it
also applies to a model korch did not export.
"""

from __future__ import annotations

import functools

import numpy as np

from korch.kernels.ort.layout import ELEMENTWISE_UNARY, finish_rewrite, node_attrs, users_of

# Note [Row islands]
# ~~~~~~~~~~~~~~~~~~
# A transformer layer's linear layers read [batch, tokens, features] tensors. onnxruntime
# fuses a MatMul and its bias Add into one Gemm, which is 2-D, so for a 3-D input it
# puts a Reshape before the Gemm and one after it (MatMulAddFusion): six Reshapes per
# ViT layer (the output projection, fc1, fc2), 73 in vit_tiny_b1's graph after the
# raised Attentions, each a kernel dispatch of its own (0.47 of 12.4 ms of operator time
# under onnxruntime's profiler).
#
# Between two operators that need the 3-D shape (an Attention, a Transpose, a Reshape to
# heads ...), the layer is row-wise: every operator treats each token's feature vector
# on its own (MatMul by a constant matrix, bias and residual Adds, LayerNormalization
# and Softmax over the last axis, elementwise activations). Such a connected set of
# operators (an *island*) runs the same numbers on [batch x tokens, features]: the pass
# reshapes each tensor entering the island once, each tensor leaving it once, and the
# island's MatMul+Add pairs become Gemms with no Reshapes of their own. On vit_tiny_b1
# that is two Reshapes per layer instead of six.
#
# An island is rewritten only when it saves Reshapes: it must hold more MatMuls by a
# constant matrix (two Reshapes each, when onnxruntime fuses their bias) than it has
# tensors entering and leaving it. Its tensors all have the same leading dimensions; a
# constant operand of an elementwise operator must broadcast along the last axis only
# (a scalar, or [..., 1, features] with leading ones), and is reshaped to 1-D.

# (beyond ELEMENTWISE_UNARY: operators whose padded channels could be infinite, which
# does not matter here, and onnxruntime's fused activations)
_UNARY = ELEMENTWISE_UNARY | frozenset(
    {"FastGelu", "QuickGelu", "BiasGelu", "Exp", "Log", "Sqrt", "Reciprocal", "Cast"}
)
SMALL_CONST = 64  # elements: constants up to this size keep their values for shape inference
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})
_LAST_AXIS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "Softmax", "LogSoftmax"})


@functools.cache
def _symbolic_shape_inference():
    """onnxruntime's ``SymbolicShapeInference``, loaded from its file: importing it as
    ``onnxruntime.tools.symbolic_shape_infer`` runs the package's ``__init__``, which
    imports torch when it is installed (1.2 s, and torch's thread pools in the process)."""
    import importlib.util
    from pathlib import Path

    import onnxruntime

    path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
    spec = importlib.util.spec_from_file_location("korch_ort_symbolic_shape_infer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SymbolicShapeInference


def _shapes(model) -> dict[str, tuple[int, ...]]:
    """Static shapes of every tensor onnxruntime's symbolic shape inference can size
    (it knows the contrib operators korch emits, e.g. Attention)."""
    import onnx
    from onnx import helper

    # the inference copies the model: weights go in as typed graph inputs (bert2_b1's
    # 151 MB graph: 0.33 -> 0.02 s); small constants (shapes, axes) keep their values
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.graph.node.extend(model.graph.node)
    light.graph.input.extend(model.graph.input)
    light.graph.output.extend(model.graph.output)
    for t in model.graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= SMALL_CONST:
            light.graph.initializer.append(t)
        else:
            light.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    inferred = _symbolic_shape_inference().infer_shapes(light, auto_merge=True)
    out: dict[str, tuple[int, ...]] = {}
    g = inferred.graph
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = tuple(d.dim_value for d in dims)
    for t in g.initializer:
        out[t.name] = tuple(t.dims)
    return out


def _row_const(t) -> bool:
    """Whether constant ``t`` broadcasts along the last axis only."""
    dims = list(t.dims)
    return all(d == 1 for d in dims[:-1])


def _member(n, shapes: dict, inits: dict, lead: tuple[int, ...], opset: int) -> bool:
    """Whether node ``n`` is row-wise over tensors with leading dims ``lead``."""
    outs = [o for o in n.output if o]
    if len(outs) != 1 or shapes.get(outs[0], ())[:-1] != lead or len(shapes[outs[0]]) != len(lead) + 1:
        return False
    rank = len(lead) + 1
    ins = [i for i in n.input if i]
    if n.domain not in ("", "ai.onnx", "com.microsoft"):
        return False
    if n.op_type == "MatMul":
        return _const_matmul(n, inits) and shapes.get(ins[0], ())[:-1] == lead
    if n.op_type in _UNARY:  # (Clip's bounds must be constants: a tensor would be reshaped)
        return shapes.get(ins[0], ()) == shapes[outs[0]] and all(i in inits for i in ins[1:])
    if n.op_type in _BINARY:
        for i in ins:
            if i in inits:
                if not _row_const(inits[i]):
                    return False
            elif shapes.get(i) != shapes[outs[0]]:
                return False
        return any(i not in inits for i in ins)
    if n.op_type in _LAST_AXIS:
        # (before opset 13 a Softmax's axis defaults to 1)
        axis = node_attrs(n).get("axis", 1 if n.op_type in ("Softmax", "LogSoftmax") and opset < 13 else -1)
        if axis not in (-1, rank - 1) or shapes.get(ins[0]) != shapes[outs[0]]:
            return False
        return all(i in inits and len(inits[i].dims) == 1 for i in ins[1:])
    return False


def _const_matmul(n, inits: dict) -> bool:
    """A MatMul by a constant matrix (2-D)."""
    return n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits and len(inits[n.input[1]].dims) == 2


def _gemm_like(n, inits: dict, users: dict) -> bool:
    """A MatMul by a constant matrix whose output only a bias Add reads (a constant
    along the last axis): what onnxruntime fuses into a Gemm, with two Reshapes on a
    3-D input (a [1, 1, N] bias it fuses once the island has made it [N])."""
    if not _const_matmul(n, inits):
        return False
    us = users.get(n.output[0], [])
    return (
        len(us) == 1
        and us[0].op_type == "Add"
        and any(i in inits and _row_const(inits[i]) for i in us[0].input if i != n.output[0])
    )


def flatten_rows(model):
    """``model`` (an ``onnx.ModelProto``, changed in place and returned) with its row
    islands (Note [Row islands]) computed on 2-D tensors."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    users = users_of(g)
    if not any(_gemm_like(n, inits, users) for n in g.node):
        return model
    try:
        shapes = _shapes(model)
    except Exception:  # noqa: BLE001 - an operator the inference does not know: no islands
        return model
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output}

    def lead_of(n):
        o = n.output[0] if n.output else ""
        s = shapes.get(o)
        return s[:-1] if s is not None and len(s) >= 3 else None

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    taken = {t for n in g.node for t in n.output} | set(inits) | {i.name for i in g.input}
    member: dict[int, tuple[int, ...]] = {}
    for n in g.node:
        lead = lead_of(n)
        if lead is not None and _member(n, shapes, inits, lead, opset):
            member[id(n)] = lead
    seen: set[int] = set()
    new_inits: list = []
    after: dict[str, list] = {}  # tensor -> the Reshapes reading it, placed after its producer
    flat_consts: set[str] = set()
    n_islands = 0
    for n in g.node:
        if id(n) not in member or id(n) in seen:
            continue
        lead = member[id(n)]
        island, stack = [], [n]
        seen.add(id(n))
        while stack:  # the connected component of members with the same leading dims
            m = stack.pop()
            island.append(m)
            near = [producer[i] for i in m.input if i in producer] + [u for o in m.output for u in users.get(o, [])]
            for x in near:
                if id(x) in member and member[id(x)] == lead and id(x) not in seen:
                    seen.add(id(x))
                    stack.append(x)
        ids = {id(m) for m in island}
        made = {o for m in island for o in m.output}
        entering = sorted({i for m in island for i in m.input if i and i not in made and i not in inits})
        leaving = sorted(o for o in made if o in outputs or any(id(u) not in ids for u in users.get(o, [])))
        if 2 * sum(_gemm_like(m, inits, users) for m in island) <= len(entering) + len(leaving):
            continue
        rows = int(np.prod(lead))
        tag = f"korch_rows{n_islands}"
        while f"{tag}_flat" in taken:
            tag += "_"
        n_islands += 1
        flat_shape = f"{tag}_flat"
        new_inits.append(numpy_helper.from_array(np.array([rows, -1], np.int64), flat_shape))
        local = {t: f"{t}_{tag}" for t in entering}
        for t in entering:
            after.setdefault(t, []).append(
                helper.make_node("Reshape", [t, flat_shape], [local[t]], name=f"{tag}_in_{t}")
            )
        for o in leaving:
            local[o] = f"{o}_{tag}"
            shape_name = f"{o}_{tag}_shape"
            new_inits.append(numpy_helper.from_array(np.array(shapes[o], np.int64), shape_name))
            after.setdefault(local[o], []).append(
                helper.make_node("Reshape", [local[o], shape_name], [o], name=f"{tag}_out_{o}")
            )
        for m in island:
            for k, i in enumerate(m.input):
                if i in local:
                    m.input[k] = local[i]
                elif i in inits and m.op_type in _BINARY and len(inits[i].dims) > 1:
                    flat = f"{i}_{tag}_row"
                    if flat not in flat_consts:
                        flat_consts.add(flat)
                        new_inits.append(numpy_helper.from_array(numpy_helper.to_array(inits[i]).reshape(-1), flat))
                    m.input[k] = flat
            for k, o in enumerate(m.output):
                m.output[k] = local.get(o, o)
            if m.op_type in _LAST_AXIS:
                for a in m.attribute:
                    if a.name == "axis":
                        a.i = -1
    if not n_islands:
        return model
    # each Reshape right after what makes its input (a graph input's: first)
    nodes = [r for i in g.input for r in after.get(i.name, [])]
    for n in list(g.node):
        nodes.append(n)
        nodes.extend(r for o in n.output for r in after.get(o, []))
    del g.node[:]
    g.node.extend(nodes)
    finish_rewrite(g, new_inits)
    return model
