"""Pooling as PAD + WINDOW + reduce.

WINDOW turns [N, C, H, W] into [N, C, OH, OW, KH, KW] (every window's elements on
trailing axes, floor output sizes); a REDUCE over the trailing axes and a RESHAPE
finish the pool. ``ceil_mode`` is floor mode on a wider padding: the extra elements
are -inf for MaxPool and excluded from AveragePool's divisor (as onnxruntime does,
the divisor only counts what lies inside the padded input).
"""

from __future__ import annotations

import math

import numpy as np

from korch.errors import ModelError
from korch.fission.linear import spatial_pads
from korch.fission.registry import Ctx, Unsupported, rule
from korch.ir import Op


@rule
def GlobalAveragePool(ctx: Ctx, X):
    return ctx.mean(X, list(range(2, ctx.rank(X))))


@rule
def GlobalMaxPool(ctx: Ctx, X):
    return ctx.b.reduce(Op.REDUCE_MAX, X, list(range(2, ctx.rank(X))))


class _Geometry:
    """Pads and output sizes of one pooling node (static shapes)."""

    def __init__(self, ctx: Ctx, x: int, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
        shape = ctx.shape(x)
        self.nsp = nsp = len(kernel_shape)
        if nsp < 1 or len(shape) != nsp + 2:
            raise Unsupported("pooling needs N, C and the kernel's spatial dims")
        self.kernel = list(kernel_shape)
        self.strides = list(strides or [1] * nsp)
        self.dil = list(dilations or [1] * nsp)
        self.in_sizes = list(shape[2:])
        p = spatial_pads(self.in_sizes, self.kernel, self.strides, self.dil, auto_pad, pads)
        self.begin, self.end = p[:nsp], p[nsp:]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            for d, k, s, dl in zip(self.in_sizes, self.kernel, self.strides, self.dil):
                # onnxruntime pads (ceil(d / s) - 1) * s + k - d: it ignores dilation and may go negative
                if dl != 1 or (-(-d // s) - 1) * s + k - d < 0:
                    raise Unsupported("onnxruntime pads this SAME pooling its own way")
        # the output sizes onnx shape inference gave (floor or ceil mode alike)
        self.out_sizes = list(ctx.out_shape()[2:])
        if ceil_mode:
            self._check_ceil_sizes()
        self.extra = []
        for i in range(nsp):
            span = (self.out_sizes[i] - 1) * self.strides[i] + (self.kernel[i] - 1) * self.dil[i] + 1
            padded = self.in_sizes[i] + self.begin[i] + self.end[i]
            if span < padded - self.strides[i] + 1 or self.out_sizes[i] < 1:
                raise Unsupported("output size does not match the pooling geometry")
            self.extra.append(max(0, span - padded))

    def _check_ceil_sizes(self) -> None:
        """onnxruntime drops a last window that would start in the end padding; ONNX
        shape inference does not. Where they disagree the model has no one meaning."""
        for i in range(self.nsp):
            span = self.in_sizes[i] + self.begin[i] + self.end[i] - (self.kernel[i] - 1) * self.dil[i] - 1
            out = -(-span // self.strides[i]) + 1
            if (out - 1) * self.strides[i] >= self.in_sizes[i] + self.begin[i]:
                out -= 1
            if out != self.out_sizes[i]:
                raise ModelError(
                    f"ceil_mode output size on spatial axis {i} is {self.out_sizes[i]} by ONNX shape inference "
                    f"but {out} in onnxruntime"
                )

    def window(self, ctx: Ctx, x: int, pad_value: float) -> int:
        """PAD (explicit + ceil-mode pads) then WINDOW."""
        pad_pairs = [(0, 0), (0, 0)] + [(b, e + x_) for b, e, x_ in zip(self.begin, self.end, self.extra)]
        if any(b or e for b, e in pad_pairs):
            value = np.array(pad_value, dtype=ctx.dtype(x)).item()
            x = ctx.b.add(Op.PAD, [x], pads=pad_pairs, mode="constant", value=value)
        return ctx.b.add(Op.WINDOW, [x], kernel=self.kernel, strides=self.strides, dilations=self.dil)

    def reduce(self, ctx: Ctx, op: Op, windows: int) -> int:
        rank = ctx.rank(windows)
        y = ctx.b.reduce(op, windows, list(range(rank - self.nsp, rank)))
        return ctx.b.reshape(y, ctx.shape(y)[: rank - self.nsp])

    def counts(self, count_include_pad: int) -> np.ndarray:
        """How many elements each window averages: [*out_sizes]."""
        ones = np.ones(self.in_sizes, dtype=np.float64)
        pads = list(zip(self.begin, self.end))
        if count_include_pad:
            ones = np.pad(ones, pads, constant_values=1.0)
            pads = [(0, 0)] * self.nsp
        ones = np.pad(ones, [(b, e + x) for (b, e), x in zip(pads, self.extra)])
        total = np.zeros(self.out_sizes, dtype=np.float64)
        for kidx in np.ndindex(*self.kernel):
            sl = tuple(
                slice(k * d, k * d + (o - 1) * s + 1, s)
                for k, d, o, s in zip(kidx, self.dil, self.out_sizes, self.strides)
            )
            total += ones[sl]
        return total


def _float_input(ctx: Ctx, x: int) -> None:
    if not np.issubdtype(np.dtype(ctx.dtype(x)), np.floating):
        raise Unsupported(f"dtype {ctx.dtype(x)}")


@rule
def AveragePool(
    ctx: Ctx,
    X,
    *,
    kernel_shape,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    pads=None,
    strides=None,
):
    _float_input(ctx, X)
    geo = _Geometry(ctx, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    total = geo.reduce(ctx, Op.REDUCE_SUM, geo.window(ctx, X, 0.0))
    counts = geo.counts(count_include_pad)
    if counts.min() <= 0:
        raise Unsupported("a window lies entirely in padding")
    if np.all(counts == counts.flat[0]):
        return ctx.binary(Op.DIV, total, ctx.scalar(float(counts.flat[0]), total))
    divisor = ctx.b.const(counts.astype(ctx.dtype(X)).reshape((1, 1) + counts.shape))
    return ctx.binary(Op.DIV, total, divisor)


@rule
def MaxPool(
    ctx: Ctx,
    X,
    *,
    kernel_shape,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    pads=None,
    storage_order=0,
    strides=None,
):
    """The Indices output is not computed (it stays opaque if a model reads it)."""
    dtype = np.dtype(ctx.dtype(X))
    lowest = -math.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min
    geo = _Geometry(ctx, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return geo.reduce(ctx, Op.REDUCE_MAX, geo.window(ctx, X, lowest)), None
