"""Note [Native LayerNorm] (korch_rt.cc, kernels/native/norm.py): fission's LayerNorm
over the last axis as one native kernel.

Numbers: against the numpy reference (1e-5 relative, 1e-5 absolute on unit-scale
values), rows whose length is not a multiple of the vector (masked tails), with and
without gamma and beta, the statistics as a division or a multiplication, saved and
loaded. Structure: which kernel graphs qualify, and through the whole pipeline a
LayerNorm runs native, matching onnxruntime (rel 1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_library_backends import feeds_for, kernel_of, run_and_compare, slow_tvm

import korch
from korch.ir import GraphBuilder, Op
from korch.kernels.native.norm import layernorm_spec


def _layernorm(shape, gamma=False, beta=False, mul_mean=False, div_norm=False, extra=False, eps=1e-5):
    """fission's LayerNorm of an input over its last axis: ``mul_mean`` takes the mean
    as the sum times 1 / N, ``div_norm`` divides by the root instead of multiplying by
    its reciprocal; ``extra``: something else computed too (a ReLU after it)."""
    b = GraphBuilder()
    x = b.input("x", shape, "float32")
    n = shape[-1]
    axes = (len(shape) - 1,)
    red = shape[:-1] + (1,)

    def mean(v):
        s = b.reduce(Op.REDUCE_SUM, v, axes)
        if mul_mean:
            return b.binary(Op.MUL, s, b.scalar(1.0 / n, s))
        return b.binary(Op.DIV, s, b.scalar(float(n), s))

    d = b.add(Op.SUB, [x, b.broadcast_to(mean(x), shape)])
    var = mean(b.add(Op.MUL, [d, d]))
    root = b.unary(Op.SQRT, b.binary(Op.ADD, var, b.scalar(eps, var)))
    assert tuple(b.graph.nodes[root].shape) == red
    if div_norm:
        y = b.add(Op.DIV, [d, b.broadcast_to(root, shape)])
    else:
        y = b.add(Op.MUL, [d, b.broadcast_to(b.unary(Op.RECIPROCAL, root), shape)])
    rng = np.random.default_rng(1)
    if gamma:
        g = b.const((1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), name="gamma")
        y = b.add(Op.MUL, [y, b.broadcast_to(b.reshape(g, (1,) * (len(shape) - 1) + (n,)), shape)])
    if beta:
        c = b.const((0.1 * rng.standard_normal(n)).astype(np.float32), name="beta")
        y = b.add(Op.ADD, [b.broadcast_to(b.reshape(c, (1,) * (len(shape) - 1) + (n,)), shape), y])
    if extra:
        y = b.binary(Op.MAX, y, b.scalar(0.0, y))
    b.output("y", y)
    return b.graph


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((1, 197, 192), {}),
        ((1, 197, 192), dict(gamma=True, beta=True)),
        ((2, 7, 33), dict(gamma=True, mul_mean=True)),
        ((4, 5), dict(beta=True, div_norm=True)),
        ((3, 1000), dict(gamma=True, beta=True, eps=1e-12)),
    ],
    ids=["deit_folded", "affine", "ragged_tail_gamma", "short_rows_div", "long_rows"],
)
def test_layernorm_matches_numpy(shape, kw, tmp_path):
    kg, consts = kernel_of(_layernorm(shape, **kw))
    spec = layernorm_spec(kg)
    assert spec is not None
    assert (spec.gamma_pos >= 0, spec.beta_pos >= 0) == (kw.get("gamma", False), kw.get("beta", False))
    k = run_and_compare("native", kg, consts, feeds_for(kg, consts), tmp_path, rtol=1e-5, atol=1e-5)
    assert type(k).__name__ == "NativeLayerNormKernel"


def _stats_over(shape, axis: int, mean_count: float, var_count: float):
    """A LayerNorm-shaped chain with its statistics over ``axis``, the mean and the
    variance divided by the given counts."""
    b = GraphBuilder()
    x = b.input("x", shape, "float32")
    s = b.reduce(Op.REDUCE_SUM, x, (axis,))
    d = b.add(Op.SUB, [x, b.broadcast_to(b.binary(Op.DIV, s, b.scalar(mean_count, s)), shape)])
    v = b.reduce(Op.REDUCE_SUM, b.add(Op.MUL, [d, d]), (axis,))
    v = b.binary(Op.DIV, v, b.scalar(var_count, v))
    r = b.unary(Op.RECIPROCAL, b.unary(Op.SQRT, b.binary(Op.ADD, v, b.scalar(1e-5, v))))
    b.output("y", b.add(Op.MUL, [d, b.broadcast_to(r, shape)]))
    return b.graph


def test_what_qualifies():
    kg, _ = kernel_of(_layernorm((2, 4, 8), extra=True))  # something else computed too
    assert layernorm_spec(kg) is None
    kg, _ = kernel_of(_stats_over((4, 8), 1, 8.0, 8.0))  # the chain itself qualifies
    assert layernorm_spec(kg) is not None
    kg, _ = kernel_of(_stats_over((6, 8), 0, 6.0, 6.0))  # over the first axis: not rows
    assert layernorm_spec(kg) is None
    kg, _ = kernel_of(_stats_over((4, 8), 1, 7.0, 8.0))  # the mean over a count not the row's
    assert layernorm_spec(kg) is None


def _encoder_norm(tokens: int = 20, dim: int = 48):
    """x @ w, then LayerNormalization (gamma and beta): a post-norm block's tail."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((dim, dim)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(dim)).astype(np.float32), "gamma"),
        numpy_helper.from_array((0.1 * rng.standard_normal(dim)).astype(np.float32), "beta"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes,
        "norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, tokens, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, tokens, dim])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_layernorm_runs_native_in_a_plan(tmp_path, quick_settings, monkeypatch):
    """The native LayerNorm is a candidate beside TVM's kernels, measured, built into the
    plan and correct there. Which of the two is faster on 40 rows is a timing, so TVM's
    kernels with a square root are reported 10x slower here."""
    slow_tvm(monkeypatch, Op.SQRT)
    settings = quick_settings(num_threads=2, library_regions=0, region_bias=(), whole_plans=False, choose_threads=False)
    model = korch.optimize(_encoder_norm(), output_dir=tmp_path / "out", settings=settings)
    assert model.report["max_rel_error"] <= 1e-4, model.report
    g = model.graph
    steps = [s for s in model.executable.kernel_steps() if Op.SQRT in {g.nodes[n].op for n in s.nodes}]
    assert len(steps) == 1 and steps[0].backend == "native", [(s.backend, len(s.nodes)) for s in steps]
    loaded = korch.load(tmp_path / "out")
    x = np.random.default_rng(3).standard_normal((2, 20, 48)).astype(np.float32)
    np.testing.assert_allclose(loaded({"x": x})["y"], model({"x": x})["y"], rtol=1e-6, atol=1e-6)
