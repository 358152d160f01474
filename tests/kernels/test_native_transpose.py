"""Note [Native transpose] (korch_rt.cc, kernels/native/transpose.py): a TRANSPOSE
between RESHAPEs as one native kernel.

Numbers: bit-exact against numpy (a transpose moves floats), over shapes whose sides
are not multiples of the 16 x 16 register block (masked rows and columns), batched,
with rows of several floats, merged axes, size-1 axes, a reshape on either side, and
the kernel saved and loaded. Structure: which permutations qualify, and the
(B, M, N, C) each reduces to.
"""

from __future__ import annotations

import pytest
from test_library_backends import feeds_for, kernel_of, run_and_compare

from korch.ir import GraphBuilder, Op
from korch.kernels.native.transpose import merged_transpose, transpose_spec


def _transpose(shape, perm, before=None, after=None):
    """x (``before``: reshaped from it), transposed by ``perm`` (``after``: reshaped to it)."""
    b = GraphBuilder()
    x = b.input("x", before or shape, "float32")
    if before:
        x = b.reshape(x, shape)
    y = b.transpose(x, perm)
    if after:
        y = b.reshape(y, after)
    b.output("y", y)
    return b.graph


@pytest.mark.parametrize(
    "shape,perm,before,after",
    [
        ((1, 16384, 128), (0, 2, 1), None, None),  # segformer's tokens -> channels
        ((1, 128, 16384), (0, 2, 1), None, (1, 128, 128, 128)),
        ((33, 47), (1, 0), None, None),  # ragged both ways
        ((3, 20, 5), (0, 2, 1), None, None),  # batched, narrower than a block
        ((2, 7, 300, 3), (0, 2, 1, 3), None, None),  # rows of three floats
        ((1, 197, 3, 64), (0, 2, 1, 3), None, None),  # attention heads
        ((2, 4, 6, 8), (0, 3, 1, 2), None, None),  # merges to (0, 2, 1)
        ((1, 1, 40, 1, 24), (0, 4, 2, 3, 1), None, None),  # size-1 axes
        ((1, 64, 64, 32), (0, 3, 1, 2), (1, 4096, 32), None),  # a reshape before
    ],
    ids=["seg_in", "seg_out", "ragged", "batched", "row3", "heads", "merged", "unit_axes", "reshape_before"],
)
def test_transpose_matches_numpy(shape, perm, before, after, tmp_path):
    kg, consts = kernel_of(_transpose(shape, perm, before, after))
    assert transpose_spec(kg) is not None
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path, rtol=0.0, atol=0.0)
    assert type(k).__name__ == "NativeTransposeKernel"


def test_what_qualifies():
    assert merged_transpose((4, 5), (1, 0)) == (1, 4, 5, 1)
    assert merged_transpose((2, 4, 6, 8), (0, 3, 1, 2)) == (2, 24, 8, 1)
    assert merged_transpose((2, 3, 4, 5), (0, 2, 1, 3)) == (2, 3, 4, 5)
    assert merged_transpose((3, 4, 5), (1, 0, 2)) == (1, 3, 4, 5)
    assert merged_transpose((1, 9, 1, 7), (2, 3, 0, 1)) == (1, 9, 7, 1)
    assert merged_transpose((2, 3, 4), (2, 1, 0)) is None  # a reversal is no batch of transposes
    assert merged_transpose((2, 3, 4), (0, 1, 2)) is None  # the identity moves nothing
    # something besides the transpose and reshapes is computed
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    b.output("y", b.unary(Op.EXP, b.transpose(x, (1, 0))))
    kg, _ = kernel_of(b.graph)
    assert transpose_spec(kg) is None


def test_a_transpose_kernel_is_measured_on_both_generators():
    """A memory kernel the native runtime runs is measured beside TVM's (korch.pipeline
    ``_backends_for``): the faster of the two is the candidate's cost."""
    from korch.ir.subgraph import KernelKind
    from korch.pipeline import _backends_for

    kg, _ = kernel_of(_transpose((1, 64, 48), (0, 2, 1)))
    assert _backends_for(KernelKind.MEMORY, kg, "cpu", native=True) == ("tvm", "native")
    assert _backends_for(KernelKind.MEMORY, kg, "cpu", native=False) == ("tvm",)
