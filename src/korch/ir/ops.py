"""Primitive operators and their categories.

Note [Primitive classes]
~~~~~~~~~~~~~~~~~~~~~~~~
Korch splits every ONNX operator into primitives of five classes (seed §3):
elementwise, reduce, broadcast, layout transformation and linear transformation.
We add OPAQUE for operators no rule splits (run by a fallback backend) and the two
source kinds INPUT and CONST, which are never part of a kernel.

Conventions every stage relies on:
* Elementwise primitives take inputs of exactly the output shape, except rank-0
  scalar constants (CONST with a ``value`` attribute), which any kernel inlines.
* Broadcasts are explicit: BROADCAST keeps the rank and expands size-1 dims.
* Reductions always keep dims (``keepdims=1``); a RESHAPE drops them.
* SLICE is (start, step, length) per axis: ``out[i] = x[start + i*step]``.
* MATMUL takes ``A[..., M, K]`` and ``B[K, N]`` or ``B[..., K, N]`` with equal batch.
* CONV is ONNX Conv without bias: pads are (begin..., end...), NCHW layout.
"""

from __future__ import annotations

import enum


class Op(enum.Enum):
    # sources
    INPUT = "input"
    CONST = "const"
    # elementwise, unary
    NEG = "neg"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RECIPROCAL = "reciprocal"
    TANH = "tanh"
    ERF = "erf"
    SIGMOID = "sigmoid"
    ABS = "abs"
    FLOOR = "floor"
    CEIL = "ceil"
    NOT = "not"
    CAST = "cast"
    # elementwise, binary / ternary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    EQUAL = "equal"
    LESS = "less"
    GREATER = "greater"
    AND = "and"
    OR = "or"
    WHERE = "where"
    # reduce
    REDUCE_SUM = "reduce_sum"
    REDUCE_MAX = "reduce_max"
    REDUCE_MIN = "reduce_min"
    # broadcast
    BROADCAST = "broadcast"
    # layout transformation
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    SLICE = "slice"
    CONCAT = "concat"
    PAD = "pad"
    GATHER = "gather"
    WINDOW = "window"
    # linear transformation
    MATMUL = "matmul"
    CONV = "conv"
    # anything else, run by a fallback backend
    OPAQUE = "opaque"


class GroupOp:
    """Sets of ops that rules and stages match on."""

    SOURCE = frozenset({Op.INPUT, Op.CONST})
    UNARY = frozenset(
        {
            Op.NEG,
            Op.EXP,
            Op.LOG,
            Op.SQRT,
            Op.RECIPROCAL,
            Op.TANH,
            Op.ERF,
            Op.SIGMOID,
            Op.ABS,
            Op.FLOOR,
            Op.CEIL,
            Op.NOT,
            Op.CAST,
        }
    )
    BINARY = frozenset(
        {
            Op.ADD,
            Op.SUB,
            Op.MUL,
            Op.DIV,
            Op.POW,
            Op.MAX,
            Op.MIN,
            Op.EQUAL,
            Op.LESS,
            Op.GREATER,
            Op.AND,
            Op.OR,
        }
    )
    COMPARE = frozenset({Op.EQUAL, Op.LESS, Op.GREATER})
    ELEMENTWISE = UNARY | BINARY | {Op.WHERE}
    REDUCE = frozenset({Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN})
    BROADCAST = frozenset({Op.BROADCAST})
    LAYOUT = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.SLICE, Op.CONCAT, Op.PAD, Op.GATHER, Op.WINDOW})
    LINEAR = frozenset({Op.MATMUL, Op.CONV})
    OPAQUE = frozenset({Op.OPAQUE})
    # everything a generated (memory-bound) kernel can contain
    MEMORY_BOUND = ELEMENTWISE | REDUCE | BROADCAST | LAYOUT
    PRIMITIVE = MEMORY_BOUND | LINEAR | OPAQUE


def category(op: Op) -> str:
    """The primitive class of ``op`` in the paper's words."""
    for name, group in (
        ("source", GroupOp.SOURCE),
        ("elementwise", GroupOp.ELEMENTWISE),
        ("reduce", GroupOp.REDUCE),
        ("broadcast", GroupOp.BROADCAST),
        ("layout", GroupOp.LAYOUT),
        ("linear", GroupOp.LINEAR),
        ("opaque", GroupOp.OPAQUE),
    ):
        if op in group:
            return name
    raise ValueError(op)


DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
