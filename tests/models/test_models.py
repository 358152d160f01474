"""The test models are valid ONNX, run in onnxruntime and give the declared shapes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from korch import models

EXPECTED = {
    "attention": {"x": (1, 64, 128)},
    "mlp": {"x": (1, 64, 128)},
    "candy_block": {"x": (1, 32, 32, 32)},
    "segformer_block": {"x": (1, 256, 64)},
    "yolo_block": {"x": (1, 16, 64, 64)},
    "opaque": {"x": (1, 64, 128)},
}
OUTPUTS = {
    "attention": [(1, 64, 128)],
    "mlp": [(1, 64, 128)],
    "candy_block": [(1, 32, 32, 32)],
    "segformer_block": [(1, 256, 64)],
    "yolo_block": [(1, 16, 64, 64)],
    "opaque": [(1, 64, 16), (1, 64, 128)],
}


def test_names():
    assert models.NAMES == list(EXPECTED)
    with pytest.raises(KeyError):
        models.build("nope")


@pytest.mark.parametrize("name", models.NAMES)
def test_model_checks_and_runs(name, tmp_path):
    model = models.build(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for vi, shape in zip(inferred.graph.output, OUTPUTS[name]):
        assert tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) == shape
    feeds = models.random_inputs(model)
    assert {k: v.shape for k, v in feeds.items()} == EXPECTED[name]
    path = models.save(name, tmp_path / f"{name}.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    assert [o.shape for o in outs] == OUTPUTS[name]
    assert all(np.isfinite(o).all() for o in outs)
    # A fixed seed gives the same model; another seed other weights.
    assert models.build(name).SerializeToString() == model.SerializeToString()
    assert models.build(name, seed=1).SerializeToString() != model.SerializeToString()


def test_opaque_model_holds_an_operator_without_fission():
    ops = {n.op_type for n in models.build("opaque").graph.node}
    assert "TopK" in ops and {"MatMul", "Softmax", "Sigmoid"} <= ops
