"""Native TopK (Note [Native TopK] in korch_rt.cc) against onnxruntime: values and
indices exactly equal (a selection, no arithmetic), ties included; what it refuses."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_library_backends import kernel_of

from korch.fission.driver import fission
from korch.kernels.native.topk import topk_spec
from korch.kernels.registry import get_backend


def topk_model(shape, k, axis=-1, largest=1, sorted_=1, outputs=("v", "i"), k_input=True) -> onnx.ModelProto:
    rank = len(shape)
    out_shape = list(shape)
    out_shape[axis] = k
    attrs = {"axis": axis, "largest": largest, "sorted": sorted_}
    inputs = ["x", "k"] if k_input else ["x"]
    if not k_input:
        attrs = {"axis": axis, "k": k}
    node = helper.make_node("TopK", inputs, ["v", "i"], **attrs)
    outs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT if n == "v" else TensorProto.INT64, out_shape)
        for n in outputs
    ]
    inits = [helper.make_tensor("k", TensorProto.INT64, [1], [k])] if k_input else []
    g = helper.make_graph(
        [node], "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))], outs, initializer=inits
    )
    opset = 11 if k_input else 1
    assert rank >= 1
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def native_kernel(model: onnx.ModelProto):
    kg, consts = kernel_of(fission(model))
    backend = get_backend("native")
    if not backend.supports(kg):
        return None, kg, consts
    return backend.build(kg, consts, 2), kg, consts


CASES = [
    dict(shape=(1, 64, 128), k=16),  # the opaque example's router
    dict(shape=(2, 7, 33), k=5, axis=1),  # an inner axis
    dict(shape=(3, 40), k=40, largest=0),  # every element, smallest first
    dict(shape=(5, 300), k=1, outputs=("i",)),  # argmax-like, indices only
    dict(shape=(4, 9), k=3, outputs=("v",), k_input=False),  # opset 1: k an attribute
    dict(shape=(2, 200, 300), k=7, axis=2),  # large enough to split lines over the pool
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c["shape"])) + f"_k{c['k']}")
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_topk_matches_onnxruntime(case, ties):
    model = topk_model(**case)
    kern, kg, consts = native_kernel(model)
    assert kern is not None, "native backend should take a sorted TopK with a constant K"
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case["shape"]).astype(np.float32)
    if ties:  # few distinct values: the order among equal ones is the lower index first
        x = np.round(x * 2).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    args = [x if name not in consts else consts[name] for name in kg.inputs]
    for _ in range(2):
        got = kern(args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_topk_refused_when_unsorted_or_k_computed():
    assert native_kernel(topk_model((2, 10), 3, sorted_=0))[0] is None
    b = fission(topk_model((2, 10), 3))
    kg, _ = kernel_of(b)
    assert topk_spec(kg) is not None
    # K as a runtime input (not an initializer): onnxruntime keeps it
    m = topk_model((2, 10), 3)
    del m.graph.initializer[:]
    m.graph.input.append(helper.make_tensor_value_info("k", TensorProto.INT64, [1]))
    kg2, consts2 = kernel_of(fission(m))
    assert topk_spec(kg2) is None and not get_backend("native").supports(kg2)


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "x".join(map(str, c["shape"])) + f"_k{c['k']}")
def test_device_topk_matches_onnxruntime_with_ties_and_reloads(case, tmp_path):
    """Note [Device TopK]: the cuda target's TopK (torch's stable sort; CPU tensors
    here) equals onnxruntime's values and indices, ties lower index first; it saves and
    loads; on the cuda target it is the TopK's backend and onnxruntime its fallback."""
    pytest.importorskip("torch")
    from korch.ir.subgraph import KernelKind
    from korch.pipeline import _backends_for, _fallback_for

    model = topk_model(**case)
    kg, consts = kernel_of(fission(model))
    backend = get_backend("torch_topk")
    assert backend.supports(kg)
    assert _backends_for(KernelKind.OPAQUE, kg, "cuda") == ("torch_topk",)
    assert _fallback_for(KernelKind.OPAQUE, kg, "cuda", ("torch_topk",)) == ("ort",)
    assert _backends_for(KernelKind.OPAQUE, kg, "cpu") == ("ort",)  # no device backend on the cpu target
    x = np.round(np.random.default_rng(0).standard_normal(case["shape"]) * 2).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    args = [x if name not in consts else consts[name] for name in kg.inputs]
    kern = backend.build(kg, consts, 1)
    loaded = backend.load(kern.save(tmp_path, "k0"), tmp_path, 1)
    for k in (kern, loaded):
        got = k(args)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
