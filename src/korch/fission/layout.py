"""Layout operators: reshape-like, transpose, slicing, concatenation, padding, gathers.

Sizes that ONNX passes as tensors (Reshape's shape, Expand's shape, ...) are constant
after the frontend folded Shape chains; where one is not, the static output shape the
frontend inferred says the same thing.
"""

from __future__ import annotations

import math

import numpy as np

from korch.fission.registry import Ctx, Unsupported, normalize_axis, rule
from korch.ir import Op


@rule
def Transpose(ctx: Ctx, data, *, perm=None):
    rank = ctx.rank(data)
    perm = list(range(rank))[::-1] if perm is None else [normalize_axis(p, rank) for p in perm]
    return ctx.transpose(data, perm)


@rule
def Reshape(ctx: Ctx, data, shape, *, allowzero=0):
    target = ctx.const(shape)
    if target is None:
        return ctx.reshape(data, ctx.out_shape())
    dims = [int(d) for d in target.reshape(-1)]
    in_shape = ctx.shape(data)
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(dims)]
    if out.count(-1) > 1:
        raise Unsupported("more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    return ctx.reshape(data, out)


@rule
def Flatten(ctx: Ctx, input, *, axis=1):
    shape = ctx.shape(input)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise Unsupported(f"axis {axis} out of range")
    return ctx.reshape(input, (math.prod(shape[:axis]), math.prod(shape[axis:])))


@rule
def Squeeze(ctx: Ctx, data, axes=None):
    shape = ctx.shape(data)
    given = ctx.ints(axes)
    if given is None:
        drop = {i for i, d in enumerate(shape) if d == 1}
    else:
        drop = {normalize_axis(a, len(shape)) for a in given}
        if any(shape[a] != 1 for a in drop):
            raise Unsupported("squeezing a dimension that is not 1")
    return ctx.reshape(data, [d for i, d in enumerate(shape) if i not in drop])


@rule
def Unsqueeze(ctx: Ctx, data, axes=None):
    shape = list(ctx.shape(data))
    given = ctx.ints(axes)
    if given is None:
        raise Unsupported("Unsqueeze without axes")
    rank = len(shape) + len(given)
    for a in sorted(normalize_axis(a, rank) for a in given):
        shape.insert(a, 1)
    return ctx.reshape(data, shape)


@rule
def Expand(ctx: Ctx, input, shape):
    target = ctx.const(shape)
    if target is None:
        out = ctx.out_shape()
    else:
        out = tuple(np.broadcast_shapes(ctx.shape(input), tuple(int(d) for d in target.reshape(-1))))
    return ctx.b.broadcast_to(input, out)


@rule
def Tile(ctx: Ctx, input, repeats):
    """x[d0, d1] tiled (r0, r1) = broadcast x[1, d0, 1, d1] to [r0, d0, r1, d1], reshaped."""
    reps = ctx.ints(repeats)
    shape = ctx.shape(input)
    if len(reps) != len(shape):
        raise Unsupported("repeats must match the rank")
    if all(r == 1 for r in reps):
        return input
    lifted = ctx.reshape(input, [v for d in shape for v in (1, d)])
    wide = ctx.b.broadcast_to(lifted, [v for r, d in zip(reps, shape) for v in (r, d)])
    return ctx.b.reshape(wide, [r * d for r, d in zip(reps, shape)])


@rule
def Concat(ctx: Ctx, *inputs, axis):
    if not inputs:
        raise Unsupported("no inputs")
    axis = normalize_axis(axis, ctx.rank(inputs[0]))
    parts = [x for x in inputs if ctx.shape(x)[axis] > 0] or [inputs[0]]
    if len(parts) == 1:
        return parts[0]
    return ctx.b.add(Op.CONCAT, parts, axis=axis)


@rule
def Split(ctx: Ctx, input, split=None, *, axis=0, num_outputs=None):
    shape = ctx.shape(input)
    axis = normalize_axis(axis, len(shape))
    dim = shape[axis]
    sizes = ctx.ints(split)
    n_out = len(ctx.out_types)
    if not sizes:
        n = num_outputs or n_out
        chunk = -(-dim // n)  # ceil: the last chunk may be smaller (opset 18)
        sizes = [min(chunk, dim - i * chunk) for i in range(n)]
    if sum(sizes) != dim or len(sizes) != n_out or any(s < 0 for s in sizes):
        raise Unsupported(f"split sizes {sizes} do not fit dimension {dim}")
    outs, start = [], 0
    for s in sizes:
        outs.append(ctx.slice_axis(input, axis, start, s))
        start += s
    return tuple(outs)


def _slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """(first index, length) of start:end:step on an axis of size ``dim``, clamped per spec."""
    if step == 0:
        raise Unsupported("slice step 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        length = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        length = max(0, -(-(start - end) // -step))
    return (start if length else 0), length


@rule
def Slice(ctx: Ctx, data, starts, ends, axes=None, steps=None):
    """starts/ends/axes are attributes before opset 10, inputs after (with steps)."""
    shape = ctx.shape(data)
    st, en = ctx.ints(starts), ctx.ints(ends)
    ax = ctx.ints(axes) if axes is not None else list(range(len(st)))
    sp = ctx.ints(steps) if steps is not None else [1] * len(st)
    if not (len(st) == len(en) == len(ax) == len(sp)):
        raise Unsupported("starts/ends/axes/steps lengths differ")
    starts_out, steps_out, lengths = [0] * len(shape), [1] * len(shape), list(shape)
    for s, e, a, p in zip(st, en, ax, sp):
        a = normalize_axis(a, len(shape))
        starts_out[a], lengths[a] = _slice_range(shape[a], s, e, p)
        steps_out[a] = p
    if starts_out == [0] * len(shape) and steps_out == [1] * len(shape) and lengths == list(shape):
        return data
    return ctx.b.add(Op.SLICE, [data], starts=starts_out, steps=steps_out, lengths=lengths)


@rule
def Pad(ctx: Ctx, data, pads=None, constant_value=None, axes=None, *, mode="constant", value=0.0):
    """pads/value are attributes before opset 11; axes is an input from opset 18."""
    shape = ctx.shape(data)
    rank = len(shape)
    p = ctx.ints(pads)
    ax = [normalize_axis(a, rank) for a in ctx.ints(axes)] if axes is not None else list(range(rank))
    if p is None or len(p) != 2 * len(ax):
        raise Unsupported("pads must have 2 * len(axes) entries")
    before, after = [0] * rank, [0] * rank
    for i, a in enumerate(ax):
        before[a], after[a] = p[i], p[len(ax) + i]
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"mode {mode!r}")
    fill = value
    if constant_value is not None:
        cv = ctx.array(constant_value)
        fill = cv.reshape(-1)[0].item() if cv.size else 0
    # negative pads crop: a SLICE first, then the non-negative padding
    x = data
    for a in range(rank):
        if before[a] < 0 or after[a] < 0:
            lo, hi = max(0, -before[a]), max(0, -after[a])
            x = ctx.slice_axis(x, a, lo, ctx.shape(x)[a] - lo - hi)
    pad_pairs = [(max(0, b), max(0, e)) for b, e in zip(before, after)]
    if all(b == 0 and e == 0 for b, e in pad_pairs):
        return x
    attrs = {"pads": pad_pairs, "mode": mode}
    if mode == "constant":
        attrs["value"] = np.array(fill, dtype=ctx.dtype(data)).item()
    elif mode == "reflect" and any(b >= d or e >= d for (b, e), d in zip(pad_pairs, ctx.shape(x))):
        raise Unsupported("reflect padding wider than the axis")
    return ctx.b.add(Op.PAD, [x], **attrs)


@rule
def Gather(ctx: Ctx, data, indices, *, axis=0):
    idx = ctx.const(indices)
    if idx is None:
        raise Unsupported("indices are not constant")
    shape = ctx.shape(data)
    axis = normalize_axis(axis, len(shape))
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + shape[axis], idx)
    if idx.size and (idx.min() < 0 or idx.max() >= shape[axis]):
        raise Unsupported("index out of range")
    return ctx.b.add(Op.GATHER, [data], axis=axis, indices=idx.reshape(-1), indices_shape=idx.shape)


def _rank4(ctx: Ctx, x: int) -> None:
    if ctx.rank(x) != 4:
        raise Unsupported("rank must be 4")


@rule
def DepthToSpace(ctx: Ctx, input, *, blocksize, mode="DCR"):
    _rank4(ctx, input)
    n, c, h, w = ctx.shape(input)
    b = blocksize
    if mode == "DCR":
        x = ctx.reshape(input, (n, b, b, c // (b * b), h, w))
        x = ctx.transpose(x, [0, 3, 4, 1, 5, 2])
    elif mode == "CRD":
        x = ctx.reshape(input, (n, c // (b * b), b, b, h, w))
        x = ctx.transpose(x, [0, 1, 4, 2, 5, 3])
    else:
        raise Unsupported(f"mode {mode!r}")
    return ctx.reshape(x, (n, c // (b * b), h * b, w * b))


@rule
def SpaceToDepth(ctx: Ctx, input, *, blocksize, mode="DCR"):
    """The inverse of DepthToSpace; ``mode`` (opset 25) orders the channels the same way."""
    _rank4(ctx, input)
    n, c, h, w = ctx.shape(input)
    b = blocksize
    x = ctx.reshape(input, (n, c, h // b, b, w // b, b))
    if mode == "DCR":
        x = ctx.transpose(x, [0, 3, 5, 1, 2, 4])
    elif mode == "CRD":
        x = ctx.transpose(x, [0, 1, 3, 5, 2, 4])
    else:
        raise Unsupported(f"mode {mode!r}")
    return ctx.reshape(x, (n, c * b * b, h // b, w // b))


@rule
def Shape(ctx: Ctx, data, *, start=0, end=None):
    return ctx.b.const(np.array(ctx.shape(data)[start:end], dtype=np.int64))


@rule
def Size(ctx: Ctx, data):
    return ctx.b.const(np.array(math.prod(ctx.shape(data)), dtype=np.int64))
