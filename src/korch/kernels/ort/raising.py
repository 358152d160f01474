"""Fission's patterns raised back to ONNX operators for onnxruntime (Note [Raising]).

Used by ``korch.kernels.ort.export``; each ``_raise_*`` maps a node to (its source tensor or
tensors, ONNX op, attributes).
"""

from __future__ import annotations

import math

import numpy as np

from korch.ir.graph import Graph, strip_ones
from korch.ir.ops import GroupOp, Op

# Note [Raising]
# ~~~~~~~~~~~~~~
# A kernel run by onnxruntime (a linear kernel with its epilogue, a library region,
# Note [Library regions]) is exported primitive by primitive, but onnxruntime's CPU
# speed comes from fusing and blocking whole operators: MaxPool, Resize and Conv with
# a HardSigmoid/HardSwish activation run in its NCHWc layout; their fissioned forms
# (an im2col Gather and a ReduceMax; Gathers; Add/Max/Min/Mul) leave the layout and
# cost a reorder on each side. So the export recognises fission's own patterns and
# emits the operator: each raise maps one node to (its source tensors, ONNX op,
# attributes); the pattern's inner nodes must have no other user, and become dead.
# Softmax and LayerNormalization are raised for the same reason: each is one
# onnxruntime kernel instead of five or eleven passes over the tensor (vit_tiny_b1's
# primitive export ran 644 operators after onnxruntime's own fusions, the model 344;
# with these raises and [N] biases for MatMul + Add, which onnxruntime fuses into
# Gemm, both run 344). Linear Resize too: segformer_b1's decode head as 12 Gathers
# made its one-session export 516 ms against 390 ms for the model; raised, 384 vs 398.


def raise_max_pools(graph: Graph) -> dict[int, tuple[int, str, dict]]:
    """MaxPool for each RESHAPE ending fission's PAD(-inf) + WINDOW + REDUCE_MAX.

    onnxruntime runs MaxPool in its blocked layout; the primitives would be an im2col
    Gather and a ReduceMax (yolo_b1's SPPF: 5 ms as primitives, 0.14 ms as MaxPool).
    Only when the intermediate tensors have no other user and the geometry gives the
    RESHAPE's shape exactly.
    """
    users = graph.users()
    outs = set(graph.outputs.values())
    private = lambda nid, user: users[nid] == [user] and nid not in outs
    found: dict[int, dict] = {}
    for rid, r in enumerate(graph.nodes):
        if r.op is not Op.RESHAPE or np.dtype(r.dtype).kind != "f":
            continue
        mid = r.inputs[0]
        m = graph.nodes[mid]
        if m.op is not Op.REDUCE_MAX or not private(mid, rid):
            continue
        wid = m.inputs[0]
        w = graph.nodes[wid]
        if w.op is not Op.WINDOW or not private(wid, mid):
            continue
        kernel, strides, dil = (list(w.attr(a)) for a in ("kernel", "strides", "dilations"))
        nsp = len(kernel)
        src = w.inputs[0]
        if sorted(m.attr("axes")) != list(range(len(w.shape) - nsp, len(w.shape))):
            continue
        if tuple(r.shape) != tuple(w.shape[: len(w.shape) - nsp]) or len(r.shape) != nsp + 2:
            continue
        begin, end = [0] * nsp, [0] * nsp
        p = graph.nodes[src]
        if (
            p.op is Op.PAD
            and private(src, wid)
            and p.attr("mode", "constant") == "constant"
            and p.attr("value") == -math.inf
            and all(tuple(q) == (0, 0) for q in p.attr("pads")[:2])
        ):
            begin = [int(q[0]) for q in p.attr("pads")[2:]]
            end = [int(q[1]) for q in p.attr("pads")[2:]]
            src = p.inputs[0]
        in_sp = graph.nodes[src].shape[2:]
        if len(in_sp) != nsp:
            continue
        sizes = [
            (n + b + e - d * (k - 1) - 1) // st + 1
            for n, b, e, d, k, st in zip(in_sp, begin, end, dil, kernel, strides)
        ]
        if sizes != list(r.shape[2:]):
            continue
        found[rid] = (
            src,
            "MaxPool",
            {"kernel_shape": kernel, "strides": strides, "dilations": dil, "pads": begin + end},
        )
    return found


def _scalar(graph: Graph, nid: int) -> float | None:
    node = graph.nodes[nid]
    return float(node.attr("value")) if node.is_scalar_const else None


def raise_hard_activations(graph: Graph) -> dict[int, tuple[int, str, dict]]:
    """HardSigmoid for fission's MIN(MAX(ADD(MUL(x, a), b), 0), 1); HardSwish for
    MUL(x, HardSigmoid(x) with a = 1/6, b = 1/2) (activations.py)."""
    users = graph.users()
    outs = set(graph.outputs.values())
    private = lambda nid: len(users[nid]) == 1 and nid not in outs
    nodes = graph.nodes

    def split(nid: int, op: Op) -> tuple[int, float] | None:
        """(tensor operand, scalar operand) of a binary ``op`` node with one scalar."""
        node = nodes[nid]
        if node.op is not op or len(node.inputs) != 2:
            return None
        a, b = node.inputs
        if _scalar(graph, b) is not None and _scalar(graph, a) is None:
            return a, _scalar(graph, b)
        if _scalar(graph, a) is not None and _scalar(graph, b) is None:
            return b, _scalar(graph, a)
        return None

    found: dict[int, tuple[int, str, dict]] = {}
    for nid, node in enumerate(nodes):
        if node.op is not Op.MIN or np.dtype(node.dtype).kind != "f":
            continue
        top = split(nid, Op.MIN)
        if top is None or top[1] != 1.0 or not private(top[0]):
            continue
        mx = split(top[0], Op.MAX)
        if mx is None or mx[1] != 0.0 or not private(mx[0]):
            continue
        add = split(mx[0], Op.ADD)
        if add is None:
            continue
        x, alpha = add[0], 1.0
        mul = split(x, Op.MUL)
        if mul is not None and private(x):
            x, alpha = mul
        if nodes[x].shape != node.shape:
            continue
        found[nid] = (x, "HardSigmoid", {"alpha": alpha, "beta": add[1]})
    for nid, node in enumerate(nodes):
        if node.op is not Op.MUL or len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
            continue
        for x, h in (node.inputs, node.inputs[::-1]):
            hs = found.get(h)
            if (
                hs is not None
                and hs[0] == x
                and private(h)
                and abs(hs[2]["alpha"] - 1.0 / 6.0) < 1e-7
                and hs[2]["beta"] == 0.5
            ):
                found[nid] = (x, "HardSwish", {})
                del found[h]
                break
    return found


def effective(graph: Graph, eff: dict[int, tuple[int, ...]]):
    """(inputs of a node, users of a node) on the graph with ``eff``'s bypasses."""
    ins = lambda nid: eff.get(nid, graph.nodes[nid].inputs)  # noqa: E731
    users: list[list[int]] = [[] for _ in graph.nodes]
    for nid in range(len(graph.nodes)):
        for src in ins(nid):
            users[src].append(nid)
    # a node every user bypasses (a BROADCAST) is dead: it uses nothing
    outs = set(graph.outputs.values())
    for nid in range(len(graph.nodes) - 1, -1, -1):
        if not users[nid] and nid not in outs:
            for src in ins(nid):
                users[src].remove(nid)
    return ins, users


def raise_softmax(graph: Graph, eff: dict[int, tuple[int, ...]]) -> dict[int, tuple[tuple[int, ...], str, dict]]:
    """Softmax for fission's DIV(e, REDUCE_SUM(e)) with e = EXP(SUB(x, REDUCE_MAX(x))),
    over the last axis (normalization.py). onnxruntime runs Softmax as one kernel; the
    five primitives are five passes with two broadcasts (vit_tiny_b1 exported as
    primitives: 644 operators after onnxruntime's fusions, 344 for the model)."""
    ins, users = effective(graph, eff)
    outs = set(graph.outputs.values())
    nodes = graph.nodes
    only = lambda nid, allowed: nid not in outs and set(users[nid]) <= allowed  # noqa: E731
    found: dict[int, tuple[tuple[int, ...], str, dict]] = {}
    for d, node in enumerate(nodes):
        if node.op is not Op.DIV or np.dtype(node.dtype).kind != "f" or not node.shape:
            continue
        e, s = ins(d)
        last = len(node.shape) - 1
        if nodes[s].op is not Op.REDUCE_SUM or tuple(nodes[s].attr("axes")) != (last,) or ins(s) != (e,):
            continue
        if nodes[e].op is not Op.EXP or not only(e, {d, s}) or not only(s, {d}):
            continue
        (u,) = ins(e)
        if nodes[u].op is not Op.SUB or not only(u, {e}):
            continue
        x, m = ins(u)
        if nodes[m].op is not Op.REDUCE_MAX or tuple(nodes[m].attr("axes")) != (last,) or ins(m) != (x,):
            continue
        if not only(m, {u}) or nodes[x].shape != node.shape:
            continue
        found[d] = ((x,), "Softmax", {"axis": last})
    return found


def raise_layer_norms(
    graph: Graph, eff: dict[int, tuple[int, ...]], layer_norm: bool = True
) -> dict[int, tuple[tuple[int, ...], str, dict]]:
    """LayerNormalization (opset 17; only if ``layer_norm``) for fission's form
    (normalization.py): mean = REDUCE_SUM(x)/n, c = x - mean,
    inv = 1/SQRT(REDUCE_SUM(c*c)/n + eps), y = c * inv * Scale (+ B), over trailing
    axes, with Scale and B of the normalized shape. onnxruntime runs it as one kernel
    (eleven primitives otherwise). The same chain over every spatial axis of an NC...
    tensor with a per-channel Scale and B (each a [C] reshaped to [1, C, 1, ...]) is
    InstanceNormalization: candy_b1 exported as primitives ran 45.9 ms in onnxruntime
    against 42.6 ms for the model, its 15 instance norms spelled out in 6 operators each."""
    ins, users = effective(graph, eff)
    outs = set(graph.outputs.values())
    nodes = graph.nodes
    only = lambda nid, allowed: nid not in outs and set(users[nid]) <= allowed  # noqa: E731

    def mean_of(nid: int) -> tuple[int, tuple[int, ...]] | None:
        """(x, axes) when ``nid`` is DIV(REDUCE_SUM(x, axes), count) with the right count."""
        if nodes[nid].op is not Op.DIV:
            return None
        s, n = ins(nid)
        if nodes[s].op is not Op.REDUCE_SUM or not only(s, {nid}):
            return None
        (x,) = ins(s)
        axes = tuple(nodes[s].attr("axes"))
        count = math.prod(nodes[x].shape[a] for a in axes)
        return (x, axes) if _scalar(graph, n) == float(count) else None

    def operands(nid: int, op: Op) -> tuple[int, int] | None:
        return tuple(ins(nid)) if nodes[nid].op is op and len(ins(nid)) == 2 else None  # type: ignore[return-value]

    found: dict[int, tuple[tuple[int, ...], str, dict]] = {}
    for top, node in enumerate(nodes):
        if np.dtype(node.dtype).kind != "f" or node.dtype not in ("float32", "float64", "float16"):
            continue
        bias, scaled = None, top
        add = operands(top, Op.ADD)
        if add is not None:
            scaled, bias = add
        mul = operands(scaled, Op.MUL)
        if mul is None or (bias is not None and not only(scaled, {top})):
            continue
        y, scale = mul
        yo = operands(y, Op.MUL)
        if yo is None or not only(y, {scaled}):
            continue
        c, inv = yo
        r = nodes[inv]
        if r.op is not Op.RECIPROCAL or not only(inv, {y}):
            continue
        (sq,) = ins(inv)
        if nodes[sq].op is not Op.SQRT or not only(sq, {inv}):
            continue
        (ve,) = ins(sq)
        veo = operands(ve, Op.ADD)
        if veo is None or not only(ve, {sq}) or _scalar(graph, veo[1]) is None:
            continue
        var, eps = veo[0], _scalar(graph, veo[1])
        vm = mean_of(var)
        if vm is None or not only(var, {ve}):
            continue
        sqr, axes = vm
        if operands(sqr, Op.MUL) != (c, c) or not only(sqr, {ins(var)[0]}):
            continue
        co = operands(c, Op.SUB)
        if co is None or not only(c, {sqr, y}):
            continue
        x, mean = co
        mm = mean_of(mean)
        rank = len(node.shape)
        if mm != (x, axes) or not only(mean, {c}) or nodes[x].shape != node.shape:
            continue
        first = axes[0] if axes else rank
        if axes != tuple(range(first, rank)) or first == 0:
            continue
        if first == 2 and rank >= 3 and bias is not None:
            channels = node.shape[1]

            def per_channel(v: int, channels: int = channels, rank: int = rank) -> int | None:
                """``v`` when shaped [1, C, 1, ...] (the exporter flattens it to [C]), or
                its [C] source when ``v`` is a RESHAPE of one."""
                if nodes[v].shape != (1, channels) + (1,) * (rank - 2):
                    return None
                if nodes[v].op is Op.RESHAPE and nodes[nodes[v].inputs[0]].shape == (channels,):
                    return nodes[v].inputs[0]
                return v

            s_c, b_c = per_channel(scale), per_channel(bias)
            if s_c is not None and b_c is not None:
                found.pop(scaled, None)
                found[top] = ((x, s_c, b_c), "InstanceNormalization", {"epsilon": eps})
                continue
        if not layer_norm:
            continue
        norm = tuple(node.shape[first:])

        def of_norm_shape(v: int, norm: tuple[int, ...] = norm) -> int | None:
            """``v``, or the source of ``v``'s RESHAPE to [1, .., *norm], shaped ``norm``."""
            if nodes[v].shape == norm:
                return v
            if nodes[v].op is Op.RESHAPE and nodes[nodes[v].inputs[0]].shape == norm:
                return nodes[v].inputs[0]
            return None

        scale = of_norm_shape(scale)
        if bias is not None:
            bias = of_norm_shape(bias)
            if bias is None:
                continue
        if scale is None:
            continue
        srcs = (x, scale) if bias is None else (x, scale, bias)
        found.pop(scaled, None)  # matched alone first (ids are topological): B makes it inner
        found[top] = (srcs, "LayerNormalization", {"axis": first, "epsilon": eps})
    return found


def raise_global_average_pools(
    graph: Graph, eff: dict[int, tuple[int, ...]]
) -> dict[int, tuple[tuple[int, ...], str, dict]]:
    """GlobalAveragePool for fission's DIV(REDUCE_SUM(x, all spatial axes), count) on an
    NC... tensor: onnxruntime runs it in its blocked layout after a Conv, where a
    ReduceSum first reorders the Conv's output back to NCHW."""
    ins, users = effective(graph, eff)
    outs = set(graph.outputs.values())
    nodes = graph.nodes
    found: dict[int, tuple[tuple[int, ...], str, dict]] = {}
    for d, node in enumerate(nodes):
        if node.op is not Op.DIV or np.dtype(node.dtype).kind != "f" or len(node.shape) < 3:
            continue
        s, n = ins(d)
        if nodes[s].op is not Op.REDUCE_SUM or s in outs or users[s] != [d]:
            continue
        (x,) = ins(s)
        rank = len(nodes[x].shape)
        if tuple(nodes[s].attr("axes")) != tuple(range(2, rank)) or node.shape != nodes[x].shape[:2] + (1,) * (
            rank - 2
        ):
            continue
        if _scalar(graph, n) != float(math.prod(nodes[x].shape[2:])):
            continue
        found[d] = ((x,), "GlobalAveragePool", {})
    return found


def raise_depth_space(graph: Graph, eff: dict[int, tuple[int, ...]]) -> dict[int, tuple[tuple[int, ...], str, dict]]:
    """SpaceToDepth and DepthToSpace (DCR) for their reshape, 6-D transpose, reshape
    (Note [Space-to-depth convolutions]): onnxruntime's generic Transpose took 4.6 ms on
    Candy's [1, 32, 232, 232] input that its SpaceToDepth moves in about one."""
    ins, users = effective(graph, eff)
    outs = set(graph.outputs.values())
    nodes = graph.nodes
    found: dict[int, tuple[tuple[int, ...], str, dict]] = {}
    for r2, node in enumerate(nodes):
        if node.op is not Op.RESHAPE or len(node.shape) != 4:
            continue
        (t,) = ins(r2)
        if nodes[t].op is not Op.TRANSPOSE or t in outs or users[t] != [r2]:
            continue
        (r1,) = ins(t)
        if nodes[r1].op is not Op.RESHAPE or r1 in outs or users[r1] != [t]:
            continue
        (x,) = ins(r1)
        xs, mid, perm = nodes[x].shape, nodes[r1].shape, tuple(nodes[t].attr("perm"))
        if len(xs) != 4 or len(mid) != 6:
            continue
        n, c, h, w = xs
        if perm == (0, 3, 5, 1, 2, 4) and mid == (n, c, h // mid[3], mid[3], w // mid[3], mid[3]):
            bs = mid[3]
            if node.shape == (n, c * bs * bs, h // bs, w // bs):
                found[r2] = ((x,), "SpaceToDepth", {"blocksize": bs})
        elif perm == (0, 3, 4, 1, 5, 2) and mid == (n, mid[1], mid[1], c // mid[1] ** 2, h, w):
            bs = mid[1]
            if node.shape == (n, c // (bs * bs), h * bs, w * bs):
                found[r2] = ((x,), "DepthToSpace", {"blocksize": bs, "mode": "DCR"})
    return found


def model_opset_at_least(graph: Graph, opset: int, want: int) -> bool:
    """Whether the exported model's default opset is >= ``want`` whichever opaque nodes
    stay live (the model takes their highest opset, ``opset`` when there are none)."""
    theirs = [
        int(ver)
        for node in graph.nodes
        if node.op is Op.OPAQUE
        for dom, ver in node.attr("opset")
        if dom in ("", "ai.onnx")
    ]
    return min(theirs) >= want if theirs else opset >= want


def bypass_broadcasts(graph: Graph) -> dict[int, tuple[int, ...]]:
    """Inputs of binary elementwise nodes with explicit BROADCASTs replaced by their source.

    ONNX broadcasting does the expansion for free, and onnxruntime only fuses a bias
    into Conv/Gemm when it sees the unexpanded (C,1,1) or (N,) constant.
    """
    out: dict[int, tuple[int, ...]] = {}
    for nid, node in enumerate(graph.nodes):
        if node.op not in GroupOp.BINARY and node.op is not Op.WHERE:
            continue
        ins = list(node.inputs)
        changed = False
        for i in range(len(ins)):
            while True:
                snode = graph.nodes[ins[i]]
                # a BROADCAST, or a RESHAPE that only prepends ones (a bias [N] as [1, 1, N]:
                # onnxruntime fuses MatMul + Add into Gemm only for the [N] form)
                if snode.op is Op.BROADCAST or (
                    snode.op is Op.RESHAPE and strip_ones(snode.shape) == graph.nodes[snode.inputs[0]].shape
                ):
                    trial = ins[:i] + [snode.inputs[0]] + ins[i + 1 :]
                    if tuple(np.broadcast_shapes(*[graph.nodes[t].shape for t in trial])) == node.shape:
                        ins = trial
                        changed = True
                        continue
                break
        if changed:
            out[nid] = tuple(ins)
    return out


def const_input_ids(graph: Graph, const_inputs: dict) -> frozenset[int]:
    """The node ids of the graph inputs that have a value in ``const_inputs`` (a kernel's)."""
    return frozenset(nid for name, nid in graph.inputs.items() if name in const_inputs)


def is_constant(graph: Graph, nid: int, ins, const_ids: frozenset[int]) -> bool:
    """Whether node ``nid`` is a constant for onnxruntime: a constant, an input in
    ``const_ids`` (``const_input_ids``), or a layout op of constants (it folds those);
    ``ins`` gives a node's inputs (bypasses applied)."""
    node = graph.nodes[nid]
    if node.op is Op.CONST:
        return True
    if node.op is Op.INPUT:
        return nid in const_ids
    if node.op in GroupOp.LAYOUT or node.op is Op.BROADCAST:
        return all(is_constant(graph, i, ins, const_ids) for i in ins(nid))
    return False


def const_value(graph: Graph, nid: int, const_inputs: dict, input_name: dict, ins=None) -> np.ndarray | None:
    """The value of a constant, or of an input with a value in ``const_inputs``; through
    RESHAPEs when ``ins`` is given. ``input_name``: node id -> graph input name."""
    node = graph.nodes[nid]
    if node.op is Op.CONST:
        return graph.const_value(nid)
    if ins is not None and node.op is Op.RESHAPE:
        v = const_value(graph, ins(nid)[0], const_inputs, input_name, ins)
        return None if v is None else v.reshape(node.shape)
    name = input_name.get(nid)
    return np.asarray(const_inputs[name]) if name in const_inputs else None
