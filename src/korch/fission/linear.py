"""Linear transformations: MATMUL and CONV primitives plus their epilogues.

Gemm's alpha/beta/C and Conv's bias are split off as elementwise primitives, so the
linear primitive itself stays a plain product (see Note [Primitive classes]).
"""

from __future__ import annotations

from collections.abc import Sequence

from korch.fission.registry import Ctx, Unsupported, rule
from korch.ir import Op


@rule
def Gemm(ctx: Ctx, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    a = ctx.transpose(A, [1, 0]) if transA else A
    b = ctx.transpose(B, [1, 0]) if transB else B  # a constant weight is transposed now
    y = ctx.mul_const(ctx.b.add(Op.MATMUL, [a, b]), alpha)
    if C is None or beta == 0.0:
        return y
    c_value = ctx.const(C)
    if beta == 1.0:
        c = C
    elif c_value is not None:
        c = ctx.b.const((c_value * beta).astype(c_value.dtype))
    else:
        c = ctx.mul_const(C, beta)
    y = ctx.binary(Op.ADD, y, c)
    if ctx.shape(y) != ctx.out_shape():
        raise Unsupported("C must broadcast to [M, N]")
    return y


@rule
def MatMul(ctx: Ctx, A, B):
    """numpy matmul: 1-D operands gain and lose a unit dim; batch dims broadcast.

    The MATMUL primitive takes B as [K, N] or with exactly A's batch dims, so a B
    without real batch dims is reshaped to 2-D and otherwise both sides broadcast.
    """
    a_shape, b_shape = ctx.shape(A), ctx.shape(B)
    if not a_shape or not b_shape:
        raise Unsupported("MatMul of a scalar")
    a = ctx.reshape(A, (1,) + a_shape) if len(a_shape) == 1 else A
    b = ctx.reshape(B, b_shape + (1,)) if len(b_shape) == 1 else B
    (m, k), (k2, n) = ctx.shape(a)[-2:], ctx.shape(b)[-2:]
    if k != k2:
        raise Unsupported("inner dimensions differ")
    a_batch, b_batch = ctx.shape(a)[:-2], ctx.shape(b)[:-2]
    batch = _broadcast(a_batch, b_batch)
    if all(d == 1 for d in b_batch):
        b = ctx.reshape(b, (k, n))
        a = ctx.b.broadcast_to(a, batch + (m, k))
    else:
        a = ctx.b.broadcast_to(a, batch + (m, k))
        b = ctx.b.broadcast_to(b, batch + (k, n))
    y = ctx.b.add(Op.MATMUL, [a, b])
    out = list(batch)
    if len(a_shape) > 1:
        out.append(m)
    if len(b_shape) > 1:
        out.append(n)
    return ctx.reshape(y, out)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    import numpy as np

    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise Unsupported(f"batch dims {a} and {b} do not broadcast") from None


def spatial_pads(
    in_sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str,
    pads: Sequence[int] | None,
) -> list[int]:
    """ONNX pads (begins..., ends...) after resolving ``auto_pad`` (Conv and pooling)."""
    nsp = len(in_sizes)
    if auto_pad in ("NOTSET", ""):
        return list(pads) if pads else [0] * (2 * nsp)
    if auto_pad == "VALID":
        return [0] * (2 * nsp)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad {auto_pad!r}")
    begins, ends = [], []
    for d, k, s, dl in zip(in_sizes, kernel, strides, dilations):
        out = -(-d // s)
        total = max(0, (out - 1) * s + (k - 1) * dl + 1 - d)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


@rule
def Conv(
    ctx: Ctx, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None
):
    x_shape, w_shape = ctx.shape(X), ctx.shape(W)
    nsp = len(x_shape) - 2
    if nsp < 1 or len(w_shape) != nsp + 2:
        raise Unsupported("Conv needs N, C and at least one spatial dim")
    if kernel_shape is not None and list(kernel_shape) != list(w_shape[2:]):
        raise Unsupported("kernel_shape differs from the weight")
    dil = list(dilations or [1] * nsp)
    st = list(strides or [1] * nsp)
    p = spatial_pads(x_shape[2:], w_shape[2:], st, dil, auto_pad, pads)
    y = ctx.b.add(Op.CONV, [X, W], strides=st, dilations=dil, pads=p, group=group)
    if B is None:
        return y
    return ctx.binary(Op.ADD, y, ctx.reshape(B, (1, w_shape[0]) + (1,) * nsp))
