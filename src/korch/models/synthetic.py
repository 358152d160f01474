"""Hand-built primitive graphs (no ONNX, no fission) for partition/identify tests.

They follow the conventions of Note [Primitive classes] the way fission would:
explicit broadcasts, keepdims reductions, bias added after a bias-free MATMUL/CONV.
"""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, GraphBuilder, Node
from korch.ir.ops import Op


def _rand(b: GraphBuilder, rng: np.random.Generator, *shape: int) -> int:
    return b.const((rng.standard_normal(shape) * 0.1).astype("float32"))


def layer_norm(b: GraphBuilder, rng: np.random.Generator, x: int, eps: float = 1e-5) -> int:
    shape = b.shape(x)
    n = shape[-1]
    mean = b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, x, [-1]), b.scalar(n, x))
    diff = b.binary(Op.SUB, x, mean)
    var = b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, b.binary(Op.MUL, diff, diff), [-1]), b.scalar(n, x))
    rstd = b.unary(Op.RECIPROCAL, b.unary(Op.SQRT, b.binary(Op.ADD, var, b.scalar(eps, x))))
    y = b.binary(Op.MUL, diff, rstd)
    return b.binary(Op.ADD, b.binary(Op.MUL, y, _rand(b, rng, n)), _rand(b, rng, n))


def linear(b: GraphBuilder, rng: np.random.Generator, x: int, n_out: int) -> int:
    y = b.add(Op.MATMUL, [x, _rand(b, rng, b.shape(x)[-1], n_out)])
    return b.binary(Op.ADD, y, _rand(b, rng, n_out))


def softmax(b: GraphBuilder, x: int) -> int:
    m = b.reduce(Op.REDUCE_MAX, x, [-1])
    e = b.unary(Op.EXP, b.binary(Op.SUB, x, m))
    return b.binary(Op.DIV, e, b.reduce(Op.REDUCE_SUM, e, [-1]))


def gelu(b: GraphBuilder, x: int) -> int:
    erf = b.unary(Op.ERF, b.binary(Op.DIV, x, b.scalar(2**0.5, x)))
    return b.binary(Op.MUL, b.binary(Op.MUL, x, b.binary(Op.ADD, erf, b.scalar(1.0, x))), b.scalar(0.5, x))


def transformer_layer(seq: int = 64, hidden: int = 128, heads: int = 4, seed: int = 0) -> Graph:
    """Pre-LN-free BERT-style layer: attention + residual + LN, MLP + residual + LN."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (seq, hidden), "float32")
    dh = hidden // heads

    def split_heads(t: int) -> int:
        return b.transpose(b.reshape(t, (seq, heads, dh)), (1, 0, 2))

    q, k, v = (split_heads(linear(b, rng, x, hidden)) for _ in range(3))
    kt = b.transpose(k, (0, 2, 1))
    s = b.binary(Op.MUL, b.add(Op.MATMUL, [q, kt]), b.scalar(dh**-0.5, q))
    ctx = b.add(Op.MATMUL, [softmax(b, s), v])
    ctx = b.reshape(b.transpose(ctx, (1, 0, 2)), (seq, hidden))
    h = layer_norm(b, rng, b.binary(Op.ADD, linear(b, rng, ctx, hidden), x))
    f = linear(b, rng, gelu(b, linear(b, rng, h, 4 * hidden)), hidden)
    b.output("y", layer_norm(b, rng, b.binary(Op.ADD, f, h)))
    return b.graph


def wide(branches: int = 30, depth: int = 3, interleaved: bool = True, size: int = 16) -> Graph:
    """``branches`` parallel chains of ``depth`` unary ops from one input, concatenated.

    With ``interleaved`` the graph's node order is layer by layer (the worst order
    for segmenting: every layer is an antichain of ``branches`` primitives).
    """
    b = GraphBuilder()
    x = b.input("x", (1, size), "float32")
    ops = [Op.EXP, Op.TANH, Op.SIGMOID, Op.NEG, Op.ABS]
    heads = [b.binary(Op.MUL, x, b.scalar(float(i + 1), x)) for i in range(branches)]
    if interleaved:
        for d in range(depth):
            heads = [b.unary(ops[d % len(ops)], h) for h in heads]
    else:
        for i in range(branches):
            for d in range(depth):
                heads[i] = b.unary(ops[d % len(ops)], heads[i])
    b.output("y", b.add(Op.CONCAT, heads, axis=1))
    return b.graph


def from_edges(preds: list[list[int]], ops: list[Op] | None = None, size: int = 4) -> Graph:
    """A graph with one input and ``len(preds)`` compute primitives; ``preds[i]`` lists
    the (earlier) primitives that primitive i reads. Primitive i is node ``i + 1``.

    Shapes are all ``(size,)`` and the ops are only labels (the graph need not pass
    ``verify``): enough for the graph algorithms, which look at structure and op class.
    Primitives without producers read the input.
    """
    g = Graph()
    g.nodes.append(Node(Op.INPUT, (), (("name", "x"),), (size,), "float32"))
    g.inputs["x"] = 0
    for i, ps in enumerate(preds):
        if any(not 0 <= p < i for p in ps):
            raise ValueError(f"primitive {i}: producers must be earlier, got {ps}")
        inputs = tuple(p + 1 for p in dict.fromkeys(ps)) or (0,)
        op = ops[i] if ops is not None else (Op.ADD if len(inputs) > 1 else Op.EXP)
        g.nodes.append(Node(op, inputs, (), (size,), "float32"))
    sinks = set(range(1, len(g.nodes))) - {s for n in g.nodes for s in n.inputs}
    for nid in sorted(sinks):
        g.outputs[f"y{nid}"] = nid
    return g
