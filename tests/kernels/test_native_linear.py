"""The native linear backend on shapes large enough to split over threads (the small
cases run in tests/kernels/test_library_backends.py with every linear backend)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_library_backends import conv_graph, feeds_for, kernel_of, matmul_graph, randn, run_and_compare

from korch.ir import GraphBuilder, Op, evaluate
from korch.kernels.native.linear import CODE_VERSION, Unsupported, encode, plan_of


@pytest.mark.parametrize(
    "case",
    [
        dict(a_shape=(64, 96), b_shape=(96, 80), bias=True, relu=True),  # rows split
        dict(a_shape=(1, 256), b_shape=(256, 300), bias=True),  # M = 1: columns split
        dict(a_shape=(4, 2, 33, 40), b_shape=(4, 2, 40, 50), const_b=False),  # batch >= threads
        dict(a_shape=(2, 3, 33, 40), b_shape=(40, 50)),  # shared weights, batch broadcast
    ],
    ids=["rows", "columns", "batched", "broadcast_b"],
)
def test_matmul_split(case, tmp_path):
    kg, consts = kernel_of(matmul_graph(**case))
    run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)


@pytest.mark.parametrize(
    "case",
    [
        dict(x_shape=(1, 16, 30, 30), w_shape=(24, 16, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=1, bias=True),
        dict(x_shape=(2, 32, 20, 20), w_shape=(64, 32, 1, 1), strides=(1, 1), pads=(0, 0, 0, 0), group=1, relu=True),
        dict(x_shape=(1, 48, 33, 31), w_shape=(48, 1, 5, 5), strides=(2, 2), pads=(2, 2, 2, 2), group=48, bias=True),
        dict(x_shape=(1, 32, 17, 19), w_shape=(32, 8, 3, 3), strides=(1, 2), pads=(0, 1, 2, 1), group=4, dil=(2, 1)),
        # rows narrower than the kernel: no column has all three taps inside
        dict(x_shape=(2, 6, 5, 2), w_shape=(6, 1, 3, 3), strides=(1, 1), pads=(1, 2, 0, 1), group=6, bias=True),
        # KK = 40 * 9 > KC: the panel-packed conv accumulates over two K blocks; 21 columns:
        # one full 16-pixel panel and one of 5 (Note [Panel-packed convolution])
        dict(x_shape=(1, 40, 12, 21), w_shape=(20, 40, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=1, relu=True),
        # rows with all three kernel rows inside summed in registers, the border rows tap by tap
        dict(x_shape=(1, 24, 19, 21), w_shape=(24, 1, 3, 3), strides=(2, 1), pads=(1, 1, 1, 1), group=24, bias=True),
        # Note [Channel-blocked depthwise]: rows dilated, 7 wide (not a multiple of 8), asymmetric pads
        dict(x_shape=(1, 8, 15, 7), w_shape=(8, 1, 3, 5), strides=(1, 1), pads=(2, 1, 0, 3), group=8, dil=(2, 1)),
        # column strides 2 and 3: phase planes, asymmetric pads, odd widths
        dict(x_shape=(1, 16, 23, 29), w_shape=(16, 1, 3, 3), strides=(2, 2), pads=(0, 1, 1, 0), group=16),
        dict(x_shape=(1, 8, 10, 26), w_shape=(8, 1, 3, 4), strides=(1, 3), pads=(1, 2, 1, 1), group=8, bias=True),
        # Note [Pointwise convolution rows]: two groups, K = 300 > KC (two K blocks), 49
        # pixels (three tiles of 16 and one of 1), 15 channels a group (tiles of 6, 6, 3)
        dict(x_shape=(2, 600, 7, 7), w_shape=(30, 300, 1, 1), strides=(1, 1), pads=(0, 0, 0, 0), group=2, bias=True),
        # Note [Channel-blocked depthwise]: two images, 12 channels (a block of 8 and one
        # of 4), 130 rows cut into bands
        dict(x_shape=(2, 12, 130, 90), w_shape=(12, 1, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=12, bias=True),
        # 81 taps: past the blocked kernel's 64, the scalar rows
        dict(x_shape=(1, 8, 12, 12), w_shape=(8, 1, 9, 9), strides=(1, 1), pads=(4, 4, 4, 4), group=8),
        # Note [Few-pixel pointwise]: one pixel in two groups (a GEMV each), and 3 x 3
        dict(x_shape=(2, 64, 1, 1), w_shape=(40, 32, 1, 1), strides=(1, 1), pads=(0, 0, 0, 0), group=2, bias=True),
        dict(x_shape=(1, 48, 3, 3), w_shape=(100, 48, 1, 1), strides=(1, 1), pads=(0, 0, 0, 0), group=1, relu=True),
        # Note [Direct convolution bands] / [Wide tiles]: two images, K = 576 > KC, three
        # panels (a pair and one alone), 7-pixel rows; 8 channels a group over 50-pixel
        # rows (five tiles of 10 where tiles are wide), rows strided
        dict(x_shape=(2, 64, 9, 7), w_shape=(48, 64, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=1, bias=True),
        dict(x_shape=(1, 32, 11, 50), w_shape=(32, 8, 3, 3), strides=(2, 1), pads=(1, 1, 1, 1), group=4, relu=True),
        # Note [Four-panel tiles]: 128 channels out (two groups of four panels), 13-pixel
        # rows in tiles of 7 and 6, K = 360 in three blocks of 128, two images; two groups
        # of 64 channels, stride 2, 15-pixel rows in three tiles of 5
        dict(x_shape=(2, 40, 14, 13), w_shape=(128, 40, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=1, relu=True),
        dict(x_shape=(1, 128, 15, 30), w_shape=(128, 64, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=2, bias=True),
        # Note [Four-panel tiles] on rows over 28 pixels: stride 2 onto 45-pixel rows (tiles
        # of 7 and 6); a 7x7 stem, 3 -> 64 channels, two images, 35-pixel rows
        dict(x_shape=(1, 16, 24, 90), w_shape=(64, 16, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=1, relu=True),
        dict(x_shape=(2, 3, 30, 70), w_shape=(64, 3, 7, 7), strides=(2, 2), pads=(3, 3, 3, 3), group=1, bias=True),
        # stride 2 as a constant of the wide tile: 48 channels (a pair of panels and one)
        dict(x_shape=(1, 16, 31, 40), w_shape=(48, 16, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=1, relu=True),
        # a stem: 3 channels in, one panel out, padded band by band inside the tasks
        dict(x_shape=(1, 3, 40, 50), w_shape=(16, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=1, bias=True),
        # regnety's 7x7 stage: 8 channels a group, one band a group, padded inside each
        # group's task (two images)
        dict(x_shape=(2, 48, 7, 7), w_shape=(48, 8, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=6, bias=True),
        # Note [Row depthwise]: 150 columns (a chunk of eight vectors, one of two, the last
        # masked), three planes cut into bands; stride 2 with 5 x 5 taps, asymmetric pads,
        # an odd width; 7 tap rows with dilated columns, two images
        dict(x_shape=(1, 3, 40, 150), w_shape=(3, 1, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=3, relu=True),
        dict(x_shape=(1, 5, 21, 61), w_shape=(5, 1, 5, 5), strides=(2, 2), pads=(2, 1, 2, 2), group=5, bias=True),
        dict(x_shape=(2, 4, 12, 40), w_shape=(4, 1, 7, 3), strides=(1, 1), pads=(3, 2, 3, 2), group=4, dil=(1, 2)),
        # Note [Row convolution]: a stem (3 channels in, 20 out: blocks of 8, 8 and 4),
        # stride 2; two groups of 8 channels over 45 columns (a pair of vectors and one),
        # asymmetric pads, two images; dilated columns, 3 channels a group
        dict(x_shape=(1, 3, 40, 64), w_shape=(20, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=1, bias=True),
        dict(x_shape=(2, 16, 9, 45), w_shape=(16, 8, 3, 3), strides=(1, 1), pads=(0, 1, 2, 1), group=2, relu=True),
        dict(x_shape=(1, 4, 10, 40), w_shape=(6, 2, 3, 3), strides=(1, 1), pads=(1, 2, 1, 2), group=2, dil=(1, 2)),
        # Note [Row pairs]: rows of one vector, two a tile: stride 2 onto 7 x 7 (three
        # pairs and one row), 4 channels a group; 15-column rows, asymmetric pads, two images
        dict(x_shape=(1, 24, 13, 13), w_shape=(12, 8, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=3, relu=True),
        dict(x_shape=(2, 16, 14, 14), w_shape=(16, 8, 3, 3), strides=(1, 1), pads=(1, 0, 1, 2), group=2, bias=True),
        # Note [Winograd convolution]: two images of odd height and width (a last tile
        # half outside), 20 channels in, 30 out (five panels); 150 columns, 75 tiles a
        # row (blocks of 64 and 11 tiles), asymmetric pads; 300 channels in (two K
        # blocks) and 200 out (blocks of channels)
        dict(x_shape=(2, 20, 57, 45), w_shape=(30, 20, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=1, relu=True),
        dict(x_shape=(1, 16, 14, 150), w_shape=(16, 16, 3, 3), strides=(1, 1), pads=(0, 1, 2, 1), group=1, bias=True),
        dict(x_shape=(1, 300, 14, 14), w_shape=(200, 300, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=1, bias=True),
        # Note [Strided pointwise]: two images of odd height and width at stride 2 (8 x 9
        # pixels read); strides 1 and 2
        dict(x_shape=(2, 24, 15, 17), w_shape=(40, 24, 1, 1), strides=(2, 2), pads=(0, 0, 0, 0), group=1, relu=True),
        dict(x_shape=(1, 16, 6, 40), w_shape=(32, 16, 1, 1), strides=(1, 2), pads=(0, 0, 0, 0), group=1, bias=True),
    ],
    ids=[
        "3x3_bias",
        "1x1_relu",
        "depthwise_5x5_s2",
        "grouped_dilated",
        "depthwise_3x3_narrow",
        "3x3_two_k_blocks",
        "depthwise_3x3_rows",
        "depthwise_padded_dilated_rows",
        "depthwise_3x3_s2_phases",
        "depthwise_3x4_s3_phases",
        "pointwise_grouped_two_k_blocks",
        "depthwise_blocks_and_bands",
        "depthwise_81_taps",
        "few_pixels_grouped_gemv",
        "few_pixels_3x3",
        "direct_panels_and_k_blocks",
        "direct_grouped_wide_rows",
        "direct_four_panels_k_blocks",
        "direct_four_panels_groups_strided",
        "direct_four_panels_wide_rows_s2",
        "direct_four_panels_7x7_stem",
        "direct_stride_2_pair_and_one",
        "direct_stem_band_padding",
        "grouped_band_padding",
        "row_depthwise_chunks_bands",
        "row_depthwise_5x5_s2",
        "row_depthwise_7_rows_dilated_columns",
        "row_conv_stem_blocks",
        "row_conv_groups_pair_and_one",
        "row_conv_dilated_columns",
        "row_pairs_s2_odd_rows",
        "row_pairs_15_columns",
        "winograd_odd_tiles",
        "winograd_column_blocks",
        "winograd_k_and_channel_blocks",
        "strided_pointwise_odd",
        "strided_pointwise_columns",
    ],
)
def test_conv_split(case, tmp_path):
    kg, consts = kernel_of(conv_graph(**case))
    run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)


def _conv3x3_bias(b, x, ci: int, co: int) -> int:
    """A padded 3x3 conv of ``x`` (``ci`` channels) to ``co`` channels, plus a per-channel bias."""
    y = b.add(
        Op.CONV,
        [x, b.const(randn(co, ci, 3, 3), name="w")],
        strides=(1, 1),
        dilations=(1, 1),
        pads=(1, 1, 1, 1),
        group=1,
    )
    return b.binary(Op.ADD, y, b.reshape(b.const(randn(co), name="bias"), (co, 1, 1)))


_PATH_PROBE = """
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
from test_library_backends import conv_graph, feeds_for, kernel_of

from korch.kernels.registry import get_backend

kg, consts = kernel_of(conv_graph((1, 16, 20, 20), (24, 16, 3, 3), (1, 1), (1, 1, 1, 1), 1, bias=True))
feeds = feeds_for(kg, consts)
k = get_backend("native").build(kg, consts, 2)
(y,) = k([feeds[n] if n in feeds else consts[n] for n in kg.inputs])
sys.stdout.write(np.ascontiguousarray(y, dtype=np.float32).tobytes().hex())
"""


def test_winograd_is_the_path_taken():
    """Note [Winograd convolution]: a dense 3x3 conv over 400 pixels runs as Winograd,
    not the direct conv. KORCH_WINOGRAD is read once a process, so the same kernel runs
    in two processes of its own, with it on and off: the outputs round differently
    (structure) and agree within 1e-4 (numbers)."""
    if not _avx512():
        pytest.skip("Note [Winograd convolution] is AVX-512 code")

    def run(flag: str) -> np.ndarray:
        env = {**os.environ, "KORCH_WINOGRAD": flag}
        out = subprocess.run(
            [sys.executable, "-c", _PATH_PROBE, str(Path(__file__).parent)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return np.frombuffer(bytes.fromhex(out), np.float32)

    on, off = run("1"), run("0")
    assert on.size == 24 * 20 * 20 and off.size == on.size
    assert not np.array_equal(on, off)
    np.testing.assert_allclose(on, off, rtol=1e-4, atol=1e-4)


def test_residual_epilogue():
    """A full-size tensor operand (a residual add) beside a broadcast bias."""
    b = GraphBuilder()
    x = b.input("x", (1, 8, 12, 12), "float32")
    r = b.input("r", (1, 16, 12, 12), "float32")
    y = _conv3x3_bias(b, x, 8, 16)
    y = b.binary(Op.ADD, r, y)
    y = b.unary(Op.TANH, y)
    b.output("y", y)
    kg, consts = kernel_of(b.graph)
    run_and_compare("native", kg, consts, feeds_for(kg, consts))


def test_conv1d():
    b = GraphBuilder()
    x = b.input("x", (2, 6, 40), "float32")
    y = b.add(Op.CONV, [x, b.const(randn(10, 3, 3), name="w")], strides=(2,), dilations=(1,), pads=(1, 0), group=2)
    b.output("y", y)
    kg, consts = kernel_of(b.graph)
    run_and_compare("native", kg, consts, feeds_for(kg, consts))


def test_float64_is_unsupported():
    kg, _ = kernel_of(matmul_graph((4, 5), (5, 3)))
    plan = plan_of(kg)
    assert plan is not None
    code = encode(plan, [(4, 5), (5, 3)])
    assert code[0] == CODE_VERSION and code[1] == 0  # version, matmul
    import dataclasses

    with pytest.raises(Unsupported):
        encode(dataclasses.replace(plan, dtype="float64"), [(4, 5), (5, 3)])
    assert np.all(code[-1:] == 0)  # no epilogue steps


def test_outputs_along_the_chain(tmp_path):
    """GELU's shape: the kernel outputs the biased product and its half (taps)."""
    b = GraphBuilder()
    a = b.input("a", (1, 64, 48), "float32")
    y = b.add(Op.MATMUL, [a, b.const(randn(48, 40), name="w")])
    y = b.binary(Op.ADD, y, b.const(randn(40), name="bias"))
    half = b.add(Op.MUL, [y, b.scalar(0.5, y)])
    b.output("pre", y)
    b.output("half", half)
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None and plan.taps == (1, 2)
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)
    assert k.n_outputs == 2


@pytest.mark.parametrize("order", ["x_first", "sigmoid_first"])
def test_silu_reads_the_chain_value_again(order, tmp_path):
    """YOLO's conv + bias + SiLU: the chain forks at the biased value and the product
    rejoins it (Operand.chain), one kernel with no second pass."""
    b = GraphBuilder()
    x = b.input("x", (1, 12, 17, 19), "float32")
    y = _conv3x3_bias(b, x, 12, 16)
    s = b.unary(Op.SIGMOID, y)
    y = b.add(Op.MUL, [y, s] if order == "x_first" else [s, y])
    b.output("y", b.binary(Op.ADD, y, b.scalar(0.25, y)))
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None
    assert [st.op for st in plan.epilogue] == [Op.ADD, Op.SIGMOID, Op.MUL, Op.ADD]
    assert plan.epilogue[2].operand.chain == 1  # the value after the bias add
    run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)


def test_a_fork_that_does_not_rejoin_is_not_a_chain():
    """Two uses of the biased value that never meet again are two outputs' work, not an epilogue."""
    b = GraphBuilder()
    a = b.input("a", (8, 16), "float32")
    y = b.add(Op.MATMUL, [a, b.const(randn(16, 12), name="w")])
    b.output("s", b.unary(Op.SIGMOID, y))
    b.output("t", b.unary(Op.TANH, y))
    kg, _ = kernel_of(b.graph)
    assert plan_of(kg) is None


@pytest.mark.parametrize("op", [Op.EXP, Op.TANH, Op.SIGMOID, Op.ERF])
def test_vector_transcendentals_accuracy(op):
    """Note [Vector transcendentals]: the epilogue's eight-lane exp/tanh/sigmoid against
    float64 over their whole useful range (an identity MatMul passes the values through)."""
    from korch.kernels.registry import get_backend

    n = 64
    lo, hi = {Op.EXP: (-80.0, 88.0), Op.TANH: (-10.0, 10.0), Op.SIGMOID: (-30.0, 30.0), Op.ERF: (-6.0, 6.0)}[op]
    b = GraphBuilder()
    a = b.input("a", (n, n), "float32")
    b.output("y", b.unary(op, b.add(Op.MATMUL, [a, b.const(np.eye(n, dtype=np.float32), name="w")])))
    kg, consts = kernel_of(b.graph)
    x = np.linspace(lo, hi, n * n, dtype=np.float32).reshape(n, n)
    args = [x if name not in consts else consts[name] for name in kg.inputs]
    got = get_backend("native").build(kg, consts, 1)(args)[0].astype(np.float64)
    x64 = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    want = {Op.EXP: np.exp, Op.TANH: np.tanh, Op.SIGMOID: lambda v: 1 / (1 + np.exp(-v)), Op.ERF: erf}[op](x64)
    if op is Op.EXP:
        np.testing.assert_allclose(got, want, rtol=3e-7)
    else:
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_gelu_is_one_chain(tmp_path):
    """BERT's and Segformer's MatMul + bias + GELU (erf form) as one native kernel."""
    b = GraphBuilder()
    a = b.input("a", (1, 40, 48), "float32")
    y = b.add(Op.MATMUL, [a, b.const(randn(48, 72), name="w")])
    y = b.binary(Op.ADD, y, b.const(randn(72), name="bias"))
    g = b.add(Op.ERF, [b.binary(Op.DIV, y, b.scalar(math.sqrt(2.0), y))])
    g = b.add(Op.MUL, [y, b.binary(Op.ADD, g, b.scalar(1.0, y))])
    b.output("y", b.binary(Op.MUL, g, b.scalar(0.5, y)))
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None
    assert [st.op for st in plan.epilogue] == [Op.ADD, Op.DIV, Op.ERF, Op.ADD, Op.MUL, Op.MUL]
    run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)


@pytest.mark.parametrize(
    "operand", [(1, 16, 1, 1), (1, 1, 36, 50), (1, 16, 1, 50), (1, 16, 36, 50)], ids=["bias", "plane", "row", "full"]
)
def test_epilogue_rows(operand, tmp_path):
    """Note [Epilogue rows]: a row merges the trailing dims over which every operand is
    contiguous or constant (one 36 x 50 plane for a per-channel bias, longer than one
    1024-element chunk; the last dim alone for a [1, C, 1, W] operand), and a SiLU's
    saved value is read back chunk by chunk."""
    b = GraphBuilder()
    x = b.input("x", (1, 12, 36, 50), "float32")
    y = b.add(
        Op.CONV,
        [x, b.const(randn(16, 12, 1, 1), name="w")],
        strides=(1, 1),
        dilations=(1, 1),
        pads=(0, 0, 0, 0),
        group=1,
    )
    y = b.binary(Op.ADD, y, b.input("r", operand, "float32"))
    y = b.add(Op.MUL, [y, b.unary(Op.SIGMOID, y)])
    b.output("y", y)
    kg, consts = kernel_of(b.graph)
    assert plan_of(kg) is not None
    run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)


def _conv_bias(b, conv, x=None):
    """x (an input, or the node given) -> Conv (unit strides) -> + a per-channel bias;
    the value and its channels"""
    x = b.input("x", conv["x"], "float32") if x is None else x
    co = conv["w"][0]
    y = b.add(
        Op.CONV,
        [x, b.const(randn(*conv["w"]), name="w")],
        strides=(1, 1),
        dilations=(1, 1),
        pads=conv["pads"],
        group=conv["group"],
    )
    return b.binary(Op.ADD, y, b.reshape(b.const(randn(co), name="bias"), (co, 1, 1))), co


@pytest.mark.parametrize(
    "conv",
    [
        dict(x=(1, 24, 7, 7), w=(40, 24, 1, 1), group=1, pads=(0, 0, 0, 0)),  # Note [Flat pointwise rows]
        dict(x=(2, 16, 20, 20), w=(24, 16, 1, 1), group=1, pads=(0, 0, 0, 0)),  # Note [Wide pointwise tiles]
        dict(x=(1, 24, 15, 15), w=(24, 1, 3, 3), group=24, pads=(1, 1, 1, 1)),  # Note [Channel-blocked depthwise]
        dict(x=(1, 8, 13, 11), w=(20, 8, 3, 3), group=1, pads=(1, 1, 1, 1)),  # Note [Direct convolution]
    ],
    ids=["flat_1x1_7x7", "pointwise", "depthwise", "direct_3x3"],
)
def test_vector_epilogue(conv, tmp_path):
    """A chain with every kind of step (a per-channel bias, a residual, scalars on
    either side, a saved value read back, HardSwish's clip, a tap written as a second
    output, the unary ops) over each conv path's epilogue rows (Note [Epilogue rows]);
    the outputs against onnxruntime (1e-4)."""
    b = GraphBuilder()
    y, co = _conv_bias(b, conv)
    clip = b.binary(Op.MIN, b.binary(Op.MAX, b.binary(Op.ADD, y, b.scalar(3.0, y)), b.scalar(0.0, y)), b.scalar(6.0, y))
    y = b.binary(Op.DIV, b.add(Op.MUL, [y, clip]), b.scalar(6.0, y))  # HardSwish
    b.output("hswish", y)
    shape = (conv["x"][0], co, conv["x"][2], conv["x"][3])
    y = b.binary(Op.ADD, b.input("r", shape, "float32"), y)
    y = b.binary(Op.SUB, b.scalar(0.5, y), y)
    y = b.unary(Op.ABS, b.unary(Op.NEG, y))
    y = b.unary(Op.TANH, b.binary(Op.MUL, y, b.scalar(0.3, y)))
    b.output("y", y)
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None and len(plan.epilogue) >= 12
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)
    assert k.n_outputs == 2


def _hard_sigmoid(b, y):
    """fission's HardSigmoid (activations.py): min(max(y * 1/6 + 1/2, 0), 1)"""
    y = b.binary(Op.ADD, b.binary(Op.MUL, y, b.scalar(1.0 / 6.0, y)), b.scalar(0.5, y))
    return b.binary(Op.MIN, b.binary(Op.MAX, y, b.scalar(0.0, y)), b.scalar(1.0, y))


POST_ACTS = {
    # name: (the chain after the bias, steps in registers counting the bias)
    "none": (lambda b, y: y, 1),
    "relu": (lambda b, y: b.binary(Op.MAX, y, b.scalar(0.0, y)), 2),
    "relu6": (lambda b, y: b.binary(Op.MIN, b.binary(Op.MAX, y, b.scalar(0.0, y)), b.scalar(6.0, y)), 3),
    "hardsigmoid": (_hard_sigmoid, 5),
    "hardswish": (lambda b, y: b.add(Op.MUL, [y, _hard_sigmoid(b, y)]), 7),
    "sigmoid": (lambda b, y: b.unary(Op.SIGMOID, y), 2),
    "silu": (lambda b, y: b.add(Op.MUL, [y, b.unary(Op.SIGMOID, y)]), 4),
    # GELU as exporters write it, x * 0.5 * (1 + erf(x / sqrt 2)): bias, save, div, erf,
    # add, the gate and the 0.5 all in registers; erf alone over an affine map
    "gelu": (
        lambda b, y: b.binary(
            Op.MUL,
            b.add(
                Op.MUL,
                [y, b.binary(Op.ADD, b.unary(Op.ERF, b.binary(Op.DIV, y, b.scalar(2.0**0.5, y))), b.scalar(1.0, y))],
            ),
            b.scalar(0.5, y),
        ),
        7,
    ),
    "erf": (lambda b, y: b.unary(Op.ERF, b.binary(Op.DIV, y, b.scalar(3.0, y))), 3),
    # a gate over a tanh, which the registers do not take: only the bias goes there
    "tanh_gate": (lambda b, y: b.add(Op.MUL, [y, b.unary(Op.TANH, y)]), 1),
    # a tail the registers do not take: it runs over rows after them
    "relu_then_tanh": (lambda b, y: b.unary(Op.TANH, b.binary(Op.MAX, y, b.scalar(0.0, y))), 2),
}


@pytest.mark.parametrize("act", list(POST_ACTS))
@pytest.mark.parametrize(
    "conv",
    [
        dict(x=(1, 24, 7, 7), w=(40, 24, 1, 1), group=1, pads=(0, 0, 0, 0)),  # Note [Flat pointwise rows]
        dict(x=(2, 16, 20, 20), w=(24, 16, 1, 1), group=1, pads=(0, 0, 0, 0)),  # pointwise rows
        dict(x=(1, 300, 6, 6), w=(20, 300, 1, 1), group=1, pads=(0, 0, 0, 0)),  # K over one block (KC = 256)
        dict(x=(1, 20, 15, 15), w=(20, 1, 3, 3), group=20, pads=(1, 1, 1, 1)),  # channel-blocked depthwise
        dict(x=(1, 8, 13, 11), w=(20, 8, 3, 3), group=1, pads=(1, 1, 1, 1)),  # direct
        dict(x=(1, 16, 18, 20), w=(24, 16, 3, 3), group=1, pads=(1, 1, 1, 1)),  # Note [Winograd convolution]
    ],
    ids=["flat_1x1_7x7", "pointwise", "pointwise_k300", "depthwise", "direct_3x3", "winograd_3x3"],
)
def test_register_post_ops(conv, act, tmp_path):
    """Note [Register post-ops]: a per-channel bias and fission's ReLU, ReLU6,
    HardSigmoid, HardSwish, Sigmoid, SiLU and GELU (erf) applied to the tile in registers; how many steps go there
    (structure), and the outputs against onnxruntime (numbers, 1e-4)."""
    b = GraphBuilder()
    y, co = _conv_bias(b, conv)
    make, steps = POST_ACTS[act]
    b.output("y", make(b, y))
    kg, consts = kernel_of(b.graph)
    assert plan_of(kg) is not None
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)
    assert k.post_steps == steps


@pytest.mark.parametrize(
    "conv, in_registers",
    [
        (dict(x=(2, 16, 20, 20), w=(24, 16, 1, 1), group=1, stride=1), True),  # pointwise rows, two images
        (dict(x=(1, 300, 8, 8), w=(20, 300, 1, 1), group=1, stride=1), True),  # added on the last block of K only
        (dict(x=(2, 64, 10, 10), w=(48, 32, 1, 1), group=2, stride=1), True),  # groups: the tile's origin per group
        (dict(x=(1, 32, 28, 28), w=(40, 32, 1, 1), group=1, stride=2), True),  # Note [Strided pointwise]
        (dict(x=(1, 24, 7, 7), w=(40, 24, 1, 1), group=1, stride=1), False),  # Note [Flat pointwise rows]
        (dict(x=(1, 32, 3, 3), w=(40, 32, 1, 1), group=1, stride=1), False),  # Note [Few-pixel pointwise]
        (
            dict(x=(2, 16, 18, 21), w=(24, 16, 3, 3), group=1, stride=1),
            True,
        ),  # Note [Winograd convolution], odd columns
        (dict(x=(1, 8, 13, 11), w=(20, 8, 3, 3), group=1, stride=1), False),  # Note [Row convolution]
        (dict(x=(1, 32, 7, 7), w=(40, 32, 3, 3), group=1, stride=1), False),  # direct (under Winograd's pixels)
    ],
    ids=["pointwise", "pointwise_k300", "grouped", "strided", "flat_7x7", "few_pixels", "winograd", "rows", "direct"],
)
@pytest.mark.parametrize("residual", ["full", "broadcast"])
@pytest.mark.parametrize("order", ["add_relu", "silu_add"])
def test_residual_in_registers(conv, in_registers, residual, order, tmp_path):
    """Note [Residual in registers]: conv + bias + a tensor laid out as the output, then
    ReLU (a ResNet bottleneck's end), or SiLU then the add (YOLOv5's), against the numpy
    reference (1e-4), and whether the add went into the tile's stores with the rest
    (structure): only on conv_pointwise's
    and conv_winograd's AVX-512 paths and only for an operand with the output's own
    layout (a broadcast one stays in the rows)."""
    b = GraphBuilder()
    x = b.input("x", conv["x"], "float32")
    co, s, k = conv["w"][0], conv["stride"], conv["w"][2]
    p = k // 2
    y = b.add(
        Op.CONV,
        [x, b.const(randn(*conv["w"]), name="w")],
        strides=(s, s),
        dilations=(1, 1),
        pads=(p,) * 4,
        group=conv["group"],
    )
    y = b.binary(Op.ADD, y, b.reshape(b.const(randn(co), name="bias"), (co, 1, 1)))
    n, _, h, w = conv["x"]
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    r = b.input("r", (n, co, ho, wo) if residual == "full" else (n, co, 1, wo), "float32")
    if order == "add_relu":  # ResNet's: the sum before the activation
        y = b.binary(Op.ADD, y, r)
        b.output("y", b.binary(Op.MAX, y, b.scalar(0.0, y)))
        steps = 3 if in_registers and residual == "full" and _avx512() else 1
    else:  # YOLOv5's bottleneck: the sum after it (Post::sum_after)
        y = b.add(Op.MUL, [y, b.unary(Op.SIGMOID, y)])
        b.output("y", b.binary(Op.ADD, y, r))
        steps = 4 + (in_registers and residual == "full" and _avx512())
    kg, consts = kernel_of(b.graph)
    assert plan_of(kg) is not None
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)
    assert k.post_steps == steps


def _avx512() -> bool:
    """Whether this runtime was built with its AVX-512 paths (test_native_avx2_path runs
    these tests again with them off)."""
    from korch.kernels.native.toolchain import runtime

    return runtime().korch_wide_tiles() == 1


@pytest.mark.parametrize("act", ["none", "relu", "silu", "gelu", "tanh_gate"])
@pytest.mark.parametrize(
    "shapes",
    [((1, 64, 128), (128, 96)), ((2, 30, 40), (40, 40)), ((16, 300), (300, 72))],
    ids=["panel_pairs", "ragged_columns", "k_over_one_block"],
)
def test_matmul_register_post_ops(shapes, act, tmp_path):
    """Note [Register post-ops] on the packed AVX-512 GEMM: the bias along the last
    dimension and the activation applied to the tile (numbers against onnxruntime, 1e-4;
    structure: the steps in registers, none where the runtime has no AVX-512)."""
    a_shape, b_shape = shapes
    b = GraphBuilder()
    x = b.input("a", a_shape, "float32")
    y = b.add(Op.MATMUL, [x, b.const(randn(*b_shape), name="w")])
    y = b.binary(Op.ADD, y, b.const(randn(b_shape[-1]), name="bias"))
    make, steps = POST_ACTS[act]
    b.output("y", make(b, y))
    kg, consts = kernel_of(b.graph)
    assert plan_of(kg) is not None
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)
    assert k.post_steps == (steps if _avx512() else 0)


@pytest.mark.parametrize("act", ["relu", "silu", "hardswish", "tanh_gate"])
@pytest.mark.parametrize(
    "conv",
    [
        dict(x=(1, 40, 30, 30), w=(40, 1, 3, 3), group=40, pads=(1, 1, 1, 1)),  # 16 lanes on AVX-512
        dict(x=(2, 20, 15, 15), w=(20, 1, 5, 5), group=20, pads=(2, 2, 2, 2)),  # two images
        dict(x=(1, 8, 13, 11), w=(8, 1, 3, 3), group=8, pads=(0, 1, 2, 1)),  # ragged pads
    ],
    ids=["depthwise", "depthwise_batch2", "depthwise_pads"],
)
def test_pooled_taps(conv, act, tmp_path):
    """Note [Pooled taps]: squeeze-and-excitation's shape, a conv + bias + activation
    whose value is also averaged over each channel plane, beside the biased value's sum
    flattened as a classifier head does (a tap inside the chain): one kernel, three
    outputs, against the numpy reference (1e-4)."""
    b = GraphBuilder()
    biased, co = _conv_bias(b, conv)
    make, _ = POST_ACTS[act]
    y = make(b, biased)
    b.output("y", y)
    n, _, h, w = conv["x"]
    b.output("flat", b.reshape(b.reduce(Op.REDUCE_SUM, biased, (2, 3)), (n, co)))
    b.output("mean", b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, y, (2, 3)), b.scalar(float(h * w), y)))
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None
    assert sorted((d, plan.taps[k]) for k, d, _ in plan.pools) == [(1.0, 1), (float(h * w), len(plan.epilogue))]
    feeds = feeds_for(kg, consts)
    k = run_and_compare("native", kg, consts, feeds, tmp_path)
    assert k.n_outputs == 3
    # each plane one task: its sums in one order, the same bits every call
    args = [feeds[n] if n in feeds else consts[n] for n in kg.inputs]
    first = k(args)
    assert all(all(np.array_equal(a, b) for a, b in zip(k(args), first)) for _ in range(20))


@pytest.mark.parametrize(
    "conv",
    [
        dict(x=(1, 24, 7, 7), w=(40, 24, 1, 1), group=1, pads=(0, 0, 0, 0)),
        dict(x=(1, 32, 12, 12), w=(32, 8, 3, 3), group=4, pads=(1, 1, 1, 1)),  # grouped (RegNetY's SE)
    ],
    ids=["pointwise", "grouped"],
)
def test_pools_only_on_depthwise_convs(conv):
    """Other conv paths split a plane over tasks, whose sums would meet in any order
    (Note [Pooled taps]): the plan matches, the native backend declines it."""
    b = GraphBuilder()
    y, _ = _conv_bias(b, conv)
    b.output("y", y)
    b.output("m", b.reduce(Op.REDUCE_SUM, y, (2, 3)))
    kg, _ = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None and plan.pools
    with pytest.raises(Unsupported, match="depthwise"):
        encode(plan, [tuple(kg.nodes[i].shape) for i in kg.inputs.values()])


def test_a_pool_over_other_axes_is_not_a_tap():
    """Only a conv's two spatial axes pool into a tap; a sum over channels is other work."""
    b = GraphBuilder()
    y, _ = _conv_bias(b, dict(x=(1, 8, 9, 9), w=(8, 1, 3, 3), group=8, pads=(1, 1, 1, 1)))
    b.output("y", y)
    b.output("s", b.reduce(Op.REDUCE_SUM, y, (1,)))
    kg, _ = kernel_of(b.graph)
    assert plan_of(kg) is None


@pytest.mark.parametrize("divided", [True, False])
def test_only_pooled(divided, tmp_path):
    """A conv + bias + SiLU read only by its global average pool and the flatten after
    it (a classifier head's shape): the conv's value goes to scratch, the pool is the
    one output."""
    b = GraphBuilder()
    y, co = _conv_bias(b, dict(x=(1, 48, 7, 7), w=(48, 1, 5, 5), group=48, pads=(2, 2, 2, 2)))
    y = POST_ACTS["silu"][0](b, y)
    s = b.reduce(Op.REDUCE_SUM, y, (2, 3))
    b.output("pooled", b.reshape(b.binary(Op.DIV, s, b.scalar(49.0, s)) if divided else s, (1, co)))
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None and plan.pools == ((0, 49.0 if divided else 1.0, (1, co)),)
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)
    assert k.n_outputs == 1


@pytest.mark.parametrize(
    "case",
    [
        dict(x=(1, 144, 28, 28), w=(24, 144, 1, 1), group=1, pads=(0, 0, 0, 0)),  # the weights scaled
        dict(x=(1, 96, 7, 7), w=(160, 96, 1, 1), group=1, pads=(0, 0, 0, 0)),  # the input scaled
        dict(x=(2, 32, 10, 10), w=(24, 32, 1, 1), group=1, pads=(0, 0, 0, 0)),  # two images: the input
        dict(x=(1, 32, 12, 12), w=(32, 8, 3, 3), group=4, pads=(1, 1, 1, 1)),  # grouped 3x3: the weights
        dict(x=(1, 3, 5, 5), w=(16, 3, 1, 1), group=1, pads=(0, 0, 0, 0)),  # few pixels
        dict(x=(1, 40, 3, 3), w=(4, 40, 1, 1), group=1, pads=(0, 0, 0, 0)),  # a GEMV's panels: the weights
        dict(x=(1, 16, 30, 30), w=(16, 1, 3, 3), group=16, pads=(1, 1, 1, 1)),  # depthwise: the input
        dict(x=(1, 16, 30, 30), w=(16, 8, 3, 3), group=2, pads=(1, 1, 1, 1)),  # Note [Row convolution]: the input
        dict(x=(1, 32, 28, 28), w=(24, 32, 3, 3), group=1, pads=(1, 1, 1, 1)),  # Winograd: the weights
    ],
    ids=[
        "weights",
        "input",
        "batch2",
        "grouped",
        "few_pixels",
        "few_pixels_weights",
        "depthwise",
        "row_conv",
        "winograd",
    ],
)
def test_scaled_input(case, tmp_path):
    """Note [Scaled inputs]: squeeze-and-excitation's x * s[n, c] read by a conv with a
    bias and a residual, one kernel whichever of the weights or the input is scaled;
    against the numpy reference (1e-4), called again with other scales (the packed
    weights are scaled again each call)."""
    b = GraphBuilder()
    n, c, h, w = case["x"]
    x = b.input("x", case["x"], "float32")
    s = b.input("s", (n, c, 1, 1), "float32")
    y, co = _conv_bias(b, case, b.add(Op.MUL, [x, b.add(Op.BROADCAST, [s], shape=case["x"])]))
    b.output("y", b.binary(Op.ADD, y, b.input("r", (n, co, h, w), "float32")))
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None and plan.a_scale is not None and plan.a_shape == case["x"]
    feeds = feeds_for(kg, consts)
    k = run_and_compare("native", kg, consts, feeds, tmp_path)
    scale = next(name for name, nid in kg.inputs.items() if kg.nodes[nid].shape == (n, c, 1, 1))
    feeds[scale] = feeds[scale] * 2.5 - 1.0
    (want,) = evaluate(kg, {**feeds, **consts}).values()
    (got,) = k([feeds[name] if name in feeds else consts[name] for name in kg.inputs])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gate", ["sigmoid", "hardsigmoid"])
@pytest.mark.parametrize("hw", [28, 7], ids=["weights", "input"])
def test_scale_made_in_the_kernel(gate, hw, tmp_path):
    """Note [Scaled inputs]: the excitation's gate (a sigmoid; HardSigmoid's affine map
    and clamp) applied to the fc output inside the projection's kernel
    (``LinearPlan.a_scale_chain``), the weights or the input scaled; against the numpy
    reference (1e-4)."""
    b = GraphBuilder()
    x = b.input("x", (1, 64, hw, hw), "float32")
    fc = b.input("fc", (1, 64, 1, 1), "float32")
    s = b.unary(Op.SIGMOID, fc) if gate == "sigmoid" else _hard_sigmoid(b, fc)
    xs = b.add(Op.MUL, [x, b.add(Op.BROADCAST, [s], shape=(1, 64, hw, hw))])
    y, _ = _conv_bias(b, dict(x=(1, 64, hw, hw), w=(24, 64, 1, 1), group=1, pads=(0, 0, 0, 0)), xs)
    b.output("y", y)
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None and plan.a_scale is not None
    assert [st.op for st in plan.a_scale_chain] == (
        [Op.SIGMOID] if gate == "sigmoid" else [Op.MUL, Op.ADD, Op.MAX, Op.MIN]
    )
    run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)


@pytest.mark.parametrize(
    "case",
    [
        # candy's residual block: reflect 1, 3x3, 32 channels (the whole input copied)
        dict(x=(1, 32, 32, 32), w=(32, 32, 3, 3), group=1, pads=((1, 1), (1, 1)), mode="reflect"),
        # a stem: few planes, so each band pads its own rows; uneven pads, stride 2
        dict(x=(1, 3, 40, 36), w=(16, 3, 7, 7), group=1, pads=((3, 2), (1, 3)), mode="reflect", s=2),
        dict(x=(2, 8, 11, 13), w=(12, 4, 3, 3), group=2, pads=((2, 1), (0, 2)), mode="edge"),
        dict(x=(1, 16, 14, 14), w=(16, 1, 3, 3), group=16, pads=((1, 1), (1, 1)), mode="reflect"),  # depthwise
        dict(x=(1, 8, 10, 10), w=(8, 8, 3, 3), group=1, pads=((1, 0), (2, 1)), mode="constant", conv_pads=(1, 1, 1, 1)),
        # Note [Winograd convolution]: edge pads of two rows above, two images; reflected
        # columns at the right of a second block of tiles (140 columns: 64 + 6 tiles)
        dict(x=(2, 16, 15, 21), w=(24, 16, 3, 3), group=1, pads=((2, 1), (1, 2)), mode="edge"),
        dict(x=(1, 16, 10, 140), w=(16, 16, 3, 3), group=1, pads=((1, 1), (1, 1)), mode="reflect"),
    ],
    ids=["candy", "stem", "edge_grouped", "depthwise", "zeros_add", "winograd_edge", "winograd_reflect_blocks"],
)
def test_padded_input(case, tmp_path):
    """Note [Reflected padding]: a Pad ahead of a conv (reflect, edge, or zeros that add
    to the conv's own) is the conv's padding, one kernel with its bias and ReLU, against
    the numpy reference (1e-4); the plan's input is the unpadded tensor."""
    b = GraphBuilder()
    x = b.input("x", case["x"], "float32")
    p = b.add(Op.PAD, [x], pads=((0, 0), (0, 0), *case["pads"]), mode=case["mode"], value=0.0)
    s = case.get("s", 1)
    co = case["w"][0]
    y = b.add(
        Op.CONV,
        [p, b.const(randn(*case["w"]), name="w")],
        strides=(s, s),
        dilations=(1, 1),
        pads=case.get("conv_pads", (0, 0, 0, 0)),
        group=case["group"],
    )
    y = b.binary(Op.ADD, y, b.reshape(b.const(randn(co), name="bias"), (co, 1, 1)))
    b.output("y", b.add(Op.MAX, [y, b.scalar(0.0, y)]))
    kg, consts = kernel_of(b.graph)
    plan = plan_of(kg)
    assert plan is not None and plan.a_shape == case["x"]
    assert plan.attrs.get("pad_mode", "constant") == case["mode"]
    run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path)


def test_a_padded_input_the_conv_cannot_take():
    """A reflect pad ahead of a conv that pads too, or a pad over channels, is no plan."""
    for pads, conv_pads in (
        (((0, 0), (0, 0), (1, 1), (1, 1)), (1, 1, 1, 1)),
        (((0, 0), (1, 0), (1, 1), (1, 1)), (0,) * 4),
    ):
        b = GraphBuilder()
        x = b.input("x", (1, 4, 8, 8), "float32")
        p = b.add(Op.PAD, [x], pads=pads, mode="reflect")
        ci = 4 + pads[1][0]
        y = b.add(
            Op.CONV,
            [p, b.const(randn(4, ci, 3, 3), name="w")],
            strides=(1, 1),
            dilations=(1, 1),
            pads=conv_pads,
            group=1,
        )
        b.output("y", y)
        kg, _ = kernel_of(b.graph)
        assert plan_of(kg) is None


def test_codes_saved_before_the_pad_mode_still_load():
    """A saved executable's segment holds its kernels' codes: a version-1 conv code (no
    pad mode field) still creates a kernel, read as zero padding; against the numpy
    reference (1e-4)."""
    from korch.kernels.native.linear import NativeLinearKernel, input_shapes

    kg, consts = kernel_of(conv_graph((1, 4, 9, 9), (6, 4, 3, 3), (1, 1), (1, 1, 1, 1), 1, bias=True))
    k = NativeLinearKernel(plan_of(kg), consts, input_shapes(kg))
    code = k.code.copy()
    d = int(code[8])
    assert code[0] == 2 and code[9 + d + 16] == 0
    old = np.delete(code, 9 + d + 16)
    old[0] = 1
    k._create(np.ascontiguousarray(old))
    feeds = feeds_for(kg, consts)
    (want,) = evaluate(kg, {**feeds, **consts}).values()
    (got,) = k([feeds[name] if name in feeds else consts[name] for name in kg.inputs])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
