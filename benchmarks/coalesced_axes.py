"""Generated kernels with and without coalesced axes (Note [Coalesced axes]).

Each case is a memory-bound kernel from a CNN's epilogues, at the shapes of
mobilenetv3_small. It is scheduled by the tiling model's config
(``model_tile_config``) and built twice: over its own axes, and over coalesced
axes. The two builds are timed in alternating rounds in one process, with the
executable's path (``run_into`` on aligned arrays). The table gives medians in us
and the ratio. It is a benchmark, not a test: it prints a table and never fails on
a timing.

    .venv/bin/python benchmarks/coalesced_axes.py [--threads 2] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def cases():
    from korch.ir import GraphBuilder, Op

    def scale(shape):
        b = GraphBuilder()
        x = b.input("in0", shape, "float32")
        b.output("out0", b.add(Op.MUL, [x, b.scalar(1 / 6, x)]))
        return b.graph

    def bias_mul(shape):
        b = GraphBuilder()
        x = b.input("in0", shape, "float32")
        b.output("out0", b.binary(Op.MUL, x, b.input("in1", (1, shape[1], 1, 1), "float32")))
        return b.graph

    def bias_hardswish(shape):
        b = GraphBuilder()
        y = b.binary(Op.ADD, b.input("in0", shape, "float32"), b.input("in1", (1, shape[1], 1, 1), "float32"))
        t = b.add(Op.ADD, [y, b.scalar(3.0, y)])
        t = b.add(Op.MIN, [b.add(Op.MAX, [t, b.scalar(0.0, t)]), b.scalar(6.0, t)])
        b.output("out0", b.add(Op.MUL, [b.add(Op.MUL, [y, t]), b.scalar(1 / 6, y)]))
        return b.graph

    def channel_mean(shape):
        b = GraphBuilder()
        x = b.input("in0", shape, "float32")
        y = b.add(Op.MAX, [x, b.scalar(0.0, x)])
        s = b.reduce(Op.REDUCE_SUM, y, [2, 3])
        b.output("out0", y)
        b.output("out1", b.add(Op.MUL, [s, b.scalar(1 / (shape[2] * shape[3]), s)]))
        return b.graph

    return {
        "x / 6 [1,96,28,28]": scale((1, 96, 28, 28)),
        "x * s [1,240,14,14]": bias_mul((1, 240, 14, 14)),
        "x * s [1,576,7,7]": bias_mul((1, 576, 7, 7)),
        "hardswish(x + b) [1,96,28,28]": bias_hardswish((1, 96, 28, 28)),
        "hardswish(x + b) [1,288,7,7]": bias_hardswish((1, 288, 7, 7)),
        "hardswish(x + b) [1,16,112,112]": bias_hardswish((1, 16, 112, 112)),
        "relu + mean over H, W [1,72,28,28]": channel_mean((1, 72, 28, 28)),
    }


def build(g, threads: int, coalesce_axes: bool):
    from korch.kernels.tvm.backend import _kernel, host_target, import_tvm, prepare, set_tvm_threads
    from korch.kernels.tvm.tiling import model_tile_config

    set_tvm_threads(threads)
    tvm = import_tvm()
    cfg = model_tile_config(g, threads)[0]
    prep = prepare(g, threads, cfg, coalesce_axes=coalesce_axes)
    mod = tvm.IRModule({"k": prep.func.with_attr("global_symbol", "k")})
    return _kernel(tvm.compile(mod, target=host_target(threads)), "k", prep, 0.0)


def main() -> None:
    from korch.ir import evaluate
    from korch.kernels.base import aligned_empty

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"| kernel | own axes us | coalesced us | speedup | call shapes ({args.threads} threads) |")
    print("|---|---|---|---|---|")
    for name, g in cases().items():
        feeds = {n: rng.standard_normal(g.nodes[i].shape).astype("float32") for n, i in g.inputs.items()}
        want = list(evaluate(g, feeds).values())
        runs = []
        for flag in (False, True):
            k = build(g, args.threads, flag)
            ins = [k.arg(i, x) for i, x in enumerate(feeds.values())]
            outs = [aligned_empty(s.shape, s.dtype) for s in k.outputs]
            k.run_into(ins, outs)
            for w, o in zip(want, outs):
                np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5)
            runs.append((k, ins, outs))
        times: list[list[float]] = [[], []]
        for _ in range(args.rounds):
            for j, (k, ins, outs) in enumerate(runs):
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 0.02:
                    k.run_into(ins, outs)
                    n += 1
                times[j].append((time.perf_counter() - t0) / n * 1e6)
        own, co = (statistics.median(t) for t in times)
        shapes = runs[1][0].call_shapes
        print(f"| {name} | {own:.1f} | {co:.1f} | {own / co:.2f}x | {shapes} |")


if __name__ == "__main__":
    main()
