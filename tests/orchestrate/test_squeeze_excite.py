"""Squeeze-and-excitation through the whole pipeline (Notes [Pooled taps] and [Scaled
inputs] in korch_rt.cc): a depthwise conv + SiLU whose output is pooled, two 1x1 convs
on the pooled vector, a sigmoid, and the channel scale a 1x1 projection reads.

Numbers: the executable matches onnxruntime (rel 1e-4). Structure: with korch's own
kernels only (no library regions, no whole-graph plan), no generated kernel is left
for the pool or the scale: the pool runs in the depthwise conv's kernel and the scale
in the projection's, both native.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.ir import Op


def _se_block(c: int = 48, hw: int = 28, squeeze: int = 12, out: int = 24):
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def const(name, *shape, scale=0.3):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def conv(x, w, b, y, **attrs):
        nodes.append(helper.make_node("Conv", [x, w, b], [y], **attrs))

    def silu(x, y):
        nodes.append(helper.make_node("Sigmoid", [x], [y + "_s"]))
        nodes.append(helper.make_node("Mul", [x, y + "_s"], [y]))

    conv("x", const("dw_w", c, 1, 3, 3), const("dw_b", c), "dw", group=c, pads=[1, 1, 1, 1])
    silu("dw", "act")
    nodes.append(helper.make_node("GlobalAveragePool", ["act"], ["pooled"]))
    conv("pooled", const("fc1_w", squeeze, c, 1, 1), const("fc1_b", squeeze), "fc1")
    silu("fc1", "fc1_act")
    conv("fc1_act", const("fc2_w", c, squeeze, 1, 1), const("fc2_b", c), "fc2")
    nodes.append(helper.make_node("Sigmoid", ["fc2"], ["gate"]))
    nodes.append(helper.make_node("Mul", ["act", "gate"], ["scaled"]))
    conv("scaled", const("proj_w", out, c, 1, 1), const("proj_b", out), "y")
    graph = helper.make_graph(
        nodes,
        "se_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out, hw, hw])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("hw", [28, 7])
def test_pool_and_scale_run_inside_the_convs(hw, tmp_path, quick_settings):
    """At 28 x 28 the projection scales its 48 x 24 weights; at 7 x 7 its input."""
    settings = quick_settings(num_threads=2, library_regions=0, region_bias=(), whole_plans=False, choose_threads=False)
    model = korch.optimize(_se_block(hw=hw), output_dir=tmp_path / "out", settings=settings)
    assert model.report["max_rel_error"] <= 1e-4, model.report
    g = model.graph
    for step in model.executable.kernel_steps():
        ops = {g.nodes[n].op for n in step.nodes}
        big_mul = any(g.nodes[n].op is Op.MUL and g.nodes[n].shape == (1, 48, hw, hw) for n in step.nodes)
        if Op.REDUCE_SUM in ops or big_mul:  # the pool, SiLU's product and the scale
            assert Op.CONV in ops and step.backend == "native", (ops, step.backend)
