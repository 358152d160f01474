"""Activation functions as elementwise primitives (formulas from the ONNX spec)."""

from __future__ import annotations

import math

from korch.fission.registry import Ctx, Unsupported, rule
from korch.ir import Op


@rule
def Relu(ctx: Ctx, X):
    return ctx.binary(Op.MAX, X, ctx.scalar(0, X))


def _where_negative(ctx: Ctx, x: int, negative: int) -> int:
    """``negative`` where x < 0, else x."""
    cond = ctx.binary(Op.LESS, x, ctx.scalar(0, x))
    return ctx.b.add(Op.WHERE, [cond, negative, x])


@rule
def LeakyRelu(ctx: Ctx, X, *, alpha=0.01):
    return _where_negative(ctx, X, ctx.mul_const(X, alpha))


@rule
def PRelu(ctx: Ctx, X, slope):
    neg = ctx.binary(Op.MUL, X, slope)
    if ctx.shape(neg) != ctx.shape(X):
        raise Unsupported("slope must broadcast to X")
    return _where_negative(ctx, X, neg)


@rule
def Elu(ctx: Ctx, X, *, alpha=1.0):
    # exp of min(x, 0): the branch not taken must not overflow
    e = ctx.unary(Op.EXP, ctx.binary(Op.MIN, X, ctx.scalar(0, X)))
    return _where_negative(ctx, X, ctx.mul_const(ctx.add_const(e, -1.0), alpha))


@rule
def Selu(ctx: Ctx, X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    e = ctx.unary(Op.EXP, ctx.binary(Op.MIN, X, ctx.scalar(0, X)))
    neg = ctx.add_const(ctx.mul_const(e, alpha), -alpha)
    cond = ctx.binary(Op.GREATER, X, ctx.scalar(0, X))
    return ctx.mul_const(ctx.b.add(Op.WHERE, [cond, X, neg]), gamma)


@rule
def Celu(ctx: Ctx, X, *, alpha=1.0):
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
    e = ctx.unary(Op.EXP, ctx.mul_const(ctx.binary(Op.MIN, X, ctx.scalar(0, X)), 1.0 / alpha))
    neg = ctx.mul_const(ctx.add_const(e, -1.0), alpha)
    return ctx.binary(Op.ADD, ctx.binary(Op.MAX, X, ctx.scalar(0, X)), neg)


@rule
def ThresholdedRelu(ctx: Ctx, X, *, alpha=1.0):
    cond = ctx.binary(Op.GREATER, X, ctx.scalar(alpha, X))
    return ctx.b.add(Op.WHERE, [cond, X, ctx.scalar(0, X)])


def _hard_sigmoid(ctx: Ctx, x: int, alpha: float, beta: float) -> int:
    y = ctx.add_const(ctx.mul_const(x, alpha), beta)
    return ctx.binary(Op.MIN, ctx.binary(Op.MAX, y, ctx.scalar(0, y)), ctx.scalar(1, y))


@rule
def HardSigmoid(ctx: Ctx, X, *, alpha=0.2, beta=0.5):
    return _hard_sigmoid(ctx, X, alpha, beta)


@rule
def HardSwish(ctx: Ctx, X):
    return ctx.binary(Op.MUL, X, _hard_sigmoid(ctx, X, 1.0 / 6.0, 0.5))


@rule
def Gelu(ctx: Ctx, X, *, approximate="none"):
    half_x = ctx.mul_const(X, 0.5)
    if approximate == "none":
        inner = ctx.unary(Op.ERF, ctx.mul_const(X, 1.0 / math.sqrt(2.0)))
    elif approximate == "tanh":
        cube = ctx.binary(Op.MUL, ctx.binary(Op.MUL, X, X), X)
        arg = ctx.binary(Op.ADD, X, ctx.mul_const(cube, 0.044715))
        inner = ctx.unary(Op.TANH, ctx.mul_const(arg, math.sqrt(2.0 / math.pi)))
    else:
        raise Unsupported(f"approximate={approximate!r}")
    return ctx.binary(Op.MUL, half_x, ctx.add_const(inner, 1.0))


def _softplus(ctx: Ctx, x: int) -> int:
    # log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)), which never overflows
    tail = ctx.unary(Op.EXP, ctx.unary(Op.NEG, ctx.unary(Op.ABS, x)))
    return ctx.binary(Op.ADD, ctx.binary(Op.MAX, x, ctx.scalar(0, x)), ctx.unary(Op.LOG, ctx.add_const(tail, 1.0)))


@rule
def Softplus(ctx: Ctx, X):
    return _softplus(ctx, X)


@rule
def Mish(ctx: Ctx, X):
    return ctx.binary(Op.MUL, X, ctx.unary(Op.TANH, _softplus(ctx, X)))


@rule
def Softsign(ctx: Ctx, input):
    return ctx.binary(Op.DIV, input, ctx.add_const(ctx.unary(Op.ABS, input), 1.0))


@rule
def Clip(ctx: Ctx, input, min=None, max=None):
    """min/max: inputs (opset >= 11) or float attributes (older opsets)."""
    y = input
    for bound, op in ((min, Op.MAX), (max, Op.MIN)):
        if bound is None:
            continue
        if not isinstance(bound, int):  # an attribute (a float): a scalar constant
            bound = ctx.scalar(bound, input)
        elif ctx.shape(bound) != ():
            raise Unsupported("Clip bounds must be scalars")
        y = ctx.binary(op, y, bound)
    return y
