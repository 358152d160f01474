"""Reductions. ``axes`` is an attribute before opset 18 (13 for ReduceSum) and an input
after; one parameter takes either (see Note [Fission rules])."""

from __future__ import annotations

from korch.fission.registry import Ctx, Unsupported, normalize_axis, rule
from korch.ir import Op


def _axes(ctx: Ctx, data: int, axes, noop_with_empty_axes: int) -> list[int] | None:
    """The reduced axes, or None for the identity (no axes and noop_with_empty_axes)."""
    rank = ctx.rank(data)
    given = ctx.ints(axes)
    if not given:
        return None if noop_with_empty_axes else list(range(rank))
    return sorted({normalize_axis(a, rank) for a in given})


def _reduce(ctx: Ctx, op: Op, data: int, axes: list[int], keepdims: int) -> int:
    if op is not Op.REDUCE_SUM and any(ctx.shape(data)[a] == 0 for a in axes):
        raise Unsupported("max/min over an empty axis")  # the spec's +-inf: left to onnxruntime
    return ctx.b.reduce(op, data, axes, keepdims=bool(keepdims))


def _drop(ctx: Ctx, x: int, axes: list[int], keepdims: int) -> int:
    """Drop kept (size-1) reduced axes when keepdims=0."""
    if keepdims:
        return x
    return ctx.b.reshape(x, [d for i, d in enumerate(ctx.shape(x)) if i not in axes])


@rule
def ReduceSum(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    return data if ax is None else _reduce(ctx, Op.REDUCE_SUM, data, ax, keepdims)


@rule
def ReduceMax(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    return data if ax is None else _reduce(ctx, Op.REDUCE_MAX, data, ax, keepdims)


@rule
def ReduceMin(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    return data if ax is None else _reduce(ctx, Op.REDUCE_MIN, data, ax, keepdims)


@rule
def ReduceMean(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    return data if ax is None else _drop(ctx, ctx.mean(data, ax), ax, keepdims)


@rule
def ReduceSumSquare(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    sq = ctx.binary(Op.MUL, data, data)
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    return sq if ax is None else _reduce(ctx, Op.REDUCE_SUM, sq, ax, keepdims)


@rule
def ReduceL1(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    a = ctx.unary(Op.ABS, data)
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    return a if ax is None else _reduce(ctx, Op.REDUCE_SUM, a, ax, keepdims)


@rule
def ReduceL2(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    if ax is None:
        return ctx.unary(Op.ABS, data)  # sqrt(x * x)
    sq = ctx.binary(Op.MUL, data, data)
    return ctx.unary(Op.SQRT, _reduce(ctx, Op.REDUCE_SUM, sq, ax, keepdims))


@rule
def ReduceLogSum(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    s = data if ax is None else _reduce(ctx, Op.REDUCE_SUM, data, ax, keepdims)
    return ctx.unary(Op.LOG, s)


@rule
def ReduceLogSumExp(ctx: Ctx, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(ctx, data, axes, noop_with_empty_axes)
    if ax is None:
        return data
    m = _reduce(ctx, Op.REDUCE_MAX, data, ax, 1)  # shift by the max: no overflow
    e = ctx.unary(Op.EXP, ctx.binary(Op.SUB, data, m))
    lse = ctx.binary(Op.ADD, ctx.unary(Op.LOG, ctx.b.reduce(Op.REDUCE_SUM, e, ax)), m)
    return _drop(ctx, lse, ax, keepdims)
