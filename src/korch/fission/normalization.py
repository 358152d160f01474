"""Softmax and the normalization layers, as reduce + broadcast + elementwise.

Every reduction keeps dims (the IR's convention), so statistics broadcast back over
the reduced axes with one explicit BROADCAST each.
"""

from __future__ import annotations

import numpy as np

from korch.fission.registry import Ctx, Unsupported, normalize_axis, rule
from korch.ir import Op


def _softmax_axes(ctx: Ctx, x: int, axis: int | None) -> list[int]:
    rank = ctx.rank(x)
    if ctx.opset >= 13:
        return [normalize_axis(-1 if axis is None else axis, rank)]
    # opsets < 13 flatten to [prod(:axis), prod(axis:)]: the same as reducing all trailing axes
    first = normalize_axis(1 if axis is None else axis, rank)
    return list(range(first, rank))


def _shifted(ctx: Ctx, x: int, axes: list[int]) -> int:
    """x - max(x): exp of it cannot overflow (the numerically safe softmax)."""
    return ctx.binary(Op.SUB, x, ctx.b.reduce(Op.REDUCE_MAX, x, axes))


@rule
def Softmax(ctx: Ctx, input, *, axis=None):
    axes = _softmax_axes(ctx, input, axis)
    e = ctx.unary(Op.EXP, _shifted(ctx, input, axes))
    return ctx.binary(Op.DIV, e, ctx.b.reduce(Op.REDUCE_SUM, e, axes))


@rule
def LogSoftmax(ctx: Ctx, input, *, axis=None):
    axes = _softmax_axes(ctx, input, axis)
    shifted = _shifted(ctx, input, axes)
    lse = ctx.unary(Op.LOG, ctx.b.reduce(Op.REDUCE_SUM, ctx.unary(Op.EXP, shifted), axes))
    return ctx.binary(Op.SUB, shifted, lse)


def _normalize(ctx: Ctx, x: int, axes: list[int], epsilon: float) -> tuple[int, int, int]:
    """(x - mean) * 1/sqrt(var + eps) over ``axes``; returns (y, mean, inv_std_dev)."""
    mean = ctx.mean(x, axes)
    centered = ctx.binary(Op.SUB, x, mean)
    var = ctx.mean(ctx.binary(Op.MUL, centered, centered), axes)
    inv = ctx.unary(Op.RECIPROCAL, ctx.unary(Op.SQRT, ctx.add_const(var, epsilon)))
    return ctx.binary(Op.MUL, centered, inv), mean, inv


def _float_input(ctx: Ctx, x: int) -> None:
    if ctx.dtype(x) not in ("float32", "float64", "float16"):
        raise Unsupported(f"dtype {ctx.dtype(x)}")


@rule
def LayerNormalization(ctx: Ctx, X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    _float_input(ctx, X)
    if ctx.dtype(X) != "float32" and stash_type == 1:
        raise Unsupported("float32 stash of a non-float32 input")
    rank = ctx.rank(X)
    first = normalize_axis(axis, rank)
    y, mean, inv = _normalize(ctx, X, list(range(first, rank)), epsilon)
    y = ctx.binary(Op.MUL, y, Scale)
    if B is not None:
        y = ctx.binary(Op.ADD, y, B)
    if ctx.shape(y) != ctx.shape(X):
        raise Unsupported("Scale/B must broadcast to X")
    return y, mean, inv


def _per_channel(ctx: Ctx, v: int, rank: int) -> int:
    """A [C] tensor reshaped to [1, C, 1, ...] to broadcast over NC..."""
    return ctx.reshape(v, (1, ctx.shape(v)[0]) + (1,) * (rank - 2))


@rule
def InstanceNormalization(ctx: Ctx, input, scale, B, *, epsilon=1e-5):
    _float_input(ctx, input)
    rank = ctx.rank(input)
    y, _, _ = _normalize(ctx, input, list(range(2, rank)), epsilon)
    y = ctx.binary(Op.MUL, y, _per_channel(ctx, scale, rank))
    return ctx.binary(Op.ADD, y, _per_channel(ctx, B, rank))


@rule
def BatchNormalization(
    ctx: Ctx, X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1
):
    """Inference form: y = x * a + c with a = scale / sqrt(var + eps), c = B - mean * a."""
    _float_input(ctx, X)
    if training_mode or spatial != 1:
        raise Unsupported("training mode / non-spatial")
    rank = ctx.rank(X)
    consts = [ctx.const(v) for v in (scale, B, input_mean, input_var)]
    if all(c is not None for c in consts):
        # constant statistics (the usual case): fold a and c now, in float64
        s, bias, mu, var = (c.astype(np.float64) for c in consts)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN/negative stats: same as ort
            a = s / np.sqrt(var + epsilon)
            c = bias - mu * a
        a_id = ctx.b.const(a.astype(ctx.dtype(X)).reshape((1, -1) + (1,) * (rank - 2)))
        c_id = ctx.b.const(c.astype(ctx.dtype(X)).reshape((1, -1) + (1,) * (rank - 2)))
        return ctx.binary(Op.ADD, ctx.binary(Op.MUL, X, a_id), c_id), None, None
    inv = ctx.unary(Op.RECIPROCAL, ctx.unary(Op.SQRT, ctx.add_const(input_var, epsilon)))
    centered = ctx.binary(Op.SUB, X, _per_channel(ctx, input_mean, rank))
    y = ctx.binary(Op.MUL, centered, _per_channel(ctx, ctx.binary(Op.MUL, scale, inv), rank))
    return ctx.binary(Op.ADD, y, _per_channel(ctx, B, rank)), None, None


@rule
def GroupNormalization(ctx: Ctx, X, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1):
    """Opset 18 takes per-group scale/bias ([G]), opset 21 per-channel ([C])."""
    _float_input(ctx, X)
    if ctx.dtype(X) != "float32" and stash_type == 1:
        raise Unsupported("float32 stash of a non-float32 input")
    shape = ctx.shape(X)
    rank = len(shape)
    n, c = shape[0], shape[1]
    if c % num_groups:
        raise Unsupported("channels not divisible by num_groups")
    grouped = ctx.reshape(X, (n, num_groups, c // num_groups) + shape[2:])
    y, _, _ = _normalize(ctx, grouped, list(range(2, rank + 1)), epsilon)
    if ctx.shape(scale)[0] == num_groups and num_groups != c:  # opset-18 form
        gshape = (1, num_groups) + (1,) * (rank - 1)
        y = ctx.binary(Op.MUL, y, ctx.reshape(scale, gshape))
        y = ctx.binary(Op.ADD, y, ctx.reshape(bias, gshape))
        return ctx.reshape(y, shape)
    y = ctx.reshape(y, shape)
    y = ctx.binary(Op.MUL, y, _per_channel(ctx, scale, rank))
    return ctx.binary(Op.ADD, y, _per_channel(ctx, bias, rank))
