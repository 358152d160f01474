"""The frontend: errors a user sees, shape binding, and constant folding.

Numbers are compared with onnxruntime at rtol=1e-4, atol=1e-5 (float32).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch.errors import ModelError
from korch.fission import fission
from korch.frontend import load_model, parse_shape_arg, tensor_types
from korch.ir import Op, evaluate

F = TensorProto.FLOAT


def model_of(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model


def relu_model(shape) -> onnx.ModelProto:
    return model_of(
        [helper.make_node("Relu", ["x"], ["y"], name="relu0")],
        [helper.make_tensor_value_info("x", F, shape)],
        [helper.make_tensor_value_info("y", F, shape)],
    )


def run_ort(model: onnx.ModelProto, feeds: dict) -> dict:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in model.graph.output], sess.run(None, feeds)))


def assert_one_line_error(excinfo, *fragments: str) -> None:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg


# --- shapes ----------------------------------------------------------------------


def test_symbolic_dim_error_names_input_and_dim():
    with pytest.raises(ModelError) as e:
        load_model(relu_model(["batch", 3, "seq"]))
    assert_one_line_error(e, "'x'", "dimension 0", "'batch'", "--shape x=d0,d1,...")


def test_unknown_dim_error():
    m = relu_model([2, 3])
    m.graph.input[0].type.tensor_type.shape.dim[1].Clear()
    with pytest.raises(ModelError) as e:
        load_model(m)
    assert_one_line_error(e, "'x'", "dimension 1", "--shape x=")


def test_binding_shapes():
    m = relu_model(["batch", 3, "seq"])
    loaded = load_model(m, {"x": (2, 3, 5)})
    types = tensor_types(loaded)
    assert types["x"] == ((2, 3, 5), "float32") and types["y"] == ((2, 3, 5), "float32")
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"  # caller's model unchanged


@pytest.mark.parametrize(
    "shapes, fragment",
    [
        ({"x": (2, 3)}, "rank"),
        ({"z": (2, 3, 4)}, "not an input"),
        ({"x": (2, 4, 5)}, "fixes it to 3"),
    ],
)
def test_bad_binding(shapes, fragment):
    with pytest.raises(ModelError) as e:
        load_model(relu_model(["batch", 3, "seq"]), shapes)
    assert_one_line_error(e, fragment)


def test_parse_shape_arg():
    assert parse_shape_arg("x=1,3,224,224") == ("x", (1, 3, 224, 224))
    assert parse_shape_arg("a=b=2") == ("a=b", (2,))
    assert parse_shape_arg("s=") == ("s", ())
    for bad in ("x", "=1,2", "x=1,a", "x=0,2"):
        with pytest.raises(ModelError):
            parse_shape_arg(bad)


# --- malformed files -------------------------------------------------------------


def test_truncated_file(tmp_path):
    m = relu_model([2, 3])
    m.graph.initializer.append(numpy_helper.from_array(np.ones((16, 16), np.float32), "unused"))
    data = m.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError) as e:
        load_model(path)
    assert_one_line_error(e, str(path), "not a valid ONNX file")


def test_not_onnx_and_missing(tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 10)
    with pytest.raises(ModelError) as e:
        load_model(text)
    assert_one_line_error(e, "notes.onnx")
    with pytest.raises(ModelError) as e:
        load_model(tmp_path / "absent.onnx")
    assert_one_line_error(e, "absent.onnx")


def test_dangling_input():
    m = model_of(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="add0")],
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    with pytest.raises(ModelError) as e:
        load_model(m)
    assert_one_line_error(e, "'add0'", "Add", "'ghost'")


def test_cycle():
    m = model_of(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="add0"),
            helper.make_node("Relu", ["a"], ["b"], name="relu0"),
            helper.make_node("Relu", ["x"], ["y"], name="relu1"),
        ],
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    with pytest.raises(ModelError) as e:
        load_model(m)
    assert_one_line_error(e, "cycle", "node '")


def test_unsorted_nodes_are_sorted():
    m = model_of(
        [helper.make_node("Relu", ["a"], ["y"], name="second"), helper.make_node("Neg", ["x"], ["a"], name="first")],
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    assert [n.name for n in load_model(m).graph.node] == ["first", "second"]


def test_unknown_domain_op():
    m = model_of(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="frob0", domain="acme.ops")],
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
        extra_opsets=[("acme.ops", 1)],
    )
    with pytest.raises(ModelError) as e:
        load_model(m)
    assert_one_line_error(e, "'frob0'", "acme.ops.Frobnicate", "onnxruntime cannot run it")


def test_unknown_default_domain_op():
    m = model_of(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="frob0")],
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    with pytest.raises(ModelError) as e:
        load_model(m)
    assert_one_line_error(e, "frob0", "Frobnicate")


def test_shape_inference_error():
    m = model_of(
        [helper.make_node("Add", ["x", "z"], ["y"], name="add0")],
        [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("z", F, [4, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
    )
    with pytest.raises(ModelError) as e:
        load_model(m)
    assert_one_line_error(e, "shape inference failed", "add0")


# --- folding ---------------------------------------------------------------------


def torch_like_model() -> onnx.ModelProto:
    """y = Pad(Reshape(x, [N, -1]), pads from Shape(x)), as torch exports dynamic sizes."""
    i64 = lambda *v: numpy_helper.from_array(np.array(v, np.int64))  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape0"),
        helper.make_node("Constant", [], ["zero"], value=i64(0), name="const0"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0, name="gather0"),
        helper.make_node("Constant", [], ["minus1"], value=i64(-1), name="const1"),
        helper.make_node("Concat", ["n", "minus1"], ["new_shape"], axis=0, name="concat0"),
        helper.make_node("Reshape", ["x", "new_shape"], ["flat"], name="reshape0"),
        helper.make_node("Size", ["x"], ["size"], name="size0"),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(8, np.int64)), name="const2"),
        helper.make_node("Div", ["size", "k"], ["pad_amount"], name="div0"),
        helper.make_node("Unsqueeze", ["pad_amount", "zero"], ["pad_vec"], name="unsq0"),
        helper.make_node("Concat", ["zero", "zero", "zero", "pad_vec"], ["pads"], axis=0, name="concat1"),
        helper.make_node("Pad", ["flat", "pads"], ["padded"], name="pad0"),
        helper.make_node("Relu", ["padded"], ["y"], name="relu0"),
    ]
    return model_of(
        nodes,
        [helper.make_tensor_value_info("x", F, ["N", 3, "W"])],
        [helper.make_tensor_value_info("y", F, ["N", "K"])],
    )


def test_folding_shape_chain():
    m = torch_like_model()
    loaded = load_model(m, {"x": (2, 3, 8)})
    ops = [n.op_type for n in loaded.graph.node]
    assert ops == ["Reshape", "Pad", "Relu"], ops
    inits = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert inits["new_shape"].tolist() == [2, -1]
    assert inits["pads"].tolist() == [0, 0, 0, 6]
    assert tensor_types(loaded)["y"] == ((2, 30), "float32")
    graph = fission(loaded)
    assert not any(n.op is Op.OPAQUE for n in graph.nodes)
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    got = evaluate(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, run_ort(m, {"x": x})["y"], rtol=1e-4, atol=1e-5)


def test_constant_nodes_and_constant_subgraphs_fold():
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    nodes = [
        helper.make_node("Constant", [], ["c"], value_float=2.0, name="const0"),
        helper.make_node("Transpose", ["w"], ["wt"], name="t0"),
        helper.make_node("Mul", ["wt", "c"], ["w2"], name="mul0"),
        helper.make_node("MatMul", ["x", "w2"], ["y"], name="mm0"),
    ]
    m = model_of(
        nodes, [helper.make_tensor_value_info("x", F, [4, 3])], [helper.make_tensor_value_info("y", F, [4, 2])], [w]
    )
    loaded = load_model(m)
    assert [n.op_type for n in loaded.graph.node] == ["MatMul"]
    assert [t.name for t in loaded.graph.initializer] == ["w2"]  # w was only read by folded nodes
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), 2 * np.arange(6).reshape(2, 3).T)


def test_dead_nodes_pruned_and_initializer_inputs_dropped():
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    m = model_of(
        [helper.make_node("Add", ["x", "w"], ["y"]), helper.make_node("Neg", ["x"], ["unused"])],
        [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("w", F, [3])],
        [helper.make_tensor_value_info("y", F, [3])],
        [w],
    )
    loaded = load_model(m)
    assert [n.op_type for n in loaded.graph.node] == ["Add"]
    assert [i.name for i in loaded.graph.input] == ["x"]


def test_types_learned_when_onnx_cannot_infer():
    """ONNX infers no shape for GroupNormalization; the frontend asks onnxruntime."""
    s = numpy_helper.from_array(np.ones(4, np.float32), "s")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    m = model_of(
        [
            helper.make_node("GroupNormalization", ["x", "s", "b"], ["g"], num_groups=2, name="gn0"),
            helper.make_node("Relu", ["g"], ["y"], name="relu0"),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 4, 5])],
        [helper.make_tensor_value_info("y", F, ["N", 4, 5])],
        [s, b],
        opset=21,
    )
    loaded = load_model(m, {"x": (3, 4, 5)})
    types = tensor_types(loaded)
    assert types["g"] == ((3, 4, 5), "float32") and types["y"] == ((3, 4, 5), "float32")
