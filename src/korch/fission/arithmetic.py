"""Elementwise arithmetic, comparison, logic and casts: one primitive each, mostly.

Binary operators follow numpy (multidirectional) broadcasting; ``ctx.binary`` makes
the broadcasts explicit as BROADCAST primitives.
"""

from __future__ import annotations

import functools

import numpy as np

from korch.fission.registry import Ctx, Unsupported, rule
from korch.ir import DTYPES, Op


@rule
def Add(ctx: Ctx, A, B):
    return ctx.binary(Op.ADD, A, B)


@rule
def Sub(ctx: Ctx, A, B):
    return ctx.binary(Op.SUB, A, B)


@rule
def Mul(ctx: Ctx, A, B):
    return ctx.binary(Op.MUL, A, B)


@rule
def Div(ctx: Ctx, A, B):
    return ctx.binary(Op.DIV, A, B)


@rule
def Pow(ctx: Ctx, X, Y):
    exponent = ctx.const(Y)
    if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0:
        return ctx.binary(Op.MUL, X, X)  # exact, and what every engine does
    if ctx.dtype(Y) != ctx.dtype(X):
        Y = ctx.unary(Op.CAST, Y, to=ctx.dtype(X))
    return ctx.binary(Op.POW, X, Y)


def _variadic(ctx: Ctx, op: Op, inputs) -> int:
    if not inputs:
        raise Unsupported("no inputs")
    return functools.reduce(lambda a, b: ctx.binary(op, a, b), inputs)


@rule
def Max(ctx: Ctx, *data_0):
    return _variadic(ctx, Op.MAX, data_0)


@rule
def Min(ctx: Ctx, *data_0):
    return _variadic(ctx, Op.MIN, data_0)


@rule
def Sum(ctx: Ctx, *data_0):
    return _variadic(ctx, Op.ADD, data_0)


@rule
def Mean(ctx: Ctx, *data_0):
    total = _variadic(ctx, Op.ADD, data_0)
    return total if len(data_0) == 1 else ctx.binary(Op.DIV, total, ctx.scalar(len(data_0), total))


@rule
def Where(ctx: Ctx, condition, X, Y):
    shape = tuple(np.broadcast_shapes(ctx.shape(condition), ctx.shape(X), ctx.shape(Y)))
    b = ctx.b
    return b.add(Op.WHERE, [b.broadcast_to(condition, shape), b.broadcast_to(X, shape), b.broadcast_to(Y, shape)])


@rule
def Equal(ctx: Ctx, A, B):
    return ctx.binary(Op.EQUAL, A, B)


@rule
def Less(ctx: Ctx, A, B):
    return ctx.binary(Op.LESS, A, B)


@rule
def Greater(ctx: Ctx, A, B):
    return ctx.binary(Op.GREATER, A, B)


@rule
def LessOrEqual(ctx: Ctx, A, B):
    # not NOT(Greater): with a NaN both are false
    return ctx.binary(Op.OR, ctx.binary(Op.LESS, A, B), ctx.binary(Op.EQUAL, A, B))


@rule
def GreaterOrEqual(ctx: Ctx, A, B):
    return ctx.binary(Op.OR, ctx.binary(Op.GREATER, A, B), ctx.binary(Op.EQUAL, A, B))


@rule
def And(ctx: Ctx, A, B):
    return ctx.binary(Op.AND, A, B)


@rule
def Or(ctx: Ctx, A, B):
    return ctx.binary(Op.OR, A, B)


@rule
def Xor(ctx: Ctx, A, B):
    return ctx.unary(Op.NOT, ctx.binary(Op.EQUAL, A, B))


@rule
def Not(ctx: Ctx, X):
    return ctx.unary(Op.NOT, X)


@rule
def IsNaN(ctx: Ctx, X):
    return ctx.unary(Op.NOT, ctx.binary(Op.EQUAL, X, X))


@rule
def Neg(ctx: Ctx, X):
    return ctx.unary(Op.NEG, X)


@rule
def Abs(ctx: Ctx, X):
    return ctx.unary(Op.ABS, X)


@rule
def Floor(ctx: Ctx, X):
    return ctx.unary(Op.FLOOR, X)


@rule
def Ceil(ctx: Ctx, X):
    return ctx.unary(Op.CEIL, X)


@rule
def Exp(ctx: Ctx, input):
    return ctx.unary(Op.EXP, input)


@rule
def Log(ctx: Ctx, input):
    return ctx.unary(Op.LOG, input)


@rule
def Sqrt(ctx: Ctx, X):
    return ctx.unary(Op.SQRT, X)


@rule
def Reciprocal(ctx: Ctx, X):
    return ctx.unary(Op.RECIPROCAL, X)


@rule
def Erf(ctx: Ctx, input):
    return ctx.unary(Op.ERF, input)


@rule
def Tanh(ctx: Ctx, input):
    return ctx.unary(Op.TANH, input)


@rule
def Sigmoid(ctx: Ctx, X):
    return ctx.unary(Op.SIGMOID, X)


def _cast(ctx: Ctx, x: int, dtype: str) -> int:
    if dtype not in DTYPES:
        raise Unsupported(f"cast to {dtype}")
    return x if ctx.dtype(x) == dtype else ctx.unary(Op.CAST, x, to=dtype)


@rule
def Cast(ctx: Ctx, input, *, to, saturate=1, round_mode="up"):
    from onnx import helper

    # saturate/round_mode only concern float8 and float4 targets, which we do not emit
    return _cast(ctx, input, np.dtype(helper.tensor_dtype_to_np_dtype(to)).name)


@rule
def CastLike(ctx: Ctx, input, target_type, *, saturate=1, round_mode="up"):
    return _cast(ctx, input, ctx.dtype(target_type))


@rule
def Identity(ctx: Ctx, input):
    return input


@rule
def Dropout(ctx: Ctx, data, ratio=None, training_mode=None, *, seed=None):
    """Inference: the identity. The mask output stays opaque (it is rarely read)."""
    if training_mode is not None:
        mode = ctx.array(training_mode)
        if bool(mode.reshape(())):
            raise Unsupported("training mode")
    return data, None
