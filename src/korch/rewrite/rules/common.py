"""Small builders the replacements share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from korch.ir.graph import GraphBuilder
from korch.ir.ops import Op


def slice_axis(b: GraphBuilder, x: int, axis: int, start: int, length: int) -> int:
    """``x[..., start:start+length, ...]`` along ``axis``."""
    shape = b.shape(x)
    rank = len(shape)
    axis %= rank
    starts = tuple(start if i == axis else 0 for i in range(rank))
    lengths = tuple(length if i == axis else d for i, d in enumerate(shape))
    return b.add(Op.SLICE, [x], starts=starts, steps=(1,) * rank, lengths=lengths)


def bconst(b: GraphBuilder, value: np.ndarray, shape: Sequence[int], dtype: str) -> int:
    """A constant of ``value`` (same rank as ``shape``, or size 1) broadcast to ``shape``."""
    value = np.asarray(value)
    if value.size == 1:
        return b.const(np.array(value.reshape(()), dtype=dtype))
    return b.broadcast_to(b.const(value.astype(dtype)), shape)


def scalar(b: GraphBuilder, value, dtype: str) -> int:
    return b.const(np.array(value, dtype=dtype))


def channel_shape(rank: int, axis: int, n: int) -> tuple[int, ...]:
    axis %= rank
    return tuple(n if i == axis else 1 for i in range(rank))
