"""Library backends on typical linear kernels: median time per call, in microseconds.

Compares korch's ``ort`` backend (to_onnx export of the kernel graph), ``numpy``
(np.matmul / OpenBLAS), ``torch`` (oneDNN, if installed) and, as the reference,
onnxruntime running a one-node MatMul / Conv model built by hand. Backends alternate
in rounds and we report medians, because other processes may share the machine.

    .venv/bin/python benchmarks/linear_backends.py [--threads 2] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from korch.ir import Graph, GraphBuilder, Op, evaluate
from korch.ir.subgraph import extract, make_kernel
from korch.kernels.registry import all_backends

rng = np.random.default_rng(0)


def _randn(*shape):
    return (rng.standard_normal(shape) * 0.1).astype("float32")


def matmul_case(a_shape, b_shape, const_b=True, bias_relu=False):
    b = GraphBuilder()
    a = b.input("a", a_shape, "float32")
    w = b.const(_randn(*b_shape), name="w") if const_b else b.input("w", b_shape, "float32")
    y = b.add(Op.MATMUL, [a, w])
    if bias_relu:
        y = b.binary(Op.ADD, y, b.const(_randn(b_shape[-1]), name="bias"))
        y = b.add(Op.MAX, [y, b.scalar(0.0, y)])
    b.output("y", y)
    return b.graph


def conv_case(x_shape, w_shape, pads, group=1, strides=(1, 1), bias_relu=False):
    b = GraphBuilder()
    x = b.input("x", x_shape, "float32")
    w = b.const(_randn(*w_shape), name="w")
    y = b.add(Op.CONV, [x, w], strides=strides, dilations=(1, 1), pads=pads, group=group)
    if bias_relu:
        y = b.binary(Op.ADD, y, b.reshape(b.const(_randn(w_shape[0]), name="bias"), (w_shape[0], 1, 1)))
        y = b.add(Op.MAX, [y, b.scalar(0.0, y)])
    b.output("y", y)
    return b.graph


CASES = {
    "tiny mm 4x4x4 (call overhead)": matmul_case((4, 4), (4, 4)),
    "mm 128x768x768": matmul_case((128, 768), (768, 768)),
    "mm 128x768x3072": matmul_case((128, 768), (768, 3072)),
    "mm 128x768x768 +bias+relu": matmul_case((128, 768), (768, 768), bias_relu=True),
    "bmm 12x128x64x128": matmul_case((12, 128, 64), (12, 64, 128), const_b=False),
    "conv3x3 64->64 56x56": conv_case((1, 64, 56, 56), (64, 64, 3, 3), (1, 1, 1, 1)),
    "conv3x3 64->64 +bias+relu": conv_case((1, 64, 56, 56), (64, 64, 3, 3), (1, 1, 1, 1), bias_relu=True),
    "conv1x1 256->64 56x56": conv_case((1, 256, 56, 56), (64, 256, 1, 1), (0, 0, 0, 0)),
    "conv9x9 3->32 224x224": conv_case((1, 3, 224, 224), (32, 3, 9, 9), (4, 4, 4, 4)),
    "dwconv3x3 128ch 56x56": conv_case((1, 128, 56, 56), (128, 1, 3, 3), (1, 1, 1, 1), group=128),
}


def kernel_of(graph: Graph):
    kernel = make_kernel(graph, graph.users(), graph.compute_ids())
    kg = extract(graph, kernel)
    consts = {f"in{i}_c": graph.const_value(s) for i, s in enumerate(kernel.inputs) if graph.nodes[s].op is Op.CONST}
    return kg, consts


def onnxruntime_reference(graph: Graph, num_threads: int):
    """onnxruntime's own MatMul / Conv (+Add+Relu) model, written by hand, with weights as initializers."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    lin = next(n for n in graph.nodes if n.op in (Op.MATMUL, Op.CONV))
    a, w = (graph.nodes[i] for i in lin.inputs)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))]
    inits = []
    if w.op is Op.CONST:
        inits.append(numpy_helper.from_array(graph.const_value(lin.inputs[1]), "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
    if lin.op is Op.MATMUL:
        nodes = [helper.make_node("MatMul", ["a", "w"], ["y0"])]
    else:
        nodes = [
            helper.make_node(
                "Conv",
                ["a", "w"],
                ["y0"],
                kernel_shape=list(w.shape[2:]),
                pads=list(lin.attr("pads")),
                strides=list(lin.attr("strides")),
                group=lin.attr("group"),
            )
        ]
    if "bias" in graph.consts:
        bias = graph.consts["bias"]
        if lin.op is Op.CONV:
            bias = bias.reshape(-1, 1, 1)
        inits.append(numpy_helper.from_array(bias, "bias"))
        nodes += [helper.make_node("Add", ["y0", "bias"], ["y1"]), helper.make_node("Relu", ["y1"], ["y"])]
    else:
        nodes[0].output[0] = "y"
    out = next(iter(graph.outputs.values()))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(graph.nodes[out].shape))]
    model = helper.make_model(
        helper.make_graph(nodes, "ref", inputs, outputs, initializer=inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda args: sess.run(None, dict(zip(names, args)))


def time_batch(fn, args, min_s: float) -> float:
    """Seconds per call, over as many calls as fit in ``min_s`` (at least 3)."""
    n, total = 0, 0.0
    t0 = time.perf_counter()
    while n < 3 or total < min_s:
        fn(args)
        n += 1
        total = time.perf_counter() - t0
    return total / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-s", type=float, default=0.05, help="seconds of calls per backend per round")
    ap.add_argument("--only", default="", help="substring filter on case names")
    args = ap.parse_args()

    backends = [b for b in all_backends() if b.name in ("ort", "numpy", "torch")]
    cols = ["onnxruntime"] + [b.name for b in backends]
    print(f"threads={args.threads} rounds={args.rounds}; median us per call; '-' = backend does not take the kernel")
    print(f"{'kernel':32s}" + "".join(f"{c:>14s}" for c in cols) + f"{'best':>14s}")
    for name, graph in CASES.items():
        if args.only and args.only not in name:
            continue
        kg, consts = kernel_of(graph)
        feeds = {n: _randn(*kg.nodes[i].shape) for n, i in kg.inputs.items() if n not in consts}
        kargs = [feeds[n] if n in feeds else consts[n] for n in kg.inputs]
        want = evaluate(kg, {**feeds, **consts})["out0"]
        runners = {"onnxruntime": (onnxruntime_reference(graph, args.threads), [feeds[n] for n in feeds])}
        for b in backends:
            if b.supports(kg):
                runners[b.name] = (b.build(kg, consts, args.threads), kargs)
        for rname, (fn, fargs) in runners.items():
            got = fn(fargs)[0]
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=f"{name}: {rname}")
            time_batch(fn, fargs, args.min_s / 2)  # warm up
        times: dict[str, list[float]] = {r: [] for r in runners}
        for _ in range(args.rounds):
            for rname, (fn, fargs) in runners.items():
                times[rname].append(time_batch(fn, fargs, args.min_s))
        med = {r: statistics.median(t) * 1e6 for r, t in times.items()}
        best = min(med, key=med.get)
        row = "".join(f"{med[c]:14.1f}" if c in med else f"{'-':>14s}" for c in cols)
        print(f"{name:32s}{row}{best:>14s}", flush=True)


if __name__ == "__main__":
    main()
