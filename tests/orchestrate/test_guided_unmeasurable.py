"""Note [Unmeasurable partitions] in the guided profiling rounds: a partition with a
kernel that cannot be measured still gets the rest of its kernels measured, so the
final solve has a plan for it (issue 26: roberta's token-type Gather)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import korch
import korch.profile
from korch.ir import Op
from korch.orchestrate.choose import UNMEASURED_PENALTY_US
from korch.profile.db import Measurement


def _embedding_layernorm() -> onnx.ModelProto:
    """A data-dependent Gather (opaque) and a LayerNorm (generated or native memory
    kernels, and no library region: the graph has no linear primitive)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"]),
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "table"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "beta"),
    ]
    graph = helper.make_graph(
        nodes,
        "embedding_layernorm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_guided_rounds_measure_the_rest_of_a_partition_with_an_unmeasurable_kernel(quick_settings, monkeypatch):
    real = korch.profile.profile

    def opaque_kernels_fail(workloads, db, target, settings, progress=True, pool=None):
        bad = [w for w in workloads if any(n.op is Op.OPAQUE for n in w.kgraph.nodes)]
        bad_ids = {id(w) for w in bad}
        results, stats = real([w for w in workloads if id(w) not in bad_ids], db, target, settings, progress, pool)
        for w in bad:
            for b in w.backends:
                results[(w.hash, b)] = Measurement(w.hash, target, b, w.config, "", "failed", None, error="test")
        return results, stats

    monkeypatch.setattr(korch.profile, "profile", opaque_kernels_fail)
    # the BLP's plan ships: the one this test is about
    settings = quick_settings(library_regions=0, region_bias=())
    model = _embedding_layernorm()
    compiled = korch.optimize(model, settings=settings)  # raised OrchestrationError before
    r = compiled.report
    assert r["unmeasured_partitions"] == [0]
    steps = compiled.executable.kernel_steps()  # a native segment's kernels one by one
    # the Gather on onnxruntime at a penalty, the LayerNorm measured: TVM's kernels or
    # the native one (Note [Native LayerNorm]), whichever measured faster
    backends = {s.backend for s in steps}
    assert "ort" in backends and backends & {"tvm", "native"}, [s.backend for s in steps]
    assert 0 < r["predicted_latency_us"] - UNMEASURED_PENALTY_US < UNMEASURED_PENALTY_US  # one penalised kernel
    feeds = {"ids": np.random.default_rng(1).integers(0, 16, (1, 8)).astype(np.int64)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feeds)
    got = compiled(feeds)["y"]
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))
