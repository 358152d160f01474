"""Library backends (ort, numpy, torch if installed): build, match the interpreter, save/load."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from onnx import helper

from korch.ir import Graph, GraphBuilder, Op, evaluate, verify
from korch.ir.subgraph import extract, kernel_class, make_kernel
from korch.kernels.registry import all_backends, get_backend

HAVE_TORCH = importlib.util.find_spec("torch") is not None
LINEAR_BACKENDS = ["ort", "numpy", "native"] + (["torch"] if HAVE_TORCH else [])

rng = np.random.default_rng(0)


def randn(*shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def kernel_of(graph: Graph) -> tuple[Graph, dict[str, np.ndarray]]:
    """The whole graph as one canonical kernel (named constants become ``in{i}_c``)."""
    verify(graph)
    kernel = make_kernel(graph, graph.users(), graph.compute_ids())
    kg = extract(graph, kernel)
    consts = {}
    for i, src in enumerate(kernel.inputs):
        if graph.nodes[src].op is Op.CONST:
            consts[f"in{i}_c"] = graph.const_value(src)
    return kg, consts


def run_and_compare(backend_name, kg, consts, feeds, tmp_path=None, rtol=1e-4, atol=1e-4):
    backend = get_backend(backend_name)
    assert backend.supports(kg)
    assert kernel_class(kg, make_kernel(kg, kg.users(), kg.compute_ids())) in backend.kinds
    want = evaluate(kg, {**feeds, **consts})
    args = [feeds[name] if name in feeds else consts[name] for name in kg.inputs]
    kern = backend.build(kg, consts, 2)
    for _ in range(2):  # a second call must not disturb the first result
        got = kern(args)
    first = kern(args)
    kern(args)
    for res in (got, first):
        assert len(res) == len(kg.outputs)
        for g, (name, w) in zip(res, want.items()):
            assert g.shape == w.shape and g.dtype == w.dtype, name
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{backend_name}:{name}")
    if tmp_path is not None:
        meta = kern.save(tmp_path, "k0")
        meta = json.loads(json.dumps(meta))  # JSON-able
        assert all(p.name.startswith("k0") for p in tmp_path.iterdir())
        loaded = backend.load(meta, tmp_path, 2)
        for g, w in zip(loaded(args), want.values()):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return kern


def matmul_graph(a_shape, b_shape, const_b=True, bias=False, relu=False, const_bias=True):
    b = GraphBuilder()
    a = b.input("a", a_shape, "float32")
    w = b.const(randn(*b_shape), name="w") if const_b else b.input("w", b_shape, "float32")
    y = b.add(Op.MATMUL, [a, w])
    if bias:
        n = b_shape[-1]
        v = b.const(randn(n), name="bias") if const_bias else b.input("bias", (n,), "float32")
        y = b.binary(Op.ADD, y, v)
    if relu:
        y = b.add(Op.MAX, [y, b.scalar(0.0, y)])
    b.output("y", y)
    return b.graph


def slow_tvm(monkeypatch, op: Op, factor: float = 10.0) -> None:
    """TVM's measurements of kernels holding an ``op`` primitive reported ``factor``
    times slower: which of TVM's kernel and a native one is faster on a small test
    graph is a timing, and a test of the plan that runs the native one needs it to win."""
    import dataclasses

    import korch.profile as korch_profile

    real = korch_profile.profile

    def profile(workloads, *args, **kw):
        results, stats = real(workloads, *args, **kw)
        hit = {w.hash for w in workloads if any(n.op is op for n in w.kgraph.nodes)}
        for key, m in results.items():
            if key[0] in hit and key[1] == "tvm" and m.ok:
                results[key] = dataclasses.replace(m, median_us=m.median_us * factor)
        return results, stats

    monkeypatch.setattr(korch_profile, "profile", profile)


def feeds_for(kg: Graph, consts) -> dict[str, np.ndarray]:
    return {name: randn(*kg.nodes[nid].shape) for name, nid in kg.inputs.items() if name not in consts}


@pytest.mark.parametrize("backend", LINEAR_BACKENDS)
@pytest.mark.parametrize(
    "case",
    [
        dict(a_shape=(8, 16), b_shape=(16, 12)),
        dict(a_shape=(8, 16), b_shape=(16, 12), const_b=False),
        dict(a_shape=(3, 8, 16), b_shape=(16, 12)),
        dict(a_shape=(3, 8, 16), b_shape=(3, 16, 12), const_b=False),
        dict(a_shape=(8, 16), b_shape=(16, 12), bias=True, relu=True),
        dict(a_shape=(2, 8, 16), b_shape=(16, 12), bias=True, relu=True),
        dict(a_shape=(8, 16), b_shape=(16, 12), bias=True, const_bias=False),
    ],
    ids=["2d", "2d_dyn", "batched_shared", "batched", "bias_relu", "batched_bias_relu", "dyn_bias"],
)
def test_matmul(backend, case, tmp_path):
    kg, consts = kernel_of(matmul_graph(**case))
    run_and_compare(backend, kg, consts, feeds_for(kg, consts), tmp_path)


def conv_graph(x_shape, w_shape, strides, pads, group, dil=(1, 1), bias=False, relu=False):
    b = GraphBuilder()
    x = b.input("x", x_shape, "float32")
    w = b.const(randn(*w_shape), name="w")
    y = b.add(Op.CONV, [x, w], strides=strides, dilations=dil, pads=pads, group=group)
    if bias:
        y = b.binary(Op.ADD, y, b.reshape(b.const(randn(w_shape[0]), name="bias"), (w_shape[0], 1, 1)))
    if relu:
        y = b.add(Op.MAX, [y, b.scalar(0.0, y)])
    b.output("y", y)
    return b.graph


CONV_CASES = [
    dict(x_shape=(1, 4, 9, 9), w_shape=(6, 4, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=1),
    dict(x_shape=(2, 4, 9, 8), w_shape=(6, 2, 3, 3), strides=(2, 1), pads=(1, 0, 2, 1), group=2, dil=(1, 2)),
    dict(
        x_shape=(1, 8, 10, 10), w_shape=(8, 1, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=8, bias=True, relu=True
    ),
    dict(x_shape=(1, 4, 7, 7), w_shape=(5, 4, 1, 1), strides=(2, 2), pads=(0, 0, 0, 0), group=1, bias=True),
    # sixteen channels a block at unit stride (AVX-512): a block of 4 past 16, short rows (14
    # wide: the flat transpose), two images; and rows of 40 (transposed row by row, a
    # masked tail), 3x3
    dict(
        x_shape=(2, 20, 14, 14),
        w_shape=(20, 1, 5, 5),
        strides=(1, 1),
        pads=(2, 2, 2, 2),
        group=20,
        bias=True,
        relu=True,
    ),
    dict(x_shape=(1, 33, 40, 40), w_shape=(33, 1, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), group=33, bias=True),
]


@pytest.mark.parametrize("backend", ["ort", "native"] + (["torch"] if HAVE_TORCH else []))
@pytest.mark.parametrize(
    "case",
    CONV_CASES,
    ids=[
        "3x3",
        "grouped_strided_asym",
        "depthwise_bias_relu",
        "1x1_bias",
        "depthwise16_short_rows",
        "depthwise16_long_rows",
    ],
)
def test_conv(backend, case, tmp_path):
    kg, consts = kernel_of(conv_graph(**case))
    run_and_compare(backend, kg, consts, feeds_for(kg, consts), tmp_path)


def test_numpy_rejects_what_it_cannot_run():
    numpy_backend = get_backend("numpy")
    kg, _ = kernel_of(conv_graph(**CONV_CASES[0]))
    assert not numpy_backend.supports(kg)
    # an epilogue value that is also written out (two outputs)
    b = GraphBuilder()
    a = b.input("a", (4, 4), "float32")
    y = b.add(Op.MATMUL, [a, a])
    b.output("y", y)
    b.output("z", b.add(Op.MAX, [y, b.scalar(0.0, y)]))
    kg, _ = kernel_of(b.graph)
    assert not numpy_backend.supports(kg)
    # a layout op in the epilogue
    b = GraphBuilder()
    a = b.input("a", (4, 4), "float32")
    b.output("y", b.transpose(b.add(Op.MATMUL, [a, a]), (1, 0)))
    kg, _ = kernel_of(b.graph)
    assert not numpy_backend.supports(kg)


@pytest.mark.parametrize("backend", LINEAR_BACKENDS)
def test_longer_epilogue(backend, tmp_path):
    b = GraphBuilder()
    a = b.input("a", (6, 10), "float32")
    w = b.const(randn(10, 7), name="w")
    y = b.add(Op.MATMUL, [a, w])
    y = b.binary(Op.SUB, b.const(randn(1, 7), name="c"), y)  # the chain value on the right
    y = b.add(Op.MUL, [y, b.scalar(0.5, y)])
    y = b.unary(Op.SIGMOID, y)
    y = b.add(Op.MIN, [y, b.scalar(0.7, y)])
    b.output("y", y)
    kg, consts = kernel_of(b.graph)
    run_and_compare(backend, kg, consts, feeds_for(kg, consts), tmp_path)


def test_ort_two_outputs_and_memory_kernel(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    m = b.reduce(Op.REDUCE_MAX, x, [1])
    e = b.unary(Op.EXP, b.binary(Op.SUB, x, m))
    s = b.reduce(Op.REDUCE_SUM, e, [1])
    b.output("softmax", b.binary(Op.DIV, e, s))
    b.output("sum", s)
    kg, consts = kernel_of(b.graph)
    assert len(kg.outputs) == 2
    run_and_compare("ort", kg, consts, feeds_for(kg, consts), tmp_path)


def test_ort_kernel_spins_only_when_it_runs_alone(tmp_path):
    # Note [No spinning thread pools]: a kernel among others never spins; one that is
    # the whole executable spins like onnxruntime's default session, between calls
    # too (Note [An executable runs alone])
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    b.output("y", b.add(Op.MATMUL, [b.unary(Op.EXP, x), b.const(randn(8, 8), name="w")]))
    kg, consts = kernel_of(b.graph)
    be = get_backend("ort")
    k = be.build(kg, consts, 2)

    def entries(k):
        o = k.session.get_session_options()
        return o.get_session_config_entry("session.intra_op.allow_spinning"), o.intra_op_num_threads

    assert entries(k) == ("0", 2)
    k.set_spin(True)
    assert entries(k) == ("1", 2)
    with pytest.raises(Exception, match="force_spinning_stop"):  # no such entry: no stop
        k.session.get_session_options().get_session_config_entry("session.force_spinning_stop")
    k.set_threads(1)
    assert entries(k) == ("1", 1)  # the setting survives a new thread count
    meta = k.save(tmp_path, "k")
    again = be.load(meta, tmp_path, 2)
    assert again.spin and entries(again) == ("1", 2)
    feeds = feeds_for(kg, consts)
    np.testing.assert_allclose(
        again([feeds[n] for n in kg.inputs if n not in consts])[0],
        k([feeds[n] for n in kg.inputs if n not in consts])[0],
    )


def test_ort_opaque_kernel(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    node = helper.make_node("TopK", ["in0", "in1"], ["out0", "out1"], axis=1).SerializeToString()
    k = b.const(np.array([3], dtype=np.int64), name="k")
    v = b.add(Op.OPAQUE, [x, k], node=node, opset=(("", 13),), out_index=0, shape=(3, 3), dtype="float32")
    i = b.add(Op.OPAQUE, [x, k], node=node, opset=(("", 13),), out_index=1, shape=(3, 3), dtype="int64")
    b.output("v", v)
    b.output("i", i)
    kg, consts = kernel_of(b.graph)
    assert "in1_c" in consts
    run_and_compare("ort", kg, consts, feeds_for(kg, consts), tmp_path)


def test_ort_const_input_fed_when_value_missing():
    kg, consts = kernel_of(matmul_graph((4, 6), (6, 3), bias=True))
    backend = get_backend("ort")
    kern = backend.build(kg, {}, 1)  # nothing baked: constants are fed
    args = [feeds_for(kg, consts)["in0"], consts["in1_c"], consts["in2_c"]]
    want = evaluate(kg, dict(zip(kg.inputs, args)))
    np.testing.assert_allclose(kern(args)[0], want["out0"], rtol=1e-5, atol=1e-5)


def test_registry_and_versions():
    names = {b.name for b in all_backends()}
    assert {"ort", "numpy"} <= names
    assert ("torch" in names) == HAVE_TORCH
    for b in all_backends():
        if b.name in ("ort", "numpy", "torch"):
            assert b.version()


def test_torch_is_optional():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
        "from korch.kernels.registry import all_backends\n"
        "print(sorted(b.name for b in all_backends() if b.name in ('ort', 'numpy', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['numpy', 'ort']"
