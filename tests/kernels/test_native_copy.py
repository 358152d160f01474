"""Note [Native strided copies] (korch_rt.cc, kernels/native/copy.py): layout primitives
over one input, with scalar elementwise steps, as one native kernel.

Numbers: against the numpy interpreter (copies are bit-exact; the steps within 1e-6),
for timm's attention split (q, k^T and v of a QKV product, two scaled), a strided
slice, a broadcast, a reshape of a transposed view, and the kernel saved and loaded.
Structure: which kernel graphs qualify, the offsets and strides found, and which
kernel class builds each.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_library_backends import feeds_for, kernel_of, run_and_compare

from korch.ir import GraphBuilder, Op
from korch.kernels.native.copy import copy_spec


def _qkv_split(tokens=197, heads=3, dim=64, scaled=True):
    """deit_tiny's attention split: [1, T, 3 * H * D] -> q [1, H, T, D] (scaled), k^T
    [1, H, D, T] (scaled), v [1, H, T, D]."""
    b = GraphBuilder()
    x = b.input("qkv", (1, tokens, 3 * heads * dim), "float32")
    t = b.transpose(b.reshape(x, (1, tokens, 3, heads, dim)), (2, 0, 3, 1, 4))
    parts = []
    for i in range(3):
        p = b.add(Op.SLICE, [t], starts=(i, 0, 0, 0, 0), steps=(1,) * 5, lengths=(1, 1, heads, tokens, dim))
        parts.append(b.reshape(p, (1, heads, tokens, dim)))
    q, k, v = parts
    k = b.transpose(k, (0, 1, 3, 2))
    if scaled:
        q = b.binary(Op.MUL, q, b.scalar(0.35, q))
        k = b.binary(Op.MUL, k, b.scalar(0.35, k))
    for name, y in (("q", q), ("k", k), ("v", v)):
        b.output(name, y)
    return b.graph


def _slice_exp():
    """Every other column of a transposed matrix, then 1 - exp: a strided slice and a
    scalar on the left."""
    b = GraphBuilder()
    x = b.input("x", (40, 30), "float32")
    t = b.transpose(x, (1, 0))
    s = b.add(Op.SLICE, [t], starts=(3, 1), steps=(2, 2), lengths=(10, 19))
    b.output("y", b.binary(Op.SUB, b.scalar(1.0, s), b.unary(Op.EXP, s)))
    return b.graph


def _broadcast_row():
    """A row broadcast over a slice's rows (a broadcast alone is TVM's alone)."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 48), "float32")
    s = b.add(Op.SLICE, [x], starts=(0, 1, 0), steps=(1, 1, 1), lengths=(1, 1, 48))
    b.output("y", b.binary(Op.MAX, b.add(Op.BROADCAST, [s], shape=(2, 33, 48)), b.scalar(0.0, x)))
    return b.graph


def _batched_transpose_scaled():
    """Note [Transposed copies]: rows of 21 adjacent floats per image (not merged across
    images), columns 21 apart, 50 of them: partial groups of rows and of columns."""
    b = GraphBuilder()
    x = b.input("x", (2, 50, 21), "float32")
    t = b.transpose(x, (0, 2, 1))
    b.output("y", b.binary(Op.MUL, t, b.scalar(-1.5, t)))
    return b.graph


def _reshape_of_transpose():
    """A reshape that merges a transposed view's axes stays affine when the merged axes
    are adjacent in the input as well; then divided by a scalar."""
    b = GraphBuilder()
    x = b.input("x", (2, 5, 6, 7), "float32")
    y = b.reshape(b.transpose(x, (1, 0, 2, 3)), (5, 2, 42))
    b.output("y", b.binary(Op.DIV, y, b.scalar(3.0, y)))
    return b.graph


@pytest.mark.parametrize(
    "make",
    [_qkv_split, _slice_exp, _broadcast_row, _reshape_of_transpose, _batched_transpose_scaled],
    ids=["qkv", "slice_exp", "bcast", "merge", "transposed"],
)
def test_copies_match_numpy(make, tmp_path):
    kg, consts = kernel_of(make())
    assert copy_spec(kg) is not None
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path, rtol=1e-6, atol=1e-6)
    assert type(k).__name__ == "NativeCopyKernel"


def test_the_split_as_offsets_and_strides():
    kg, _ = kernel_of(_qkv_split(tokens=5, heads=2, dim=4))
    spec = copy_spec(kg)
    q, k, v = sorted(spec.outs, key=lambda o: o.offset)  # the kernel's outputs are in node order
    row = 3 * 2 * 4  # a token's QKV row
    assert (q.shape, q.offset, q.strides) == ((1, 2, 5, 4), 0, (0, 4, row, 1))
    assert (k.shape, k.offset, k.strides) == ((1, 2, 4, 5), 8, (0, 4, 1, row))
    assert (v.shape, v.offset, v.strides) == ((1, 2, 5, 4), 16, (0, 4, row, 1))
    assert q.steps == ((3, 1, float(np.float32(0.35))),) and v.steps == ()


def test_what_qualifies():
    # a reshape alone moves nothing: a view (Note [Views in a segment])
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    b.output("y", b.binary(Op.MUL, b.reshape(x, (24,)), b.scalar(2.0, b.reshape(x, (24,)))))
    assert copy_spec(kernel_of(b.graph)[0]) is None
    # a broadcast alone (a bias over rows) is TVM's alone
    b = GraphBuilder()
    b.output("y", b.add(Op.BROADCAST, [b.input("x", (1, 6), "float32")], shape=(4, 6)))
    assert copy_spec(kernel_of(b.graph)[0]) is None
    # a tensor operand is no scalar step
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    t = b.transpose(x, (1, 0))
    b.output("y", b.binary(Op.MUL, t, b.input("w", (6, 4), "float32")))
    assert copy_spec(kernel_of(b.graph)[0]) is None
    # a transpose a bare transpose kernel takes is built as one
    b = GraphBuilder()
    b.output("y", b.transpose(b.input("x", (40, 24), "float32"), (1, 0)))
    kg, consts = kernel_of(b.graph)
    from korch.kernels.registry import get_backend

    assert type(get_backend("native").build(kg, consts, 1)).__name__ == "NativeTransposeKernel"


def test_a_reshape_that_copies_is_refused():
    """reshape(transpose(x)) merging axes that are not adjacent in x is not one stride."""
    b = GraphBuilder()
    x = b.input("x", (3, 4, 5), "float32")
    b.output("y", b.reshape(b.transpose(x, (0, 2, 1)), (3, 20)))
    kg, _ = kernel_of(b.graph)
    assert copy_spec(kg) is None
