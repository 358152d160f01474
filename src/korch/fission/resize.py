"""Resize, one axis at a time, with constant indices and weights.

Nearest: a GATHER per resized axis. Linear: two GATHERs per axis (the neighbours
below and above each source coordinate) mixed with constant weights; axis by axis
this is exactly bilinear (trilinear, ...) interpolation. The source coordinate of
output index i follows ``coordinate_transformation_mode``, computed in float32 the
way onnxruntime computes it (rounding at exact halves must agree), and linear mode
clamps it into [0, size - 1] as onnxruntime does.
"""

from __future__ import annotations

import numpy as np

from korch.errors import ModelError
from korch.fission.registry import Ctx, Unsupported, normalize_axis, rule
from korch.ir import Op


def _source_coords(mode: str, out: int, size: int, scale: float) -> np.ndarray:
    """Source coordinate of each output index, in float32 as onnxruntime computes it."""
    f = np.float32
    i = np.arange(out, dtype=f)
    scale = f(scale)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and out > 1):
        return (i + f(0.5)) / scale - f(0.5)
    if mode == "pytorch_half_pixel":
        return np.zeros(out, f)
    if mode == "half_pixel_symmetric":
        adjustment = f(f(out) / f(scale * f(size)))
        offset = f(f(size) / f(2)) * (f(1) - adjustment)
        return (np.float64(offset) + (i.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(f)
    if mode == "align_corners":
        return i * f(size - 1) / f(out - 1) if out > 1 else np.zeros(out, f)
    if mode == "asymmetric":
        return i / scale
    raise Unsupported(f"coordinate_transformation_mode {mode!r}")


def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))  # C's round()


def _nearest(x: np.ndarray, mode: str) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.where(x == np.trunc(x) + np.float32(0.5), np.floor(x), _round_half_away(x))
    if mode == "round_prefer_ceil":
        return _round_half_away(x)
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    raise Unsupported(f"nearest_mode {mode!r}")


def _gather(ctx: Ctx, x: int, axis: int, idx: np.ndarray) -> int:
    if ctx.shape(x)[axis] == len(idx) and np.array_equal(idx, np.arange(len(idx))):
        return x
    return ctx.b.add(Op.GATHER, [x], axis=axis, indices=idx, indices_shape=(len(idx),))


@rule
def Resize(
    ctx: Ctx,
    X,
    roi=None,
    scales=None,
    sizes=None,
    *,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
):
    if ctx.opset < 11:  # Resize-10 is Upsample-9 allowing scales below 1
        return _resize(ctx, X, ctx.floats(roi), None, None, "asymmetric", mode, "simple")
    if antialias or keep_aspect_ratio_policy != "stretch":
        raise Unsupported("antialias and aspect-ratio policies")
    scale_values = ctx.floats(scales) if scales is not None else None
    size_values = ctx.ints(sizes) if sizes is not None else None
    return _resize(ctx, X, scale_values, size_values, axes, coordinate_transformation_mode, mode, nearest_mode)


@rule
def Upsample(ctx: Ctx, X, scales=None, *, mode="nearest"):
    """Opsets 7-9: scales an attribute (7) or an input (9); asymmetric coordinates."""
    return _resize(ctx, X, ctx.floats(scales), None, None, "asymmetric", mode, "simple")


def _resize(ctx: Ctx, X, scale_values, size_values, axes, coord_mode: str, mode: str, nearest_mode: str) -> int:
    """``nearest_mode`` "simple" is opset < 11 rounding: down when upsampling, up when downsampling."""
    if mode not in ("nearest", "linear"):
        raise Unsupported(f"mode {mode!r}")
    in_shape = ctx.shape(X)
    rank = len(in_shape)
    ax = [normalize_axis(a, rank) for a in axes] if axes is not None else list(range(rank))
    out_shape = ctx.out_shape()
    per_axis_scale = [1.0] * rank
    if scale_values:
        if len(scale_values) != len(ax):
            raise Unsupported("scales length")
        for a, s in zip(ax, scale_values):
            per_axis_scale[a] = s
            # onnxruntime sizes the output as int(float32(scale) * size); ONNX inference in float64
            if int(np.float32(s) * np.float32(in_shape[a])) != out_shape[a]:
                raise ModelError(
                    f"Resize: scale {s} on axis {a} gives size {out_shape[a]} by ONNX shape inference but "
                    f"{int(np.float32(s) * np.float32(in_shape[a]))} in onnxruntime; give sizes instead of scales"
                )
    elif size_values:
        if len(size_values) != len(ax):
            raise Unsupported("sizes length")
        for a in ax:
            per_axis_scale[a] = np.float32(out_shape[a]) / np.float32(in_shape[a])
    else:
        raise Unsupported("neither scales nor sizes")
    if tuple(out_shape) == in_shape:
        return X  # onnxruntime copies the input whenever the shape does not change
    y = X
    for a in range(rank):
        size, out, scale = in_shape[a], out_shape[a], per_axis_scale[a]
        if size == out and scale == 1.0:
            continue
        coords = _source_coords(coord_mode, out, size, scale)
        if mode == "nearest":
            rounding = ("floor" if scale >= 1 else "ceil") if nearest_mode == "simple" else nearest_mode
            idx = np.clip(_nearest(coords, rounding), 0, size - 1).astype(np.int64)
            y = _gather(ctx, y, a, idx)
            continue
        if not np.issubdtype(np.dtype(ctx.dtype(X)), np.floating):
            raise Unsupported("linear resize of integers")
        coords = np.clip(coords, np.float32(0), np.float32(size - 1))
        lo = coords.astype(np.int64)
        hi = np.minimum(lo + 1, size - 1)
        w_lo, w_hi = np.abs(coords - hi.astype(np.float32)), np.abs(coords - lo.astype(np.float32))
        same = lo == hi  # at the last element onnxruntime weighs the (equal) neighbours 0.5 each
        w_lo[same], w_hi[same] = 0.5, 0.5
        wshape = [1] * rank
        wshape[a] = out
        dtype = ctx.dtype(X)
        below = ctx.binary(Op.MUL, _gather(ctx, y, a, lo), ctx.b.const(w_lo.astype(dtype).reshape(wshape)))
        above = ctx.binary(Op.MUL, _gather(ctx, y, a, hi), ctx.b.const(w_hi.astype(dtype).reshape(wshape)))
        y = ctx.binary(Op.ADD, below, above)
    if ctx.shape(y) != tuple(out_shape):
        raise Unsupported("output shape differs from inference")
    return y
