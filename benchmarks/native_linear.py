"""korch's native linear kernels against onnxruntime's MLAS (and numpy's OpenBLAS), per op.

Each case is one candidate kernel as korch builds it (a MatMul or Conv with its
epilogue), compiled by each backend that takes it and called the way profiling calls
it (``CompiledKernel.timed``); the backends alternate in 0.1 s blocks, median of 7 blocks, us. Every output is
checked against the first backend's (1e-4). A benchmark: prints a table, never fails
on a timing.

    .venv/bin/python benchmarks/native_linear.py --threads 1 2 [--only conv1x1 ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from test_library_backends import conv_graph, feeds_for, kernel_of, matmul_graph, randn  # noqa: E402

from korch.ir import GraphBuilder, Op  # noqa: E402
from korch.kernels.registry import get_backend  # noqa: E402


def act_graph(linear: str, x_shape, w_shape, act: str, stride: int = 1, pad: int = 0):
    """A Conv (group = channels where the weight has one input channel) or MatMul, its
    bias, then ``act``: "none", "silu" (x * sigmoid(x)) or "gelu" (x * 0.5 * (1 + erf(x /
    sqrt 2))), as fission writes them: Note [Register post-ops]'s cases."""
    b = GraphBuilder()
    x = b.input("x", x_shape, "float32")
    w = b.const(randn(*w_shape), name="w")
    n = w_shape[0] if linear == "conv" else w_shape[-1]
    bias = b.const(randn(n), name="bias")
    if linear == "conv":
        group = x_shape[1] if w_shape[1] == 1 else 1
        y = b.add(Op.CONV, [x, w], strides=(stride, stride), dilations=(1, 1), pads=(pad,) * 4, group=group)
        y = b.binary(Op.ADD, y, b.reshape(bias, (n, 1, 1)))
    else:
        y = b.binary(Op.ADD, b.add(Op.MATMUL, [x, w]), bias)
    if act == "residual + relu":  # a ResNet bottleneck's last conv (1x1, stride 1)
        r = b.input("r", (x_shape[0], n, *x_shape[2:]), "float32")
        y = b.binary(Op.ADD, y, r)
        y = b.binary(Op.MAX, y, b.scalar(0.0, y))
    elif act == "silu + residual":  # YOLOv5's bottleneck: the shortcut after the activation
        r = b.input("r", (x_shape[0], n, *x_shape[2:]), "float32")
        y = b.binary(Op.ADD, b.binary(Op.MUL, y, b.add(Op.SIGMOID, [y])), r)
    elif act == "silu":
        y = b.binary(Op.MUL, y, b.add(Op.SIGMOID, [y]))
    elif act == "gelu":
        e = b.add(Op.ERF, [b.binary(Op.DIV, y, b.scalar(2.0**0.5, y))])
        y = b.binary(Op.MUL, b.binary(Op.MUL, y, b.binary(Op.ADD, e, b.scalar(1.0, e))), b.scalar(0.5, y))
    b.output("y", y)
    return b.graph


CASES = {
    "BERT mm 128x768x768 + bias + relu": lambda: matmul_graph((128, 768), (768, 768), bias=True, relu=True),
    "block mm 64x128x512 + bias": lambda: matmul_graph((1, 64, 128), (128, 512), bias=True),
    "block mm 64x512x128 + bias": lambda: matmul_graph((1, 64, 512), (512, 128), bias=True),
    "FC mm 1x512x1000": lambda: matmul_graph((1, 512), (512, 1000)),
    "conv3x3 64->64 56x56 + bias + relu": lambda: conv_graph(
        (1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), 1, bias=True, relu=True
    ),
    "conv3x3 32->32 32x32": lambda: conv_graph((1, 32, 32, 32), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "conv1x1 256->64 56x56": lambda: conv_graph((1, 256, 56, 56), (64, 256, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 64->32 32x32": lambda: conv_graph((1, 64, 32, 32), (32, 64, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "dwconv3x3 96ch 56x56": lambda: conv_graph((1, 96, 56, 56), (96, 1, 3, 3), (1, 1), (1, 1, 1, 1), 96),
    # MobileNetV3-small's (zoo): strided depthwise, the 3-channel stem
    "dwconv3x3 s2 72ch 56x56": lambda: conv_graph((1, 72, 56, 56), (72, 1, 3, 3), (2, 2), (1, 1, 1, 1), 72),
    "dwconv5x5 s2 288ch 14x14": lambda: conv_graph((1, 288, 14, 14), (288, 1, 5, 5), (2, 2), (2, 2, 2, 2), 288),
    "dwconv3x3 s2 16ch 112x112": lambda: conv_graph((1, 16, 112, 112), (16, 1, 3, 3), (2, 2), (1, 1, 1, 1), 16),
    "dwconv5x5 240ch 14x14": lambda: conv_graph((1, 240, 14, 14), (240, 1, 5, 5), (1, 1), (2, 2, 2, 2), 240),
    "dwconv5x5 576ch 7x7": lambda: conv_graph((1, 576, 7, 7), (576, 1, 5, 5), (1, 1), (2, 2, 2, 2), 576),
    "dwconv3x3 88ch 28x28": lambda: conv_graph((1, 88, 28, 28), (88, 1, 3, 3), (1, 1), (1, 1, 1, 1), 88),
    "conv3x3 s2 3->16 224x224": lambda: conv_graph((1, 3, 224, 224), (16, 3, 3, 3), (2, 2), (1, 1, 1, 1), 1),
    "conv3x3 s2 3->16 224x224 + bias": lambda: conv_graph(
        (1, 3, 224, 224), (16, 3, 3, 3), (2, 2), (1, 1, 1, 1), 1, bias=True
    ),
    "conv3x3 s2 3->16 224x224 + bias + relu": lambda: conv_graph(
        (1, 3, 224, 224), (16, 3, 3, 3), (2, 2), (1, 1, 1, 1), 1, bias=True, relu=True
    ),
    # its pointwise convs (Note [Pointwise convolution rows]): K = 16..576, 7x7 to 56x56
    "conv1x1 16->72 56x56 + relu": lambda: conv_graph(
        (1, 16, 56, 56), (72, 16, 1, 1), (1, 1), (0, 0, 0, 0), 1, relu=True
    ),
    # with oneDNN-style post-ops (Note [Register post-ops]): MobileNetV3's conv + bias + act
    "conv1x1 16->72 56x56": lambda: conv_graph((1, 16, 56, 56), (72, 16, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 16->72 56x56 + bias": lambda: conv_graph(
        (1, 16, 56, 56), (72, 16, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True
    ),
    "conv1x1 16->72 56x56 + bias + relu": lambda: conv_graph(
        (1, 16, 56, 56), (72, 16, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True, relu=True
    ),
    "dwconv3x3 s2 72ch 56x56 + bias + relu": lambda: conv_graph(
        (1, 72, 56, 56), (72, 1, 3, 3), (2, 2), (1, 1, 1, 1), 72, bias=True, relu=True
    ),
    "conv1x1 72->24 28x28 + bias": lambda: conv_graph(
        (1, 72, 28, 28), (24, 72, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True
    ),
    "conv1x1 40->240 14x14 + bias": lambda: conv_graph(
        (1, 40, 14, 14), (240, 40, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True
    ),
    "conv1x1 96->576 7x7 + bias": lambda: conv_graph(
        (1, 96, 7, 7), (576, 96, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True
    ),
    "conv1x1 576->96 7x7 + bias": lambda: conv_graph(
        (1, 576, 7, 7), (96, 576, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True
    ),
    # YOLOv5's 6x6 stride-2 stem
    "conv6x6 s2 3->16 320x320": lambda: conv_graph((1, 3, 320, 320), (16, 3, 6, 6), (2, 2), (2, 2, 2, 2), 1),
    # YOLOv5's stride-2 3x3 downsamplings
    "conv3x3 s2 16->32 160x160": lambda: conv_graph((1, 16, 160, 160), (32, 16, 3, 3), (2, 2), (1, 1, 1, 1), 1),
    "conv3x3 s2 32->64 80x80": lambda: conv_graph((1, 32, 80, 80), (64, 32, 3, 3), (2, 2), (1, 1, 1, 1), 1),
    "conv3x3 s2 128->128 56x56": lambda: conv_graph((1, 128, 56, 56), (128, 128, 3, 3), (2, 2), (1, 1, 1, 1), 1),
    # resnet50's bottleneck expansions
    "conv1x1 128->512 28x28": lambda: conv_graph((1, 128, 28, 28), (512, 128, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 256->1024 14x14": lambda: conv_graph((1, 256, 14, 14), (1024, 256, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 512->128 28x28": lambda: conv_graph((1, 512, 28, 28), (128, 512, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 64->256 56x56": lambda: conv_graph((1, 64, 56, 56), (256, 64, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 1024->256 14x14": lambda: conv_graph((1, 1024, 14, 14), (256, 1024, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    # resnet18's later stages (Note [Direct convolution]: 7 or 14 pixels a row), regnety's
    # grouped 3x3 (8 channels a group) and the stem, the 1x1 convs of EfficientNet/ConvNeXt heads
    "conv3x3 128->128 28x28": lambda: conv_graph((1, 128, 28, 28), (128, 128, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "conv3x3 256->256 14x14": lambda: conv_graph((1, 256, 14, 14), (256, 256, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "conv3x3 512->512 7x7": lambda: conv_graph((1, 512, 7, 7), (512, 512, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "conv3x3 g46 368ch 7x7 + relu": lambda: conv_graph(
        (1, 368, 7, 7), (368, 8, 3, 3), (1, 1), (1, 1, 1, 1), 46, relu=True
    ),
    "conv1x1 32->24 112x112 + relu": lambda: conv_graph(
        (1, 32, 112, 112), (24, 32, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True, relu=True
    ),
    "conv3x3 g19 152ch 14x14 + relu": lambda: conv_graph(
        (1, 152, 14, 14), (152, 8, 3, 3), (1, 1), (1, 1, 1, 1), 19, relu=True
    ),
    "conv3x3 s2 3->32 224x224": lambda: conv_graph((1, 3, 224, 224), (32, 3, 3, 3), (2, 2), (1, 1, 1, 1), 1),
    # resnet18's stem (Note [Transposed tile stores])
    "conv7x7 s2 3->64 224x224 + bias": lambda: conv_graph(
        (1, 3, 224, 224), (64, 3, 7, 7), (2, 2), (3, 3, 3, 3), 1, bias=True
    ),
    # resnet18's strided 1x1 downsamples
    "conv1x1 s2 64->128 56x56 + bias": lambda: conv_graph(
        (1, 64, 56, 56), (128, 64, 1, 1), (2, 2), (0, 0, 0, 0), 1, bias=True
    ),
    "conv1x1 s2 256->512 14x14 + bias": lambda: conv_graph(
        (1, 256, 14, 14), (512, 256, 1, 1), (2, 2), (0, 0, 0, 0), 1, bias=True
    ),
    "conv1x1 320->1280 7x7": lambda: conv_graph((1, 320, 7, 7), (1280, 320, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 1152->192 7x7": lambda: conv_graph((1, 1152, 7, 7), (192, 1152, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "conv1x1 160->640 14x14 + bias": lambda: conv_graph(
        (1, 160, 14, 14), (640, 160, 1, 1), (1, 1), (0, 0, 0, 0), 1, bias=True
    ),
    # one pixel: the head's 576 -> 1024 (a GEMV over 2.4 MB of weights)
    "conv1x1 576->1024 1x1": lambda: conv_graph((1, 576, 1, 1), (1024, 576, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    # activations in registers (Note [Register post-ops]): GELU after ConvNeXt's MLP conv
    # and deit_tiny's fc1, SiLU after efficientnet_b0's depthwise conv; each beside its bias alone
    **{
        f"{name} + bias{'' if act == 'none' else ' + ' + act}": (lambda f=f, act=act: f(act))
        for name, f, acts in [
            (
                "conv1x1 40->160 56x56",
                lambda a: act_graph("conv", (1, 40, 56, 56), (160, 40, 1, 1), a),
                ("none", "gelu"),
            ),
            (
                "conv1x1 64->256 56x56",
                lambda a: act_graph("conv", (1, 64, 56, 56), (256, 64, 1, 1), a),
                ("none", "residual + relu"),
            ),
            (
                "conv1x1 128->512 28x28",
                lambda a: act_graph("conv", (1, 128, 28, 28), (512, 128, 1, 1), a),
                ("none", "residual + relu"),
            ),
            (
                "conv3x3 16->16 80x80",
                lambda a: act_graph("conv", (1, 16, 80, 80), (16, 16, 3, 3), a, pad=1),
                ("silu", "silu + residual"),
            ),
            (
                "conv3x3 64->64 56x56",
                lambda a: act_graph("conv", (1, 64, 56, 56), (64, 64, 3, 3), a, pad=1),
                ("none", "residual + relu"),
            ),
            ("mm 197x192x768", lambda a: act_graph("matmul", (1, 197, 192), (192, 768), a), ("none", "gelu")),
            ("mm 197x768x192", lambda a: act_graph("matmul", (1, 197, 768), (768, 192), a), ("none",)),
            ("mm 197x192x576", lambda a: act_graph("matmul", (1, 197, 192), (192, 576), a), ("none",)),
            (
                "dwconv3x3 144ch 56x56",
                lambda a: act_graph("conv", (1, 144, 56, 56), (144, 1, 3, 3), a, pad=1),
                ("none", "silu"),
            ),
            (
                "dwconv3x3 32ch 112x112",
                lambda a: act_graph("conv", (1, 32, 112, 112), (32, 1, 3, 3), a, pad=1),
                ("none", "silu"),
            ),
            (
                "dwconv3x3 s2 96ch 112x112",
                lambda a: act_graph("conv", (1, 96, 112, 112), (96, 1, 3, 3), a, stride=2, pad=1),
                ("none", "silu"),
            ),
        ]
        for act in acts
    },
}
BACKENDS = ("ort", "native", "numpy")


def time_case(graph, threads: int, backends=BACKENDS) -> dict[str, float]:
    kg, consts = kernel_of(graph)
    feeds = feeds_for(kg, consts)
    args = [feeds[n] if n in feeds else consts[n] for n in kg.inputs]
    kernels = {}
    for name in backends:
        b = get_backend(name)
        if b.supports(kg):
            kernels[name] = b.build(kg, consts, threads)
            kernels[name].set_threads(threads)
    ref = None
    for name, k in kernels.items():
        out = k(args)[0]
        if ref is None:
            ref = out
        else:
            err = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-12))
            assert err < 1e-4, f"{name} differs from {next(iter(kernels))}: {err:.1e}"
    res: dict[str, list[float]] = {n: [] for n in kernels}
    for _ in range(7):
        for name, k in kernels.items():
            with k.timed():  # as profiling measures it (the native pool held, as in a segment)
                for _ in range(3):
                    k(args)
                t0, n = time.perf_counter(), 0
                while time.perf_counter() - t0 < 0.1:
                    k(args)
                    n += 1
            res[name].append((time.perf_counter() - t0) / n * 1e6)
    return {n: statistics.median(v) for n, v in res.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--only", nargs="*", default=[], help="cases whose name contains one of these")
    p.add_argument(
        "--backends",
        nargs="+",
        default=list(BACKENDS),
        help="time only these (one per process keeps onnxruntime's spinning pool off korch's)",
    )
    args = p.parse_args()
    for t in args.threads:
        print(f"\n{t} thread(s), us (in brackets: onnxruntime's time over the backend's; above 1 is faster)\n")
        print("| case | onnxruntime | native | numpy |")
        print("|---|---|---|---|")
        for case, make in CASES.items():
            if args.only and not any(o in case for o in args.only):
                continue
            r = time_case(make(), t, args.backends)
            ort_us = r.get("ort")
            cell = lambda n, r=r, ort_us=ort_us: (  # noqa: E731
                "-" if n not in r else f"{r[n]:.1f}" + (f" ({ort_us / r[n]:.2f})" if ort_us and n != "ort" else "")
            )
            print(f"| {case} | {cell('ort')} | {cell('native')} | {cell('numpy')} |")


if __name__ == "__main__":
    main()
