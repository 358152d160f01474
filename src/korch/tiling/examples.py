"""Representative memory-bound kernel graphs for tests and the tiling benchmark.

Each builder returns a standalone kernel graph (inputs ``in*``, outputs ``out*``) in
the primitive conventions fission follows (Note [Primitive classes]).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import Op


def softmax(rows: int, cols: int) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", (rows, cols), "float32")
    m = b.reduce(Op.REDUCE_MAX, x, [-1])
    e = b.unary(Op.EXP, b.binary(Op.SUB, x, m))
    b.output("out0", b.binary(Op.DIV, e, b.reduce(Op.REDUCE_SUM, e, [-1])))
    return b.graph


def layernorm(rows: int, cols: int, eps: float = 1e-5) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", (rows, cols), "float32")
    gamma = b.input("in1", (cols,), "float32")
    beta = b.input("in2", (cols,), "float32")
    mean = b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, x, [-1]), b.scalar(cols, x))
    diff = b.binary(Op.SUB, x, mean)
    var = b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, b.binary(Op.MUL, diff, diff), [-1]), b.scalar(cols, x))
    rstd = b.unary(Op.RECIPROCAL, b.unary(Op.SQRT, b.binary(Op.ADD, var, b.scalar(eps, x))))
    y = b.binary(Op.MUL, diff, rstd)
    b.output("out0", b.binary(Op.ADD, b.binary(Op.MUL, y, gamma), beta))
    return b.graph


def instancenorm(n: int, c: int, h: int, w: int, eps: float = 1e-5) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", (n, c, h, w), "float32")
    hw = float(h * w)
    mean = b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, x, [2, 3]), b.scalar(hw, x))
    diff = b.binary(Op.SUB, x, mean)
    var = b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, b.binary(Op.MUL, diff, diff), [2, 3]), b.scalar(hw, x))
    rstd = b.unary(Op.RECIPROCAL, b.unary(Op.SQRT, b.binary(Op.ADD, var, b.scalar(eps, x))))
    b.output("out0", b.binary(Op.MUL, diff, rstd))
    return b.graph


def gelu(shape: tuple[int, ...]) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", shape, "float32")
    bias = b.input("in1", shape[-1:], "float32")
    x = b.binary(Op.ADD, x, bias)
    t = b.unary(Op.ERF, b.binary(Op.MUL, x, b.scalar(1 / np.sqrt(2), x)))
    y = b.binary(Op.MUL, b.binary(Op.MUL, x, b.scalar(0.5, x)), b.binary(Op.ADD, t, b.scalar(1.0, x)))
    b.output("out0", y)
    return b.graph


def add_relu(shape: tuple[int, ...]) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", shape, "float32")
    y = b.input("in1", shape, "float32")
    b.output("out0", b.binary(Op.MAX, b.binary(Op.ADD, x, y), b.scalar(0.0, x)))
    return b.graph


def transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", shape, "float32")
    b.output("out0", b.transpose(x, perm))
    return b.graph


def heads_split(seq: int, heads: int, dim: int) -> Graph:
    """(seq, heads*dim) -> reshape -> (heads, seq, dim): attention's head split."""
    b = GraphBuilder()
    x = b.input("in0", (seq, heads * dim), "float32")
    y = b.reshape(x, (seq, heads, dim))
    b.output("out0", b.transpose(y, (1, 0, 2)))
    return b.graph


def maxpool(n: int, c: int, h: int, w: int, k: int = 3, s: int = 2) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", (n, c, h, w), "float32")
    win = b.add(Op.WINDOW, [x], kernel=(k, k), strides=(s, s), dilations=(1, 1))
    y = b.reduce(Op.REDUCE_MAX, win, [4, 5])
    oh, ow = b.shape(y)[2:4]
    b.output("out0", b.reshape(y, (n, c, oh, ow)))
    return b.graph


def avgpool_global(n: int, c: int, h: int, w: int) -> Graph:
    b = GraphBuilder()
    x = b.input("in0", (n, c, h, w), "float32")
    s = b.reduce(Op.REDUCE_SUM, x, [2, 3])
    b.output("out0", b.binary(Op.MUL, s, b.scalar(1.0 / (h * w), x)))
    return b.graph


def suite(small: bool = False) -> list[tuple[str, Callable[[], Graph]]]:
    """(name, builder) pairs covering the common kernel shapes at several sizes."""
    out: list[tuple[str, Callable[[], Graph]]] = []
    rows_cols = [(64, 64), (128, 768), (512, 3072), (8, 50000)] if not small else [(16, 64), (8, 200)]
    for r, c in rows_cols:
        out.append((f"softmax{r}x{c}", lambda r=r, c=c: softmax(r, c)))
        out.append((f"layernorm{r}x{c}", lambda r=r, c=c: layernorm(r, c)))
    for shp in [(1, 64, 56, 56), (2, 16, 224, 224), (1, 512, 7, 7)] if not small else [(1, 4, 8, 8)]:
        out.append((f"instancenorm{'x'.join(map(str, shp))}", lambda s=shp: instancenorm(*s)))
        out.append((f"maxpool{'x'.join(map(str, shp))}", lambda s=shp: maxpool(*s)))
        out.append((f"gap{'x'.join(map(str, shp))}", lambda s=shp: avgpool_global(*s)))
    for shp in [(128, 3072), (8, 197, 768), (4096,)] if not small else [(16, 64)]:
        out.append((f"gelu{'x'.join(map(str, shp))}", lambda s=shp: gelu(s)))
        out.append((f"addrelu{'x'.join(map(str, shp))}", lambda s=shp: add_relu(s)))
    for shp, perm in (
        [((512, 512), (1, 0)), ((8, 64, 128), (0, 2, 1)), ((1, 64, 56, 56), (0, 2, 3, 1))]
        if not small
        else [((16, 24), (1, 0))]
    ):
        out.append((f"transpose{'x'.join(map(str, shp))}", lambda s=shp, p=perm: transpose(s, p)))
    for seq, heads, dim in [(128, 12, 64), (197, 3, 64)] if not small else [(8, 2, 4)]:
        out.append((f"heads{seq}x{heads}x{dim}", lambda a=seq, h=heads, d=dim: heads_split(a, h, d)))
    return out
