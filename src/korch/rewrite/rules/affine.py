"""Affine scale/shift by broadcast constants: reassociated and folded into linear weights.

BatchNorm after fission is ``(y - mean) / sqrt(var + eps) * gamma + beta`` on a Conv
or MatMul output ``y``. ``sub_const_to_add`` and ``div_const_to_mul`` make it a chain
of MUL/ADD by constants, the chain rules collapse it to ``y * s + t``, and the fold
rules move ``s`` into the weights, leaving one bias ADD.
"""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import Op
from korch.rewrite.pattern import Lookup, Match, P, Rule, X, bcast_const, channel_vector, is_float
from korch.rewrite.rules.common import bconst, channel_shape


def _consts_ok(*names: str):
    def cond(g: Graph, m: Match) -> bool:
        if not is_float(m.graph.nodes[m.roots[0]]) or m.node("x").op is Op.CONST:
            return False
        return all(bcast_const(g, m.nodes[n]) is not None for n in names)

    return cond


def _c(m: Match, name: str) -> np.ndarray:
    val = bcast_const(m.graph, m.nodes[name])
    assert val is not None
    return val


def _root(m: Match):
    return m.graph.nodes[m.roots[0]]


def _sub_to_add(b: GraphBuilder, m: Match, v: Lookup) -> int:
    r = _root(m)
    return b.add(Op.ADD, [v("x"), bconst(b, -_c(m, "c"), r.shape, r.dtype)])


def _div_to_mul(b: GraphBuilder, m: Match, v: Lookup) -> int:
    r = _root(m)
    return b.add(Op.MUL, [v("x"), bconst(b, 1 / _c(m, "c"), r.shape, r.dtype)])


def _chain(op: Op, combine):
    def build(b: GraphBuilder, m: Match, v: Lookup) -> int:
        r = _root(m)
        return b.add(op, [v("x"), bconst(b, combine(_c(m, "c1"), _c(m, "c2")), r.shape, r.dtype)])

    return build


def _distribute(b: GraphBuilder, m: Match, v: Lookup) -> int:
    r = _root(m)
    c1, c2 = _c(m, "c1"), _c(m, "c2")
    scaled = b.add(Op.MUL, [v("x"), bconst(b, c2, r.shape, r.dtype)])
    return b.add(Op.ADD, [scaled, bconst(b, c1 * c2, r.shape, r.dtype)])


def _distribute_ok(g: Graph, m: Match) -> bool:
    """Only where ``x + c1`` has no other reader. Where it has one (HardSwish's
    ``y * hardsigmoid(y)`` on ``y = conv + bias``), the ADD stays, a MUL and an ADD are
    added, and ``x`` forks into two chains: the conv can no longer end in one epilogue
    chain with its bias and activation (Note [Register post-ops] in korch_gemm.h), and
    mobilenetv3_small's plan split every such conv from a generated bias+HardSwish
    kernel."""
    if not _consts_ok("c1", "c2")(g, m):
        return False
    return _sole_reader(g, m.nodes["inner"])


def _sole_reader(g: Graph, nid: int) -> bool:
    """Whether one node reads ``nid`` and it is no graph output."""
    return sum(nid in n.inputs for n in g.nodes) == 1 and nid not in g.outputs.values()


# --- folding a per-channel scale into Conv / MatMul weights --------------------------------


def _fold_ok(axis: int, with_bias: bool):
    def cond(g: Graph, m: Match) -> bool:
        lin = m.node("lin")
        if not is_float(lin) or channel_vector(g, m.nodes["s"], axis, lin.shape) is None:
            return False
        return not with_bias or channel_vector(g, m.nodes["b"], axis, lin.shape) is not None

    return cond


def _fold(axis: int, with_bias: bool):
    def build(b: GraphBuilder, m: Match, v: Lookup) -> int:
        lin = m.node("lin")
        rank = len(lin.shape)
        s = channel_vector(m.graph, m.nodes["s"], axis, lin.shape)
        assert s is not None
        w = m.value("w")
        if lin.op is Op.CONV:
            w = w * s.reshape((-1,) + (1,) * (w.ndim - 1))
        else:
            w = w * s  # scales the columns (the last axis) of W
        out = b.add(lin.op, [v("x"), b.const(w.astype(lin.dtype))], **dict(lin.attrs))
        if not with_bias:
            return out
        t = channel_vector(m.graph, m.nodes["b"], axis, lin.shape)
        assert t is not None
        bias = (t * s).reshape(channel_shape(rank, axis, len(s)))
        return b.add(Op.ADD, [out, bconst(b, bias, lin.shape, lin.dtype)])

    return build


def _lin(op: Op):
    return P(op, X("x"), X("w", Op.CONST), name="lin")


# Note [An affine map before a MatMul]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A LayerNorm's gamma and beta scale and shift each input feature of the Linear that
# reads it: (x * g + b) @ W = x @ (g[:, None] * W) + b @ W. Folded, the affine map
# leaves the graph; unfolded it was a memory kernel of its own in every block of a
# pre-norm transformer (deit_tiny: 24, 5-7 us each in place), since a linear kernel's
# fusion is its epilogue, not its input. Only where the map has no other reader (a
# post-norm BERT also adds the LayerNorm's output to the residual).
def _single_reader(*names: str):
    def cond(g: Graph, m: Match) -> bool:
        lin = _root(m)
        w = m.node("w")
        if not is_float(lin) or len(w.shape) != 2 or m.node("x").op is Op.CONST:
            return False
        gain = bcast_const(g, m.nodes["g"])
        if gain is None or (not names and gain.size == 1):
            return False  # a scalar (GELU's 0.5) stays in its chain, which backends match whole
        k = w.shape[0]
        shape = m.node("aff").shape
        if shape[-1] != k or any(channel_vector(g, m.nodes[n], -1, shape) is None for n in ("g", *names)):
            return False
        return all(_sole_reader(g, m.nodes[n]) for n in ("aff", "scale") if n in m.nodes)

    return cond


def _fold_input(with_shift: bool):
    def build(b: GraphBuilder, m: Match, v: Lookup) -> int:
        lin = _root(m)
        shape = m.node("aff").shape
        gain = channel_vector(m.graph, m.nodes["g"], -1, shape)
        w = m.value("w").astype(np.float64)
        out = b.add(Op.MATMUL, [v("x"), b.const((gain[:, None] * w).astype(lin.dtype))])
        if not with_shift:
            return out
        shift = channel_vector(m.graph, m.nodes["b"], -1, shape) @ w
        return b.add(
            Op.ADD, [out, bconst(b, shift.reshape(channel_shape(len(lin.shape), -1, len(shift))), lin.shape, lin.dtype)]
        )

    return build


AFFINE_RULES = (
    Rule(
        "sub_const_to_add",
        P(Op.SUB, X("x"), X("c")),
        _sub_to_add,
        _consts_ok("c"),
        "x - c = x + (-c)  (c a broadcast constant)",
    ),
    Rule(
        "div_const_to_mul",
        P(Op.DIV, X("x"), X("c")),
        _div_to_mul,
        _consts_ok("c"),
        "x / c = x * (1/c)  (c a broadcast constant)",
    ),
    Rule(
        "mul_const_chain",
        P(Op.MUL, P(Op.MUL, X("x"), X("c1")), X("c2")),
        _chain(Op.MUL, np.multiply),
        _consts_ok("c1", "c2"),
        "(x * c1) * c2 = x * (c1*c2)",
    ),
    Rule(
        "add_const_chain",
        P(Op.ADD, P(Op.ADD, X("x"), X("c1")), X("c2")),
        _chain(Op.ADD, np.add),
        _consts_ok("c1", "c2"),
        "(x + c1) + c2 = x + (c1+c2)",
    ),
    Rule(
        "mul_over_add_const",
        P(Op.MUL, P(Op.ADD, X("x"), X("c1"), name="inner"), X("c2")),
        _distribute,
        _distribute_ok,
        "(x + c1) * c2 = x * c2 + c1*c2  (x + c1 read nowhere else)",
    ),
    Rule(
        "fold_scale_into_conv",
        P(Op.MUL, _lin(Op.CONV), X("s")),
        _fold(1, False),
        _fold_ok(1, False),
        "conv(x, W) * s[c] = conv(x, W * s[:, None, ...])  (s per output channel)",
    ),
    Rule(
        "fold_scale_into_conv_bias",
        P(Op.MUL, P(Op.ADD, _lin(Op.CONV), X("b")), X("s")),
        _fold(1, True),
        _fold_ok(1, True),
        "(conv(x, W) + b[c]) * s[c] = conv(x, W * s) + b*s",
    ),
    Rule(
        "fold_scale_into_matmul",
        P(Op.MUL, _lin(Op.MATMUL), X("s")),
        _fold(-1, False),
        _fold_ok(-1, False),
        "matmul(x, W) * s[n] = matmul(x, W * s[None, :])  (s per output column)",
    ),
    Rule(
        "fold_scale_into_matmul_bias",
        P(Op.MUL, P(Op.ADD, _lin(Op.MATMUL), X("b")), X("s")),
        _fold(-1, True),
        _fold_ok(-1, True),
        "(matmul(x, W) + b[n]) * s[n] = matmul(x, W * s) + b*s",
    ),
)

# a memory kernel fewer for korch's own kernels, which the search's cost (the map fused
# into the LayerNorm's kernel) does not see; applied once after the search, so that its
# course is unchanged (in the search, bert_mini's maps were folded into Q, K and V one
# by one and their merge was lost) and the unrewritten graph keeps the LayerNorm that
# onnxruntime fuses
INPUT_AFFINE_RULES = (
    Rule(
        "fold_input_affine_into_matmul",
        P(Op.MATMUL, P(Op.ADD, P(Op.MUL, X("x"), X("g"), name="scale"), X("b"), name="aff"), X("w", Op.CONST)),
        _fold_input(True),
        _single_reader("b"),
        "matmul(x * g[k] + b[k], W) = matmul(x, g[:, None] * W) + b @ W  (Note [An affine map before a MatMul])",
    ),
    Rule(
        "fold_input_scale_into_matmul",
        P(Op.MATMUL, P(Op.MUL, X("x"), X("g"), name="aff"), X("w", Op.CONST)),
        _fold_input(False),
        _single_reader(),
        "matmul(x * g[k], W) = matmul(x, g[:, None] * W)  (g a vector: RMSNorm's weight)",
    ),
)
