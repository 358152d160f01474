"""Note [Native softmax] (korch_rt.cc, kernels/native/softmax.py): fission's softmax
over trailing axes as one native kernel.

Numbers: against the numpy reference (1e-6 absolute on values in [0, 1]), rows whose
length is not a multiple of the vector (masked tails), several trailing axes, saved
and loaded. Structure: which kernel graphs qualify, and through the whole pipeline an
attention block's softmax runs native, matching onnxruntime (rel 1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_library_backends import feeds_for, kernel_of, run_and_compare, slow_tvm

import korch
from korch.ir import GraphBuilder, Op
from korch.kernels.native.softmax import softmax_spec


def _softmax(shape, axes, extra=False, normalized=True):
    """fission's softmax of an input over ``axes``; ``extra``: a scale before it too;
    not ``normalized``: its numerator exp(x - max) alone."""
    b = GraphBuilder()
    x = b.input("x", shape, "float32")
    if extra:
        x = b.binary(Op.MUL, x, b.scalar(0.125, x))
    m = b.broadcast_to(b.reduce(Op.REDUCE_MAX, x, axes), shape)
    e = b.unary(Op.EXP, b.add(Op.SUB, [x, m]))
    if not normalized:
        b.output("e", e)
        return b.graph
    s = b.broadcast_to(b.reduce(Op.REDUCE_SUM, e, axes), shape)
    b.output("y", b.add(Op.DIV, [e, s]))
    return b.graph


@pytest.mark.parametrize("normalized", [True, False], ids=["softmax", "numerator"])
@pytest.mark.parametrize(
    "shape,axes",
    [((1, 3, 197, 197), (3,)), ((2, 5, 7), (1, 2)), ((4, 16), (1,)), ((1, 2, 3, 33), (3,))],
    ids=["attention_scores", "two_trailing_axes", "whole_rows", "ragged_tail"],
)
def test_softmax_matches_numpy(shape, axes, normalized, tmp_path):
    kg, consts = kernel_of(_softmax(shape, axes, normalized=normalized))
    spec = softmax_spec(kg)
    assert spec is not None and spec.normalized == normalized
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path, rtol=1e-5, atol=1e-6)
    assert type(k).__name__ == "NativeSoftmaxKernel"


def test_what_qualifies():
    kg, _ = kernel_of(_softmax((2, 4, 8), (1,)))  # not the trailing axes: rows not contiguous
    assert softmax_spec(kg) is None
    kg, _ = kernel_of(_softmax((2, 4, 8), (2,), extra=True))  # something else computed too
    assert softmax_spec(kg) is None
    kg, _ = kernel_of(_softmax((0, 8), (1,)))  # no rows
    assert softmax_spec(kg) is None


def _attention(tokens: int = 20, dim: int = 32):
    """scores = q @ k^T / sqrt(dim), softmax over keys, @ v: the block a transformer repeats."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((dim, dim)) * 0.3).astype(np.float32), n)
        for n in ("wq", "wk", "wv")
    ]
    inits.append(numpy_helper.from_array(np.array(dim**-0.5, dtype=np.float32), "scale"))
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, tokens, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, tokens, dim])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_attention_softmax_runs_native(tmp_path, quick_settings, monkeypatch):
    """The native softmax is a candidate beside TVM's kernels, measured, built into the
    plan and correct there. Which of the two is faster on 20 tokens is a timing (TVM's
    won once in a noisy minute), so TVM's softmax kernels are reported 10x slower here."""
    slow_tvm(monkeypatch, Op.EXP)
    settings = quick_settings(num_threads=2, library_regions=0, region_bias=(), whole_plans=False, choose_threads=False)
    model = korch.optimize(_attention(), output_dir=tmp_path / "out", settings=settings)
    assert model.report["max_rel_error"] <= 1e-4, model.report
    g = model.graph
    steps = [s for s in model.executable.kernel_steps() if Op.EXP in {g.nodes[n].op for n in s.nodes}]
    assert len(steps) == 1 and steps[0].backend == "native", [(s.backend, len(s.nodes)) for s in steps]
