"""Export a primitive graph as an ONNX model that computes what ``korch.ir.evaluate`` computes.

Used by the onnxruntime backend (the fallback that runs any kernel) and for debugging.

Which dtype each operator is computed in: Note [ONNX dtypes] in ``korch.kernels.ort.dtypes``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from korch.diagnostics import guarded, run_passes
from korch.ir.graph import Graph, Node
from korch.ir.ops import GroupOp, Op
from korch.kernels.ort.dtypes import compute_dtype
from korch.kernels.ort.export_opaque import emit_opaque
from korch.kernels.ort.layout import pad_channels
from korch.kernels.ort.order import emit_order, reassociate_conv_biases
from korch.kernels.ort.raising import (
    bypass_broadcasts,
    const_input_ids,
    is_constant,
    model_opset_at_least,
    raise_depth_space,
    raise_global_average_pools,
    raise_hard_activations,
    raise_layer_norms,
    raise_max_pools,
    raise_softmax,
)
from korch.kernels.ort.raising_attention import raise_attention
from korch.kernels.ort.raising_resize import raise_linear_resizes, raise_nearest_upsamples, upsample_factor
from korch.kernels.ort.rows import flatten_rows
from korch.kernels.ort.subpixel import subpixel_convs

INT64_MIN = int(np.iinfo(np.int64).min)

_UNARY = {
    Op.NEG: "Neg",
    Op.EXP: "Exp",
    Op.LOG: "Log",
    Op.SQRT: "Sqrt",
    Op.RECIPROCAL: "Reciprocal",
    Op.TANH: "Tanh",
    Op.ERF: "Erf",
    Op.SIGMOID: "Sigmoid",
    Op.ABS: "Abs",
    Op.FLOOR: "Floor",
    Op.CEIL: "Ceil",
    Op.NOT: "Not",
}
_BINARY = {
    Op.ADD: "Add",
    Op.SUB: "Sub",
    Op.MUL: "Mul",
    Op.DIV: "Div",
    Op.POW: "Pow",
    Op.MAX: "Max",
    Op.MIN: "Min",
    Op.EQUAL: "Equal",
    Op.LESS: "Less",
    Op.GREATER: "Greater",
    Op.AND: "And",
    Op.OR: "Or",
}
_REDUCE = {Op.REDUCE_SUM: "ReduceSum", Op.REDUCE_MAX: "ReduceMax", Op.REDUCE_MIN: "ReduceMin"}
# the opset from which each reduction takes ``axes`` as an input instead of an attribute
_REDUCE_AXES_INPUT = {"ReduceSum": 13, "ReduceMax": 18, "ReduceMin": 18}
_FLOAT_ONLY = {"Exp", "Log", "Sqrt", "Reciprocal", "Tanh", "Erf", "Sigmoid", "Floor", "Ceil"}
# above this many gathered elements WINDOW is lowered to one Slice per kernel offset
_WINDOW_GATHER_LIMIT = 1 << 20


def _contig(arr: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray: it turns rank-0 arrays into shape (1,)
    return np.require(arr, requirements="C")


def _tt(dtype: str) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class Exporter:
    def __init__(self, graph: Graph, const_inputs: dict[str, np.ndarray], opset: int):
        from onnx import helper, numpy_helper

        self.helper = helper
        self.numpy_helper = numpy_helper
        self.g = graph
        self.const_inputs = const_inputs
        self.const_ids = const_input_ids(graph, const_inputs)
        self.opset = opset
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.used: set[str] = set()
        self.names: dict[int, str] = {}
        self.named: set[str] = set()
        self._init_cache: dict[tuple, str] = {}
        self._counter = 0
        self.eff: dict[int, tuple[int, ...]] = {}
        # node -> (ONNX op, attributes) emitted instead of its primitive (Note [Raising])
        self.raised: dict[int, tuple[str, dict]] = {}

    # --- helpers -----------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name = base
        while name in self.used:
            self._counter += 1
            name = f"{base}_{self._counter}"
        self.used.add(name)
        return name

    def init(self, arr: np.ndarray, base: str = "k") -> str:
        """An initializer holding ``arr``; small ones are shared by value."""
        arr = np.asarray(arr)
        key = None
        if arr.size <= 64:
            key = (str(arr.dtype), arr.shape, arr.tobytes())
            if key in self._init_cache:
                return self._init_cache[key]
        name = self.fresh(base)
        self.inits.append(self.numpy_helper.from_array(_contig(arr), name))
        if key is not None:
            self._init_cache[key] = name
        return name

    def ints(self, values: Sequence[int], base: str = "i") -> str:
        return self.init(np.array(list(values), dtype=np.int64), base)

    def op(self, op_type: str, inputs: Sequence[str], out: str | None = None, domain: str = "", **attrs) -> str:
        out = out if out is not None else self.fresh(op_type.lower())
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], domain=domain or None, **attrs))
        return out

    def cast(self, name: str, src: str, dst: str, out: str | None = None) -> str:
        if src == dst:
            return name if out is None else self.op("Identity", [name], out)
        return self.op("Cast", [name], out, to=_tt(dst))

    def finish(self, name: str, src: str, dst: str, out: str) -> str:
        """Bring ``name`` (dtype ``src``) to dtype ``dst`` under the tensor name ``out``."""
        if name == out:
            assert src == dst
            return out
        if src == dst:
            # rename the last node's output instead of adding an Identity
            last = self.nodes[-1] if self.nodes else None
            if last is not None and list(last.output) == [name] and name not in self.named:
                last.output[0] = out
                self.used.discard(name)
                return out
        return self.cast(name, src, dst, out)

    def set_name(self, nid: int, name: str) -> None:
        self.names[nid] = name
        self.named.add(name)

    def tensor(self, nid: int) -> str:
        """The tensor name of node ``nid``; rank-0 constants get an initializer on first use."""
        name = self.names.get(nid)
        if name is None:
            node = self.g.nodes[nid]
            assert node.is_scalar_const, f"%{nid} used before it is emitted"
            name = self.init(self.g.const_value(nid), "s")
            self.set_name(nid, name)
        return name

    def is_const(self, nid: int) -> bool:
        return is_constant(self.g, nid, lambda n: self.eff.get(n, self.g.nodes[n].inputs), self.const_ids)

    def node_dtype(self, nid: int) -> str:
        return self.g.nodes[nid].dtype

    def operand(self, nid: int, dtype: str) -> str:
        """Node ``nid`` as a tensor of ``dtype`` (scalar constants converted at export time)."""
        node = self.g.nodes[nid]
        if node.is_scalar_const:
            return self.init(np.array(node.attr("value"), dtype=node.dtype).astype(dtype), "s")
        return self.cast(self.tensor(nid), node.dtype, dtype)

    def unify(self, nids: Sequence[int]) -> str:
        """The dtype numpy computes an elementwise op in (see Note [ONNX dtypes])."""
        nodes = [self.g.nodes[i] for i in nids]
        tensors = [n.dtype for n in nodes if not n.is_scalar_const]
        if not tensors:
            return str(np.result_type(*[np.dtype(n.dtype) for n in nodes]))
        d = np.result_type(*[np.dtype(t) for t in tensors])
        for n in nodes:
            if not n.is_scalar_const or n.dtype == d:
                continue
            v = np.array(n.attr("value"), dtype=n.dtype)
            same_kind = v.dtype.kind == d.kind == "f"
            with np.errstate(all="ignore"):
                exact = bool(v.astype(d).astype(v.dtype) == v)
            if not (same_kind or exact):
                d = np.result_type(d, v.dtype)
        return str(d)

    # --- lowering ----------------------------------------------------------------
    def lower(self, nid: int, node: Node, out: str) -> None:
        op = node.op
        ins = self.eff.get(nid, node.inputs)
        raised = self.raised.get(nid)
        if raised is not None:
            xs = [self.tensor(i) for i in ins]
            if raised[0] == "Resize":
                attrs = {k: v for k, v in raised[1].items() if k != "sizes"}
                sizes = self.init(np.asarray(raised[1]["sizes"], np.int64), "sizes")
                self.op("Resize", [xs[0], "", "", sizes], out, **attrs)
            elif raised[0] == "InstanceNormalization":
                # scale and B are [C]; the raised pattern may hold them as [1, C, 1, ...]
                flat = [
                    x
                    if len(self.g.nodes[i].shape) == 1
                    else self.op("Reshape", [x, self.init(np.asarray([-1], np.int64), "flat")])
                    for i, x in zip(ins[1:], xs[1:])
                ]
                self.op("InstanceNormalization", [xs[0], *flat], out, **raised[1])
            elif raised[0] == "Attention":  # Note [Raising attention]
                attrs = {k: v for k, v in raised[1].items() if k not in ("weights", "bias")}
                w, b = self.init(raised[1]["weights"], "qkv_w"), self.init(raised[1]["bias"], "qkv_b")
                mask = [""] * 2 + xs[1:]  # mask_index and past absent; the additive mask is attention_bias
                self.op("Attention", [xs[0], w, b, *mask], out, domain="com.microsoft", **attrs)
            elif raised[0] == "HardSwish" and self.opset < 14:
                self.op("Mul", [xs[0], self.op("HardSigmoid", xs, alpha=1.0 / 6.0, beta=0.5)], out)
            else:
                self.op(raised[0], xs, out, **raised[1])
        elif op is Op.CAST:
            self.cast(self.tensor(ins[0]), self.node_dtype(ins[0]), node.dtype, out)
        elif op in _UNARY or op in _BINARY:
            op_type = _UNARY.get(op) or _BINARY[op]
            d = self.unify(ins)
            if op_type in ("Not", "And", "Or"):
                d = "bool"
            elif (op_type in _FLOAT_ONLY or op is Op.DIV) and np.dtype(d).kind != "f":
                # numpy computes exp(int) in float64, and the interpreter's integer DIV is
                # trunc(a / b) in float64 (also no SIGFPE on a zero divisor, as int Div would raise)
                d = "float64"
            if op_type in ("Floor", "Ceil") and np.dtype(d).kind != "f":
                self.finish(self.operand(ins[0], d), d, node.dtype, out)
                return
            cd = compute_dtype(d, op_type)
            zero = [i for i in ins if self.g.nodes[i].is_scalar_const and self.g.nodes[i].attr("value") == 0]
            if op is Op.MAX and zero and cd in ("float32", "float64") and len(ins) == 2:
                # max(x, 0) as Relu, which onnxruntime fuses into Conv / Gemm
                x = ins[0] if ins[1] == zero[0] else ins[1]
                self.finish(self.op("Relu", [self.operand(x, cd)]), cd, node.dtype, out)
                return
            if op in (Op.ADD, Op.MUL) and len(ins) == 2 and self.is_const(ins[0]) and not self.is_const(ins[1]):
                # onnxruntime fuses a bias or scale into the Conv before it only when the
                # Conv's output is the first operand (Add(B, Conv(x)) stays an Add that also
                # breaks the NCHWc chain: three in segformer_b1's rewritten decode head)
                ins = (ins[1], ins[0])
            y = self.op(op_type, [self.operand(i, cd) for i in ins])
            ydt = "bool" if op in GroupOp.COMPARE or op_type in ("Not", "And", "Or") else cd
            self.finish(y, ydt, node.dtype, out)
        elif op is Op.WHERE:
            c, a, b = ins
            d = self.unify([a, b])
            cd = compute_dtype(d, "Where")
            y = self.op("Where", [self.operand(c, "bool"), self.operand(a, cd), self.operand(b, cd)])
            self.finish(y, cd, node.dtype, out)
        elif op in _REDUCE:
            op_type = _REDUCE[op]
            axes = list(node.attr("axes"))
            if not axes:
                self.op("Identity", [self.tensor(ins[0])], out)
                return
            cd = compute_dtype(node.dtype, op_type)
            x = self.operand(ins[0], cd)
            if self.opset >= _REDUCE_AXES_INPUT[op_type]:
                y = self.op(op_type, [x, self.ints(axes, "axes")], keepdims=1)
            else:
                y = self.op(op_type, [x], keepdims=1, axes=axes)
            self.finish(y, cd, node.dtype, out)
        elif op is Op.BROADCAST:
            self.op("Expand", [self.tensor(ins[0]), self.ints(node.shape, "shape")], out)
        elif op is Op.RESHAPE:
            attrs = {"allowzero": 1} if 0 in node.shape and self.opset >= 14 else {}
            self.op("Reshape", [self.tensor(ins[0]), self.ints(node.shape, "shape")], out, **attrs)
        elif op is Op.TRANSPOSE:
            self.op("Transpose", [self.tensor(ins[0])], out, perm=list(node.attr("perm")))
        elif op is Op.SLICE:
            self.lower_slice(node, out)
        elif op is Op.CONCAT:
            self.op("Concat", [self.operand(i, node.dtype) for i in ins], out, axis=int(node.attr("axis")))
        elif op is Op.PAD:
            self.lower_pad(node, out)
        elif op is Op.GATHER:
            idx = node.gather_indices()
            axis = int(node.attr("axis"))
            in_shape = self.g.nodes[ins[0]].shape
            factor = upsample_factor(idx, in_shape[axis])
            if factor and self.opset >= 13 and len(in_shape) >= 3:
                # nearest upsampling (fission's Resize, Note in fission/resize.py): as a
                # Resize onnxruntime runs it in its blocked layout, as a Gather on an inner
                # axis it is a slow generic copy (yolo_b1's 2 upsamples: 5 ms vs 0.1 ms)
                scales = np.ones(len(in_shape), dtype=np.float32)
                scales[axis] = factor
                self.op(
                    "Resize",
                    [self.tensor(ins[0]), "", self.init(scales, "scales")],
                    out,
                    mode="nearest",
                    coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor",
                )
            else:
                self.op("Gather", [self.tensor(ins[0]), self.init(idx, "indices")], out, axis=axis)
        elif op is Op.WINDOW:
            self.lower_window(node, out)
        elif op is Op.MATMUL:
            d = self.unify(ins)
            cd = compute_dtype(d, "MatMul")
            y = self.op("MatMul", [self.operand(i, cd) for i in ins])
            self.finish(y, cd, node.dtype, out)
        elif op is Op.CONV:
            d = self.unify(ins)
            cd = compute_dtype(d, "Conv")
            w_shape = self.g.nodes[ins[1]].shape
            y = self.op(
                "Conv",
                [self.operand(i, cd) for i in ins],
                kernel_shape=list(w_shape[2:]),
                strides=list(node.attr("strides")),
                dilations=list(node.attr("dilations")),
                pads=list(node.attr("pads")),
                group=int(node.attr("group")),
            )
            self.finish(y, cd, node.dtype, out)
        else:
            raise NotImplementedError(f"to_onnx: no lowering for {op.value}")

    def lower_slice(self, node: Node, out: str) -> None:
        (src,) = node.inputs
        in_shape = self.g.nodes[src].shape
        starts, ends, axes, steps = [], [], [], []
        for ax, (d, st, sp, ln) in enumerate(
            zip(in_shape, node.attr("starts"), node.attr("steps"), node.attr("lengths"))
        ):
            if ln == 0:
                st, end, sp = 0, 0, 1
            elif ln == 1:
                end, sp = st + 1, 1
            else:
                end = st + ln * sp
                if sp < 0 and end < 0:
                    end = INT64_MIN  # "past the beginning": a negative end would count from the back
            if st == 0 and sp == 1 and end >= d:
                continue  # the whole axis
            starts.append(st)
            ends.append(end)
            axes.append(ax)
            steps.append(sp)
        x = self.tensor(src)
        if not axes:
            self.op("Identity", [x], out)
            return
        self.op(
            "Slice",
            [
                x,
                self.ints(starts, "starts"),
                self.ints(ends, "ends"),
                self.ints(axes, "axes"),
                self.ints(steps, "steps"),
            ],
            out,
        )

    def lower_pad(self, node: Node, out: str) -> None:
        if self.opset < 11:
            raise NotImplementedError("to_onnx: PAD needs opset >= 11")
        pads = [tuple(p) for p in node.attr("pads")]
        flat = [b for b, _ in pads] + [a for _, a in pads]
        mode = node.attr("mode", "constant")
        x = self.tensor(node.inputs[0])
        if mode == "constant":
            value = np.array(node.attr("value", 0.0)).astype(node.dtype)
            self.op("Pad", [x, self.ints(flat, "pads"), self.init(value, "pad_value")], out, mode="constant")
        else:
            self.op("Pad", [x, self.ints(flat, "pads")], out, mode={"reflect": "reflect", "edge": "edge"}[mode])

    def lower_window(self, node: Node, out: str) -> None:
        (src,) = node.inputs
        kernel, strides, dil = node.attr("kernel"), node.attr("strides"), node.attr("dilations")
        nsp = len(kernel)
        in_shape = self.g.nodes[src].shape
        lead = in_shape[: len(in_shape) - nsp]
        spatial = in_shape[len(in_shape) - nsp :]
        out_sp = node.shape[len(lead) : len(lead) + nsp]
        x = self.tensor(src)
        nk = int(np.prod(kernel))
        if int(np.prod(out_sp)) * nk <= _WINDOW_GATHER_LIMIT:
            # im2col: flatten the spatial axes and gather every (position, offset) at once
            grids = np.meshgrid(*[np.arange(o) for o in out_sp], *[np.arange(k) for k in kernel], indexing="ij")
            flat = np.zeros(tuple(out_sp) + tuple(kernel), dtype=np.int64)
            stride_in = 1
            for i in reversed(range(nsp)):
                flat += (grids[i] * strides[i] + grids[nsp + i] * dil[i]) * stride_in
                stride_in *= spatial[i]
            xf = self.op("Reshape", [x, self.ints(list(lead) + [int(np.prod(spatial))], "shape")])
            self.op("Gather", [xf, self.init(flat, "window_idx")], out, axis=len(lead))
            return
        # one strided Slice per kernel offset, stacked on a new last axis
        axes = list(range(len(lead), len(lead) + nsp))
        parts = []
        for kidx in np.ndindex(*kernel):
            starts = [int(kidx[i] * dil[i]) for i in range(nsp)]
            ends = [starts[i] + (out_sp[i] - 1) * strides[i] + 1 for i in range(nsp)]
            sl = self.op(
                "Slice",
                [
                    x,
                    self.ints(starts, "starts"),
                    self.ints(ends, "ends"),
                    self.ints(axes, "axes"),
                    self.ints(strides, "steps"),
                ],
            )
            parts.append(self.unsqueeze(sl, len(in_shape)))
        cat = self.op("Concat", parts, axis=len(in_shape)) if len(parts) > 1 else parts[0]
        self.op("Reshape", [cat, self.ints(node.shape, "shape")], out)

    def unsqueeze(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints([axis], "axes")])
        return self.op("Unsqueeze", [x], axes=[axis])


def _live(graph: Graph, eff: dict[int, tuple[int, ...]]) -> list[bool]:
    live = [False] * len(graph.nodes)
    stack = list(graph.outputs.values())
    while stack:
        nid = stack.pop()
        if live[nid]:
            continue
        live[nid] = True
        stack.extend(eff.get(nid, graph.nodes[nid].inputs))
    return live


def to_onnx(
    graph: Graph, const_inputs: dict[str, np.ndarray] | None = None, opset: int = 20, channel_padding: bool = True
):
    """An ``onnx.ModelProto`` computing ``korch.ir.evaluate(graph, ...)``.

    Graph inputs keep their names, except those in ``const_inputs``, which become
    initializers holding the given values. Outputs are named as in ``graph.outputs``.
    OPAQUE nodes are emitted as their stored NodeProto; their default-domain opset
    (the highest, when they differ) becomes the model's, so they keep their meaning.
    With ``channel_padding`` the result is laid out for onnxruntime's blocked
    convolutions (Note [Channel padding]); the numbers are the same. Sub-pixel
    convolutions (Note [Sub-pixel convolution]) and row islands (Note [Row islands])
    are rewritten for onnxruntime too.
    """
    # each raising and export pass is an optimization: one that raises is skipped
    # (Note [Skipped optimizations] in korch.diagnostics)
    passes = [subpixel_convs, flatten_rows] + ([pad_channels] if channel_padding else [])
    return run_passes("export", lambda: _primitive_model(graph, const_inputs, opset), passes)


def _primitive_model(graph: Graph, const_inputs: dict[str, np.ndarray] | None, opset: int):
    """``to_onnx`` before its model passes."""
    from onnx import helper

    const_inputs = dict(const_inputs or {})

    def g(name: str, fn, *args, **kw) -> dict:  # the pass's result; a fresh {} if it raises
        return guarded("export", name, fn, *args, **kw) or {}

    eff = g("bypass_broadcasts", bypass_broadcasts, graph)
    raised = {
        nid: ((src,), op, attrs) for nid, (src, op, attrs) in g("raise_max_pools", raise_max_pools, graph).items()
    }
    raised.update(
        {
            nid: ((src,), op, attrs)
            for nid, (src, op, attrs) in g("raise_hard_activations", raise_hard_activations, graph).items()
        }
    )
    raised.update(g("raise_softmax", raise_softmax, graph, eff))
    raised.update(g("raise_global_average_pools", raise_global_average_pools, graph, eff))
    raised.update(g("raise_depth_space", raise_depth_space, graph, eff))
    if model_opset_at_least(graph, opset, 13):
        raised.update(g("raise_linear_resizes", raise_linear_resizes, graph, eff, const_inputs))
        raised.update(g("raise_nearest_upsamples", raise_nearest_upsamples, graph, eff))
    raised.update(
        g("raise_layer_norms", raise_layer_norms, graph, eff, layer_norm=model_opset_at_least(graph, opset, 17))
    )
    eff.update({nid: srcs for nid, (srcs, _, _) in raised.items()})
    attention = g("raise_attention", raise_attention, graph, eff, const_inputs, raised)  # over the raised Softmaxes
    raised.update(attention)
    eff.update({nid: srcs for nid, (srcs, _, _) in attention.items()})
    eff.update(g("reassociate_conv_biases", reassociate_conv_biases, graph, eff, const_inputs, raised))
    live = _live(graph, eff)
    # opsets: ours, overridden by the opaque nodes' own
    domains: dict[str, int] = {}
    for nid, node in enumerate(graph.nodes):
        if live[nid] and node.op is Op.OPAQUE:
            for dom, ver in node.attr("opset"):
                dom = "" if dom == "ai.onnx" else dom
                domains[dom] = max(domains.get(dom, 0), int(ver))
    if attention:
        domains["com.microsoft"] = max(domains.get("com.microsoft", 0), 1)
    default_opset = domains.pop("", opset)
    ex = Exporter(graph, const_inputs, default_opset)
    ex.eff = eff
    ex.raised = {nid: (op_type, attrs) for nid, (_, op_type, attrs) in raised.items()}

    # reserve user-visible names first
    for name in graph.inputs:
        ex.used.add(name)
    for name in graph.outputs:
        ex.used.add(name)
    # compute nodes that are graph outputs write the output name directly (first name wins)
    target: dict[int, str] = {}
    for name, nid in graph.outputs.items():
        if graph.nodes[nid].op not in GroupOp.SOURCE and nid not in target:
            target[nid] = name

    for name, nid in graph.inputs.items():
        node = graph.nodes[nid]
        ex.set_name(nid, name)
        if name in const_inputs:
            if not live[nid]:  # e.g. weights a raised Attention took concatenated
                continue
            val = np.asarray(const_inputs[name], dtype=node.dtype).reshape(node.shape)
            ex.inits.append(ex.numpy_helper.from_array(_contig(val), name))
        else:
            ex.inputs.append(helper.make_tensor_value_info(name, _tt(node.dtype), list(node.shape)))

    opaque_groups: dict[tuple, list[str]] = {}
    for nid in emit_order(graph, eff, live):
        node = graph.nodes[nid]
        if node.op is Op.INPUT:
            continue
        if node.op is Op.CONST:
            if not node.is_scalar_const:  # rank-0 ones are emitted where used (Exporter.tensor)
                cname = node.attr("name")
                ex.set_name(nid, ex.init(graph.const_value(nid), cname if cname not in ex.used else f"c_{cname}"))
            continue
        if node.op is Op.OPAQUE:
            emit_opaque(ex, graph, live, target, opaque_groups, nid, node)
            continue
        out = target.get(nid) or ex.fresh(f"t{nid}")
        ex.set_name(nid, out)
        ex.lower(nid, node, out)

    outputs = []
    for name, nid in graph.outputs.items():
        node = graph.nodes[nid]
        if ex.tensor(nid) != name:
            ex.op("Identity", [ex.tensor(nid)], name)
        outputs.append(helper.make_tensor_value_info(name, _tt(node.dtype), list(node.shape)))

    gproto = helper.make_graph(ex.nodes, "korch", ex.inputs, outputs, initializer=ex.inits)
    opsets = [helper.make_opsetid("", default_opset)] + [helper.make_opsetid(d, v) for d, v in sorted(domains.items())]
    model = helper.make_model(gproto, opset_imports=opsets, producer_name="korch")
    try:
        model.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    except Exception:  # noqa: BLE001 - keep make_model's choice
        pass
    model.ir_version = max(model.ir_version, 8)
    return model
