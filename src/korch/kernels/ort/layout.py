"""Channel padding for onnxruntime's blocked layout (Note [Channel padding]).

Used by ``korch.kernels.ort.export`` on every model it exports; an ONNX-to-ONNX pass, so it
also applies to a model korch did not export.
"""

from __future__ import annotations

import functools

import numpy as np

# Note [Channel padding]
# ~~~~~~~~~~~~~~~~~~~~~~
# onnxruntime's NCHWc transformer runs a Conv in its blocked layout (channels in
# blocks of 16 with AVX-512, 8 with AVX2) only when the input's channels are a multiple
# of the block; it pads a Conv's *output* channels itself, but a Conv reading, say, 8
# channels takes them in plain NCHW, so the tensor before it is reordered back out of
# the blocked layout (ReorderOutput) and the Conv runs its NCHW-input kernel, made for
# a network's 3-channel first layer. On efficientvit_b16's first stage (8 channels at
# 112x112) that was two ReorderOutputs and two 1x1 Convs costing 6.1 of 35.5 ms.
#
# The pass pads such a tensor to the next multiple of the block with channels that are
# never read: the Conv producing it gets zero rows (and zero bias), the Conv reading it
# zero columns, so the padding contributes exactly 0 to every real channel and the
# model computes the same numbers. Between the two, only channel-wise operators are
# allowed (elementwise, depthwise Conv, pooling, BatchNormalization; a per-channel
# constant operand is padded too, with 0 for Add/Sub and 1 for Mul/Div so the padding
# stays finite). A connected set of such tensors (a *region*) is padded whole or not
# at all: any other use (a graph output, Reshape, Concat, a reduction over channels
# ...) leaves it as it is. Padding costs work (the padded channels are computed), so a
# region is padded only when it at most doubles its channels.

# elementwise operators of one tensor (Clip's bounds, when given, are scalars); each maps 0 to a
# finite value, so padded channels stay finite
ELEMENTWISE_UNARY = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Clip",
        "Elu",
        "Selu",
        "Softplus",
        "Gelu",
        "Erf",
        "Abs",
        "Neg",
        "Identity",
        "Mish",
    }
)
_BINARY_PAD = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0, "Max": 0.0, "Min": 0.0, "PRelu": 0.0}
_POOLS = frozenset({"MaxPool", "AveragePool"})


@functools.cache
def nchwc_block() -> int:
    """onnxruntime's NCHWc block on this CPU: 16 with AVX-512, else 8."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return 8
    return 16 if " avx512f" in flags else 8


def users_of(g) -> dict[str, list]:
    """Tensor name -> the nodes of ``g`` (an ``onnx.GraphProto``) that read it."""
    users: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    return users


def node_attrs(n) -> dict:
    """The attributes of ``n`` (an ``onnx.NodeProto``) by name, as Python values."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def finish_rewrite(g, new_inits: list) -> None:
    """Add ``new_inits`` to ``g``, drop initializers no node or graph input reads any
    more, and the value_info a rewrite made stale."""
    g.initializer.extend(new_inits)
    live = {i for n in g.node for i in n.input} | {v.name for v in g.input}
    # deleted in place: re-adding the live ones would copy every weight (150 MB for bert2_b1)
    for k in reversed([k for k, t in enumerate(g.initializer) if t.name not in live]):
        del g.initializer[k]
    del g.value_info[:]


def _pads_output(n, inits: dict, block: int) -> bool:
    if n.op_type != "Conv" or len(n.input) < 2 or n.input[1] not in inits:
        return False
    c = inits[n.input[1]].dims[0]
    return c % block != 0 and -(-c // block) * block <= 2 * c


def pad_channels(model, block: int | None = None):
    """``model`` (an ``onnx.ModelProto``, changed in place and returned) with the
    regions of Note [Channel padding] padded to a multiple of ``block`` channels."""
    import onnx
    from onnx import numpy_helper, shape_inference

    block = block or nchwc_block()
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    if not any(_pads_output(n, inits, block) for n in g.node):
        return model  # no Conv can start a region: skip the shape inference
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - no shapes, no padding
        return model
    shapes: dict[str, list[int]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    users = users_of(g)
    producer = {o: n for n in g.node for o in n.output}
    graph_io = {v.name for v in g.output} | {v.name for v in g.input}

    def channels(name: str) -> int | None:
        s = shapes.get(name)
        return s[1] if s is not None and len(s) == 4 else None

    def const(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]) if name in inits else None

    def group(n) -> int:
        return next((a.i for a in n.attribute if a.name == "group"), 1)

    def is_depthwise(n, c: int) -> bool:
        w = const(n.input[1]) if len(n.input) > 1 else None
        return w is not None and group(n) == c and w.shape[0] == c and w.shape[1] == 1

    def is_boundary(n) -> bool:
        """A dense Conv with constant weights and bias: it reads or writes the padding."""
        return (
            group(n) == 1
            and len(n.input) > 1
            and n.input[1] in inits
            and (len(n.input) < 3 or not n.input[2] or n.input[2] in inits)
        )

    def per_channel(name: str, c: int) -> bool:
        """A constant that broadcasts per channel against an NCHW tensor of ``c`` channels."""
        v = const(name)
        if v is None:
            return False
        s = (1,) * (4 - v.ndim) + v.shape if v.ndim <= 4 else None
        return s is not None and s[0] == 1 and s[2] == 1 and s[3] == 1 and s[1] in (1, c)

    # grow regions from every candidate tensor; a region is a set of tensor names
    seen: set[str] = set()
    regions = []
    for start in list(shapes):
        c = channels(start)
        if start in seen or c is None or c % block == 0:
            continue
        padded = -(-c // block) * block
        if padded > 2 * c:
            continue
        region, ok, stack = set(), True, [start]
        while stack:
            t = stack.pop()
            if t in region:
                continue
            if t in graph_io or t in inits or channels(t) != c:
                ok = False
                break
            region.add(t)
            p = producer.get(t)
            if p is None:
                ok = False
                break
            nodes = [(p, "out")] + [(u, "in") for u in users.get(t, [])]
            for n, side in nodes:
                op = n.op_type
                if op == "Conv" and not is_depthwise(n, c):
                    ok &= is_boundary(n) and (side == "out" or n.input[0] == t)
                    continue
                if op == "Conv" or op in ELEMENTWISE_UNARY or op in _POOLS or op == "BatchNormalization":
                    if op == "BatchNormalization" and not all(x in inits for x in n.input[1:]):
                        ok = False
                    if op == "Conv" and len(n.input) > 2 and n.input[2] not in inits:
                        ok = False
                    stack += [n.input[0], *n.output[:1]]
                    continue
                if op in _BINARY_PAD:
                    for x in n.input:
                        if x in inits:
                            ok &= per_channel(x, c)
                        else:
                            stack.append(x)
                    stack.append(n.output[0])
                    continue
                ok = False
            if not ok:
                break
        seen |= region
        if ok and region:
            regions.append((region, c, padded))
    if not regions:
        return model

    new_inits = []

    def replace(n, k: int, arr: np.ndarray) -> None:
        name = f"{n.input[k]}_p{len(new_inits)}"
        new_inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        inits[name] = new_inits[-1]
        n.input[k] = name

    def pad_axis(a: np.ndarray, axis: int, to: int, value: float = 0.0) -> np.ndarray:
        widths = [(0, 0)] * a.ndim
        widths[axis] = (0, to - a.shape[axis])
        return np.pad(a, widths, constant_values=value)

    padded_of = {t: (c, p) for region, c, p in regions for t in region}
    done = set()
    for region, c, p in regions:
        for t in sorted(region):  # (names of the padded constants: the same in every process)
            for n in [producer[t], *users.get(t, [])]:
                if id(n) in done:
                    continue
                op = n.op_type
                if op == "Conv" and not is_depthwise(n, c):
                    continue  # boundaries: below, once per Conv
                done.add(id(n))
                if op == "Conv":  # depthwise
                    replace(n, 1, pad_axis(const(n.input[1]), 0, p))
                    if len(n.input) > 2:
                        replace(n, 2, pad_axis(const(n.input[2]), 0, p))
                    for a in n.attribute:
                        if a.name == "group":
                            a.i = p
                elif op == "BatchNormalization":
                    for k, v in zip(range(1, 5), (0.0, 0.0, 0.0, 1.0)):
                        replace(n, k, pad_axis(const(n.input[k]), 0, p, v))
                elif op in _BINARY_PAD:
                    for k, x in enumerate(n.input):
                        v = const(x)
                        if v is not None and v.ndim >= 3 and v.shape[-3] == c:
                            replace(n, k, pad_axis(v, v.ndim - 3, p, _BINARY_PAD[op]))
    for n in g.node:
        if n.op_type != "Conv" or not is_boundary(n):
            continue
        out, inp = n.output[0], n.input[0]
        if out in padded_of:
            _, p = padded_of[out]
            replace(n, 1, pad_axis(const(n.input[1]), 0, p))
            if len(n.input) > 2 and n.input[2]:
                replace(n, 2, pad_axis(const(n.input[2]), 0, p))
        if inp in padded_of:
            _, p = padded_of[inp]
            replace(n, 1, pad_axis(const(n.input[1]), 1, p))
    finish_rewrite(g, new_inits)  # (the padded tensors' shapes changed)
    return model
