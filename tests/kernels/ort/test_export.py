"""to_onnx: every primitive exported to ONNX computes what korch.ir.evaluate computes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from korch.ir import Graph, GraphBuilder, Op, evaluate, verify
from korch.kernels.ort import export as to_onnx_mod
from korch.kernels.ort.export import to_onnx


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def check(graph: Graph, feeds: dict[str, np.ndarray], rtol=1e-5, atol=1e-6, opset=20, const_inputs=None):
    verify(graph)
    model = to_onnx(graph, const_inputs=const_inputs, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    want = evaluate(graph, {**feeds, **(const_inputs or {})})
    got = _run(model, feeds)
    assert set(got) == set(graph.outputs)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
    return model


def _optimized_ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The operators of the graph onnxruntime runs after its own fusions."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node]


rng = np.random.default_rng(0)


def randn(*shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def test_elementwise_float():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    y = b.input("y", (3, 4), "float32")
    ax = b.unary(Op.ABS, x)
    pos = b.add(Op.ADD, [ax, b.scalar(1.0, x)])
    unary = {
        "neg": b.unary(Op.NEG, x),
        "exp": b.unary(Op.EXP, x),
        "log": b.unary(Op.LOG, pos),
        "sqrt": b.unary(Op.SQRT, pos),
        "recip": b.unary(Op.RECIPROCAL, pos),
        "tanh": b.unary(Op.TANH, x),
        "erf": b.unary(Op.ERF, x),
        "sigmoid": b.unary(Op.SIGMOID, x),
        "abs": ax,
        "floor": b.unary(Op.FLOOR, x),
        "ceil": b.unary(Op.CEIL, x),
    }
    binary = {op.value: b.add(op, [x, y]) for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN)}
    binary["pow"] = b.add(Op.POW, [pos, y])
    binary["pow_scalar"] = b.add(Op.POW, [x, b.scalar(2.0, x)])
    binary["scaled"] = b.add(Op.MUL, [x, b.const(np.array(0.1, dtype="float64"))])  # float64 scalar
    lt = b.add(Op.LESS, [x, y])
    gt = b.add(Op.GREATER, [x, y])
    eq = b.add(Op.EQUAL, [b.unary(Op.FLOOR, x), b.unary(Op.CEIL, x)])
    logic = {
        "lt": lt,
        "gt": gt,
        "eq": eq,
        "not": b.unary(Op.NOT, lt),
        "and": b.add(Op.AND, [lt, gt]),
        "or": b.add(Op.OR, [lt, eq]),
        "where": b.add(Op.WHERE, [lt, x, y]),
        "where_scalar": b.add(Op.WHERE, [gt, x, b.scalar(0.0, x)]),
    }
    for name, nid in {**unary, **binary, **logic}.items():
        b.output(name, nid)
    check(b.graph, {"x": randn(3, 4), "y": randn(3, 4)})


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 0 / 0 in the interpreter
def test_cast_and_integer_ops():
    b = GraphBuilder()
    x = b.input("x", (2, 5), "float32")
    i = b.input("i", (2, 5), "int64")
    j = b.input("j", (2, 5), "int64")
    b.output("to_i32", b.unary(Op.CAST, x, to="int32"))
    b.output("to_bool", b.unary(Op.CAST, x, to="bool"))
    b.output("to_f16", b.unary(Op.CAST, x, to="float16"))
    b.output("div", b.add(Op.DIV, [i, j]))  # truncating
    b.output("add", b.add(Op.ADD, [i, j]))
    b.output("neg", b.unary(Op.NEG, i))
    b.output("exp_int", b.unary(Op.EXP, b.unary(Op.CAST, i, to="int32")))  # computed in float64
    b.output("floor_int", b.unary(Op.FLOOR, i))
    b.output("half", b.add(Op.MUL, [i, b.const(np.array(0.5))]))  # int * 0.5 computed in float64
    b.output("twice", b.add(Op.MUL, [i, b.const(np.array(2.0))]))
    i8 = b.unary(Op.CAST, i, to="int8")
    b.output("i8_neg_max", b.add(Op.MAX, [b.unary(Op.NEG, i8), i8]))
    b.output("u8_add", b.add(Op.ADD, [b.unary(Op.CAST, i, to="uint8"), b.unary(Op.CAST, j, to="uint8")]))
    bx = b.unary(Op.CAST, x, to="bool")
    b.output("bool_sum", b.add(Op.REDUCE_SUM, [b.unary(Op.CAST, bx, to="int32")], axes=(1,)))
    b.output("bool_max", b.add(Op.REDUCE_MAX, [bx], axes=(0,)))
    b.output("less_bool", b.add(Op.LESS, [bx, b.unary(Op.NOT, bx)]))
    ii = rng.integers(-20, 20, (2, 5))
    jj = rng.integers(1, 7, (2, 5)) * rng.choice([-1, 1], (2, 5))
    jj[1, 1] = 0  # integer division by zero must not crash (numpy: trunc(a / b) in float64)
    ii[1, 1] = 0
    xx = randn(2, 5) * 3
    xx[0, 0] = 0.0
    check(b.graph, {"x": xx, "i": ii, "j": jj})


@pytest.mark.parametrize("opset", [11, 13, 17, 20])
def test_reduce(opset):
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4), "float32")
    b.output("sum1", b.reduce(Op.REDUCE_SUM, x, [1]))
    b.output("sum02", b.reduce(Op.REDUCE_SUM, x, [0, 2]))
    b.output("max", b.reduce(Op.REDUCE_MAX, x, [2]))
    b.output("min_all", b.reduce(Op.REDUCE_MIN, x, [0, 1, 2]))
    b.output("sum_nokeep", b.reduce(Op.REDUCE_SUM, x, [2], keepdims=False))
    b.output("isum", b.reduce(Op.REDUCE_SUM, b.unary(Op.CAST, x, to="int8"), [2]))  # int8: computed wider
    check(b.graph, {"x": randn(2, 3, 4)}, opset=opset)


def test_broadcast_reshape_transpose_concat():
    b = GraphBuilder()
    x = b.input("x", (2, 3), "float32")
    v = b.input("v", (3,), "float32")
    b.output("bias", b.binary(Op.ADD, x, v))  # RESHAPE + BROADCAST
    b.output("bcast", b.add(Op.BROADCAST, [b.reshape(x, (2, 1, 3))], shape=(2, 4, 3)))
    b.output("t", b.transpose(x, (1, 0)))
    b.output("r", b.reshape(x, (3, 2)))
    b.output("cat", b.add(Op.CONCAT, [x, b.unary(Op.NEG, x), x], axis=1))
    b.output("cat0", b.add(Op.CONCAT, [x, x], axis=0))
    check(b.graph, {"x": randn(2, 3), "v": randn(3)})


def test_slice():
    b = GraphBuilder()
    x = b.input("x", (5, 6, 4), "float32")
    cases = {
        "pos": ((1, 0, 0), (2, 1, 1), (2, 6, 4)),
        "rev": ((4, 5, 3), (-1, -1, -1), (5, 6, 4)),  # end lands at -1: "past the beginning"
        "rev_step2": ((4, 5, 0), (-2, -3, 1), (3, 2, 4)),
        "mid_rev": ((3, 4, 2), (-1, -2, -1), (2, 2, 2)),
        "one": ((4, 5, 3), (-1, 7, 1), (1, 1, 1)),
        "full": ((0, 0, 0), (1, 1, 1), (5, 6, 4)),
        "step3": ((0, 1, 1), (3, 2, 2), (2, 3, 2)),
    }
    for name, (starts, steps, lengths) in cases.items():
        b.output(name, b.add(Op.SLICE, [x], starts=starts, steps=steps, lengths=lengths))
    check(b.graph, {"x": randn(5, 6, 4)})


def test_pad():
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4), "float32")
    b.output("const", b.add(Op.PAD, [x], pads=((0, 0), (1, 2), (2, 0)), mode="constant", value=1.5))
    b.output("zero", b.add(Op.PAD, [x], pads=((1, 0), (0, 0), (0, 3))))
    b.output("reflect", b.add(Op.PAD, [x], pads=((0, 0), (2, 1), (3, 3)), mode="reflect"))
    b.output("edge", b.add(Op.PAD, [x], pads=((0, 1), (2, 1), (5, 0)), mode="edge"))
    i = b.unary(Op.CAST, x, to="int64")
    b.output("int_pad", b.add(Op.PAD, [i], pads=((0, 0), (1, 1), (1, 1)), mode="constant", value=7))
    check(b.graph, {"x": randn(2, 3, 4)})


def test_gather():
    b = GraphBuilder()
    x = b.input("x", (4, 5, 3), "float32")
    b.output("g1", b.add(Op.GATHER, [x], axis=1, indices=(4, 0, 0, 2), indices_shape=(4,)))
    b.output("g2", b.add(Op.GATHER, [x], axis=0, indices=(3, 1, 2, 0, 1, 1), indices_shape=(2, 3)))
    b.output("g0", b.add(Op.GATHER, [x], axis=2, indices=(1,), indices_shape=()))
    check(b.graph, {"x": randn(4, 5, 3)})


@pytest.mark.parametrize("limit,opset", [(1 << 20, 20), (0, 20), (0, 11)], ids=["gather", "slices", "slices_opset11"])
def test_window(monkeypatch, limit, opset):
    monkeypatch.setattr(to_onnx_mod, "_WINDOW_GATHER_LIMIT", limit)
    b = GraphBuilder()
    x = b.input("x", (2, 3, 9, 8), "float32")
    b.output("w", b.add(Op.WINDOW, [x], kernel=(3, 2), strides=(2, 1), dilations=(1, 2)))
    b.output("w1", b.add(Op.WINDOW, [x], kernel=(4,), strides=(3,), dilations=(1,)))
    b.output("w3", b.add(Op.WINDOW, [x], kernel=(1, 3, 3), strides=(1, 1, 2), dilations=(1, 1, 1)))
    check(b.graph, {"x": randn(2, 3, 9, 8)}, opset=opset)


def test_matmul_conv():
    b = GraphBuilder()
    a = b.input("a", (4, 6), "float32")
    ab = b.input("ab", (3, 4, 6), "float32")
    w = b.const(randn(6, 5), name="w")
    wb = b.input("wb", (3, 6, 5), "float32")
    b.output("mm", b.add(Op.MATMUL, [a, w]))
    b.output("bmm_shared", b.add(Op.MATMUL, [ab, w]))
    b.output("bmm", b.add(Op.MATMUL, [ab, wb]))
    x = b.input("x", (2, 4, 9, 8), "float32")
    k = b.const(randn(6, 2, 3, 3), name="k")
    b.output("conv_g", b.add(Op.CONV, [x, k], strides=(2, 1), dilations=(1, 2), pads=(1, 0, 2, 1), group=2))
    kd = b.const(randn(4, 1, 3, 3), name="kd")
    b.output("conv_dw", b.add(Op.CONV, [x, kd], strides=(1, 1), dilations=(1, 1), pads=(1, 1, 1, 1), group=4))
    x1 = b.input("x1", (1, 3, 10), "float32")
    k1 = b.const(randn(2, 3, 4), name="k1")
    b.output("conv1d", b.add(Op.CONV, [x1, k1], strides=(2,), dilations=(1,), pads=(1, 2), group=1))
    check(
        b.graph,
        {"a": randn(4, 6), "ab": randn(3, 4, 6), "wb": randn(3, 6, 5), "x": randn(2, 4, 9, 8), "x1": randn(1, 3, 10)},
        rtol=1e-4,
        atol=1e-5,
    )


def test_other_dtypes():
    b = GraphBuilder()
    x = b.input("x", (2, 3, 5, 5), "float16")
    k = b.const(randn(4, 3, 3, 3, dtype="float16"), name="k")
    y = b.add(Op.CONV, [x, k], strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)
    b.output("h_conv", y)
    b.output("h_erf", b.unary(Op.ERF, x))
    d = b.input("d", (2, 3, 5, 5), "float64")
    kd = b.const(randn(4, 3, 3, 3, dtype="float64"), name="kd")
    b.output("d_conv", b.add(Op.CONV, [d, kd], strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1))
    b.output("d_erf", b.unary(Op.ERF, d))
    b.output("d_sum", b.reduce(Op.REDUCE_SUM, d, [3]))
    i = b.input("i", (4, 5), "int32")
    b.output("i_mm", b.add(Op.MATMUL, [i, b.const(rng.integers(-3, 3, (5, 2)).astype("int32"), name="iw")]))
    check(
        b.graph,
        {
            "x": randn(2, 3, 5, 5, dtype="float16"),
            "d": randn(2, 3, 5, 5, dtype="float64"),
            "i": rng.integers(-9, 9, (4, 5)).astype("int32"),
        },
        rtol=2e-3,
        atol=2e-3,
    )


def _opaque_node_bytes(op_type, n_in, n_out, **attrs) -> bytes:
    node = helper.make_node(op_type, [f"in{i}" for i in range(n_in)], [f"out{j}" for j in range(n_out)], **attrs)
    return node.SerializeToString()


def test_opaque_single_and_multi_output():
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    e = b.unary(Op.EXP, x)
    sm = _opaque_node_bytes("Softmax", 1, 1, axis=-1)
    s = b.add(Op.OPAQUE, [e], node=sm, opset=(("", 13),), out_index=0, shape=(3, 8), dtype="float32")
    k = b.const(np.array([3], dtype=np.int64), name="k")
    topk = _opaque_node_bytes("TopK", 2, 2, axis=1)
    v = b.add(Op.OPAQUE, [s, k], node=topk, opset=(("", 13),), out_index=0, shape=(3, 3), dtype="float32")
    i = b.add(Op.OPAQUE, [s, k], node=topk, opset=(("", 13),), out_index=1, shape=(3, 3), dtype="int64")
    b.output("values", b.unary(Op.NEG, v))
    b.output("indices", i)
    b.output("softmax", s)
    b.output("softmax_again", s)  # one node, two outputs
    b.output("x_too", x)  # an input as output
    b.output("k_too", k)  # a constant as output
    model = check(b.graph, {"x": randn(3, 8)})
    assert sum(n.op_type == "TopK" for n in model.graph.node) == 1  # emitted once
    assert {o.domain: o.version for o in model.opset_import}[""] == 13  # the opaque nodes' opset


def test_opaque_optional_input():
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    lo = b.const(np.array(-0.5, dtype="float32"))
    node = helper.make_node("Clip", ["in0", "", "in1"], ["out0"]).SerializeToString()
    hi = b.input("hi", (), "float32")
    c = b.add(Op.OPAQUE, [x, hi], node=node, opset=(("", 17),), out_index=0, shape=(4, 6), dtype="float32")
    b.output("y", b.add(Op.MAX, [c, lo]))
    check(b.graph, {"x": randn(4, 6), "hi": np.array(0.3, dtype="float32")}, opset=17)


def test_const_inputs_become_initializers():
    b = GraphBuilder()
    x = b.input("in0", (4, 6), "float32")
    w = b.input("in1_c", (6, 3), "float32")
    bias = b.input("in2_c", (3,), "float32")
    y = b.binary(Op.ADD, b.add(Op.MATMUL, [x, w]), bias)
    b.output("out0", b.add(Op.MAX, [y, b.scalar(0.0, y)]))
    consts = {"in1_c": randn(6, 3), "in2_c": randn(3)}
    model = check(b.graph, {"in0": randn(4, 6)}, const_inputs=consts)
    assert [i.name for i in model.graph.input] == ["in0"]
    assert {"in1_c", "in2_c"} <= {t.name for t in model.graph.initializer}


def test_dead_nodes_are_dropped():
    b = GraphBuilder()
    x = b.input("x", (4,), "float32")
    b.unary(Op.EXP, x)
    b.output("y", b.unary(Op.NEG, x))
    model = check(b.graph, {"x": randn(4)})
    assert [n.op_type for n in model.graph.node] == ["Neg"]


def test_broadcasts_and_scalars_feeding_layout_ops():
    b = GraphBuilder()
    x = b.input("x", (3, 1), "float32")
    y = b.input("y", (1, 4), "float32")
    # both operands broadcast: one Expand must stay
    b.output("outer", b.binary(Op.MUL, x, y))
    s = b.const(np.array(2.5, dtype="float32"))
    s2 = b.add(Op.BROADCAST, [b.reshape(s, (1, 1))], shape=(3, 4))
    b.output("plus_s", b.add(Op.ADD, [s2, b.add(Op.BROADCAST, [x], shape=(3, 4))]))
    b.output(
        "where",
        b.add(
            Op.WHERE,
            [
                b.add(Op.BROADCAST, [b.add(Op.LESS, [y, b.scalar(0.0, y)])], shape=(3, 4)),
                b.add(Op.BROADCAST, [x], shape=(3, 4)),
                s2,
            ],
        ),
    )
    b.output("total", b.reshape(b.reduce(Op.REDUCE_SUM, x, [0, 1]), ()))  # a rank-0 output
    b.output("scalar", s)  # a rank-0 constant as output
    check(b.graph, {"x": randn(3, 1), "y": randn(1, 4)})


def test_bias_and_relu_reach_onnxruntime_unexpanded():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6), "float32")
    w = b.const(randn(8, 4, 3, 3), name="w")
    y = b.add(Op.CONV, [x, w], strides=(1, 1), dilations=(1, 1), pads=(1, 1, 1, 1), group=1)
    y = b.binary(Op.ADD, y, b.reshape(b.const(randn(8), name="bias"), (8, 1, 1)))
    b.output("y", b.add(Op.MAX, [y, b.scalar(0.0, y)]))
    model = check(b.graph, {"x": randn(1, 4, 6, 6)}, rtol=1e-4, atol=1e-5)
    ops = [n.op_type for n in model.graph.node]
    assert "Expand" not in ops and "Relu" in ops


@pytest.mark.parametrize("const_first", [True, False])
def test_a_constant_operand_goes_second_so_onnxruntime_fuses_it_into_the_conv(const_first, tmp_path):
    """Add(B, Conv(x)) is not fused by onnxruntime (Add(Conv(x), B) is), and the Add left
    over breaks its NCHWc chain: the export puts a constant operand of ADD/MUL second."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 8, 8), "float32")
    y = b.add(
        Op.CONV, [x, b.const(randn(32, 16, 1, 1), name="w")], strides=(1, 1), dilations=(1, 1), pads=(0,) * 4, group=1
    )
    bias = b.reshape(b.const(randn(32), name="bias"), (32, 1, 1))
    y = b.binary(Op.ADD, bias, y) if const_first else b.binary(Op.ADD, y, bias)
    scale = b.const(randn(1, 32, 1, 1), name="scale")
    y = b.binary(Op.MUL, scale, y) if const_first else b.binary(Op.MUL, y, scale)
    b.output("y", b.add(Op.MAX, [y, b.scalar(0.0, y)]))
    model = check(b.graph, {"x": randn(1, 16, 8, 8)}, rtol=1e-4, atol=1e-5)
    (conv,) = [n for n in model.graph.node if n.op_type == "Conv"]
    (add,) = [n for n in model.graph.node if n.op_type == "Add"]
    assert add.input[0] == conv.output[0]
    ops = _optimized_ops(model, tmp_path)
    assert "Add" not in ops and "Mul" not in ops, ops


def test_a_constant_added_after_a_conv_sum_is_added_to_the_conv(tmp_path):
    """(rest + (Conv(x) + B1)) + B2, then Relu, goes out as ((conv + B1) + B2) + rest:
    onnxruntime folds both biases into its NCHWc Conv, accumulates into rest and fuses
    the Relu; as written, the last Add and the Relu ran unblocked between two reorders."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 8, 8), "float32")
    x2 = b.input("x2", (1, 16, 8, 8), "float32")
    rest = b.add(  # blocked too: a Conv's output
        Op.CONV, [x2, b.const(randn(32, 16, 3, 3), name="w2")], strides=(1, 1), dilations=(1, 1), pads=(1,) * 4, group=1
    )
    y = b.add(
        Op.CONV, [x, b.const(randn(32, 16, 1, 1), name="w")], strides=(1, 1), dilations=(1, 1), pads=(0,) * 4, group=1
    )
    y = b.binary(Op.ADD, b.reshape(b.const(randn(32), name="b1"), (32, 1, 1)), y)
    y = b.binary(Op.ADD, rest, y)
    y = b.binary(Op.ADD, y, b.const(randn(1, 32, 1, 1), name="b2"))
    b.output("y", b.add(Op.MAX, [y, b.scalar(0.0, y)]))
    model = check(b.graph, {"x": randn(1, 16, 8, 8), "x2": randn(1, 16, 8, 8)}, rtol=1e-4, atol=1e-5)
    (b2,) = [n for n in model.graph.node if n.op_type == "Add" and "b2" in n.input]
    assert [n.op_type for n in model.graph.node if b2.output[0] in n.input] == ["Add"]  # then the Sum
    ops = _optimized_ops(model, tmp_path)
    assert "Add" not in ops and "Relu" not in ops, ops


def test_nearest_upsample_gathers_become_resize():
    """fission's nearest Resize (a GATHER per axis) goes back to onnxruntime as Resize,
    which it runs in its blocked layout (two chained, on different axes: one Resize); a
    gather that is not an integer upsample stays."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 4, 5), "float32")
    h = b.add(Op.GATHER, [x], axis=2, indices=tuple(np.arange(8) // 2), indices_shape=(8,))
    b.output("up", b.add(Op.GATHER, [h], axis=3, indices=tuple(np.arange(15) // 3), indices_shape=(15,)))
    b.output("other", b.add(Op.GATHER, [x], axis=2, indices=(0, 0, 1, 2, 2, 3, 3, 3), indices_shape=(8,)))
    model = check(b.graph, {"x": randn(1, 3, 4, 5)})
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Resize") == 1 and ops.count("Gather") == 1


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]},  # yolo's SPPF
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},  # ResNet's stem
        {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},  # extra end padding
        {"kernel_shape": [2, 2], "dilations": [2, 1]},
    ],
    ids=["sppf", "stem", "ceil", "dilated"],
)
def test_fissioned_max_pool_goes_back_as_max_pool(attrs):
    """PAD(-inf) + WINDOW + REDUCE_MAX + RESHAPE is exported as one MaxPool (an im2col
    Gather and a ReduceMax in onnxruntime are 30x slower) with the original's values."""
    from korch.fission import fission

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 9, 11])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    orig = helper.make_model(
        helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    orig.ir_version = 8
    orig = onnx.shape_inference.infer_shapes(orig)
    graph = fission(orig)
    feeds = {"x": randn(1, 4, 9, 11)}
    model = check(graph, feeds)
    assert [n.op_type for n in model.graph.node if n.op_type not in ("Identity",)] == ["MaxPool"]
    np.testing.assert_array_equal(_run(model, feeds)["y"], _run(orig, feeds)["y"])


@pytest.mark.parametrize(
    "op_type,attrs,opset",
    [
        ("HardSwish", {}, 17),
        ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, 17),
        ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, 13),
    ],
)
def test_fissioned_hard_activations_go_back_as_operators(op_type, attrs, opset):
    """fission's Add/Max/Min/Mul form of HardSigmoid and HardSwish is exported as the
    operator, which onnxruntime fuses into a Conv (below opset 14, HardSwish is
    HardSigmoid times x)."""
    from korch.fission import fission

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 5])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, 5])
    orig = helper.make_model(
        helper.make_graph([helper.make_node(op_type, ["x"], ["y"], **attrs)], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    orig.ir_version = 8
    graph = fission(orig)
    assert len(graph.compute_ids()) >= 4
    feeds = {"x": randn(2, 3, 5) * 4}
    model = check(graph, feeds)
    assert [n.op_type for n in model.graph.node] == [op_type]
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=1e-6, atol=1e-6)


def test_hard_swish_below_opset_14_and_shared_inner_nodes():
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    z = b.binary(Op.ADD, b.binary(Op.MUL, x, b.scalar(1 / 6, x)), b.scalar(0.5, x))
    h = b.binary(Op.MIN, b.binary(Op.MAX, z, b.scalar(0.0, x)), b.scalar(1.0, x))
    b.output("y", b.binary(Op.MUL, x, h))
    model = check(b.graph, {"x": randn(4, 6) * 4}, opset=13)
    assert [n.op_type for n in model.graph.node] == ["HardSigmoid", "Mul"]
    b.output("z", z)  # an inner node used outside: nothing is raised
    model = check(b.graph, {"x": randn(4, 6) * 4})
    assert "HardSigmoid" not in [n.op_type for n in model.graph.node]


def _fission_of(nodes, inputs, out_shape, opset=17, inits=()):
    from korch.fission import fission

    vi = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs]
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out_shape)
    orig = helper.make_model(
        helper.make_graph(nodes, "g", vi, [y], initializer=list(inits)), opset_imports=[helper.make_opsetid("", opset)]
    )
    orig.ir_version = 8
    return orig, fission(orig)


def test_fissioned_softmax_goes_back_as_softmax():
    """fission's REDUCE_MAX/SUB/EXP/REDUCE_SUM/DIV over the last axis is exported as one
    Softmax; over another axis (or with an inner tensor used elsewhere) it stays."""
    orig, graph = _fission_of([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", [2, 3, 7])], [2, 3, 7])
    assert len(graph.compute_ids()) >= 5
    feeds = {"x": randn(2, 3, 7) * 3}
    model = check(graph, feeds)
    assert [n.op_type for n in model.graph.node] == ["Softmax"]
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=1e-6, atol=1e-7)
    _, graph = _fission_of([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", [2, 3, 7])], [2, 3, 7])
    model = check(graph, feeds)
    assert "Softmax" not in [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("bias", [True, False])
def test_fissioned_layer_norm_goes_back_as_layer_normalization(bias):
    """fission's eleven-primitive LayerNormalization (scale and bias reshaped to
    [1, 1, C] by fission) is exported as the opset-17 operator with [C] weights; below
    opset 17 it stays as primitives."""
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(randn(8), "s")] + ([numpy_helper.from_array(randn(8), "b")] if bias else [])
    node = helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if bias else []), ["y"], axis=-1, epsilon=1e-5)
    orig, graph = _fission_of([node], [("x", [2, 5, 8])], [2, 5, 8], inits=inits)
    feeds = {"x": randn(2, 5, 8) * 2 + 1}
    model = check(graph, feeds, rtol=1e-5, atol=1e-5)
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization"]
    assert [list(i.dims) for i in model.graph.initializer] == [[8]] * (2 if bias else 1)
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=1e-5, atol=1e-5)
    model = check(graph, feeds, opset=16, rtol=1e-5, atol=1e-5)
    assert "LayerNormalization" not in [n.op_type for n in model.graph.node]


def test_fissioned_2d_nearest_upsample_goes_back_as_one_resize():
    """fission's nearest 2x Resize (a Gather per spatial axis) is exported as one Resize
    (each Gather alone would be one Resize per axis: candy_b1's two upsamples ran as
    four)."""
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    orig, graph = _fission_of([node], [("x", [1, 3, 4, 5])], [1, 3, 8, 10], opset=13, inits=inits)
    assert sum(graph.nodes[i].op is Op.GATHER for i in graph.compute_ids()) == 2
    feeds = {"x": randn(1, 3, 4, 5)}
    model = check(graph, feeds)
    assert [n.op_type for n in model.graph.node] == ["Resize"]
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=0, atol=0)


@pytest.mark.parametrize("opset", [13, 17])
def test_fissioned_instance_norm_goes_back_as_instance_normalization(opset):
    """fission's InstanceNormalization (the LayerNorm chain over H, W with per-channel
    scale and B) is exported as the operator at any opset, its weights flattened to [C]
    (candy_b1's 15 instance norms: 45.9 ms in onnxruntime spelled out, 42.6 as operators)."""
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(randn(3), "s"), numpy_helper.from_array(randn(3), "b")]
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)
    orig, graph = _fission_of([node], [("x", [2, 3, 5, 7])], [2, 3, 5, 7], opset=opset, inits=inits)
    feeds = {"x": randn(2, 3, 5, 7) * 2 + 1}
    model = check(graph, feeds, rtol=1e-5, atol=1e-5)
    assert [n.op_type for n in model.graph.node if n.op_type != "Reshape"] == ["InstanceNormalization"]
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_bias_of_a_batched_matmul_is_exported_unreshaped():
    """Add(MatMul(x[1, T, K], W), b[N]) keeps b as [N] (fission reshapes it to [1, 1, N]),
    the form onnxruntime fuses into one Gemm."""
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(randn(6, 4), "w"), numpy_helper.from_array(randn(4), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    _, graph = _fission_of(nodes, [("x", [1, 5, 6])], [1, 5, 4], inits=inits)
    model = check(graph, {"x": randn(1, 5, 6)}, rtol=1e-5, atol=1e-5)
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add"]
    assert sorted(list(i.dims) for i in model.graph.initializer) == [[4], [6, 4]]


def test_fissioned_global_average_pool_goes_back_as_the_operator():
    """REDUCE_SUM over H, W divided by H * W is exported as GlobalAveragePool, which
    onnxruntime keeps in its blocked layout after a Conv."""
    orig, graph = _fission_of(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])], [("x", [2, 3, 5, 7])], [2, 3, 1, 1]
    )
    feeds = {"x": randn(2, 3, 5, 7)}
    model = check(graph, feeds)
    assert [n.op_type for n in model.graph.node] == ["GlobalAveragePool"]
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("out_hw", [(12, 20), (12, 5)])
def test_fissioned_bilinear_resize_goes_back_as_one_resize(mode, out_hw):
    """fission's per-axis Gathers and weights of a linear Resize over H and W are
    exported as one Resize with the coordinate mode that reproduces the weights."""
    from onnx import numpy_helper

    sizes = numpy_helper.from_array(np.array([1, 3, *out_hw], np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", coordinate_transformation_mode=mode)
    orig, graph = _fission_of([node], [("x", [1, 3, 6, 10])], [1, 3, *out_hw], opset=17, inits=[sizes])
    feeds = {"x": randn(1, 3, 6, 10)}
    model = check(graph, feeds, rtol=1e-5, atol=1e-6)
    assert [n.op_type for n in model.graph.node] == ["Resize"]
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=1e-5, atol=1e-6)
    # as a kernel (what a library region exports): the weights are inputs with values
    from korch.ir.subgraph import extract, make_kernel

    k = make_kernel(graph, graph.users(), graph.compute_ids())
    consts = {f"in{i}_c": graph.const_value(s) for i, s in enumerate(k.inputs) if graph.nodes[s].op is Op.CONST}
    assert consts
    kernel_model = to_onnx(extract(graph, k), const_inputs=consts)
    assert [n.op_type for n in kernel_model.graph.node] == ["Resize"]


def test_space_to_depth_convolution_goes_back_as_the_operators():
    """The space-to-depth rewrite's reshape / 6-D transpose / reshape pairs are exported
    as SpaceToDepth and DepthToSpace (onnxruntime's generic Transpose moved Candy's
    input 4.6 ms, its SpaceToDepth 0.5 ms), and the graph still matches the conv."""
    from korch.rewrite import RULES_BY_NAME, apply_rule

    b = GraphBuilder()
    x = b.input("x", (1, 5, 12, 14), "float32")
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(4, 4, 4, 4), group=1)
    b.output("y", b.add(Op.CONV, [x, b.const(randn(3, 5, 9, 9))], **attrs))
    g = apply_rule(b.graph, RULES_BY_NAME["conv_few_outputs_space_to_depth"])
    assert g is not None
    feeds = {"x": randn(1, 5, 12, 14)}
    model = check(g, feeds, rtol=1e-4, atol=1e-4)  # values up to ~30, sums of 405 products
    ops = [n.op_type for n in model.graph.node]
    assert "SpaceToDepth" in ops and "DepthToSpace" in ops and "Transpose" not in ops
    np.testing.assert_allclose(_run(model, feeds)["y"], evaluate(b.graph, feeds)["y"], rtol=1e-4, atol=1e-4)


def _attention_model(form: str, b=2, s=5, n=2, h=4, mask=False, shared_q=False):
    """Self-attention as torch exports it: Hugging Face BERT's three projections
    (``form="bert"``) or timm's fused qkv (``form="timm"``), scale on the scores or on
    q and k^T."""
    from onnx import numpy_helper

    d = n * h
    inits, nodes = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, **attrs):
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    inputs = [("x", [b, s, d])]
    if form == "bert":
        heads = {}
        for name in "qkv":
            p = node("Add", [init(f"b{name}", randn(d)), node("MatMul", ["x", init(f"w{name}", randn(d, d) / 3)])])
            r = node("Reshape", [p, init(f"shape_{name}", np.array([b, s, n, h], np.int64))])
            heads[name] = node("Transpose", [r], perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [heads["q"], heads["k"]]), init("scale", np.array(h**-0.5, np.float32))])
        v = heads["v"]
    else:
        qkv = node("Add", [init("bqkv", randn(3 * d)), node("MatMul", ["x", init("wqkv", randn(d, 3 * d) / 3)])])
        r = node("Reshape", [qkv, init("shape5", np.array([b, s, 3, n, h], np.int64))])
        t = node("Transpose", [r], perm=[2, 0, 3, 1, 4])
        parts = [f"p{i}" for i in range(3)]
        nodes.append(helper.make_node("Split", [t, init("splits", np.array([1, 1, 1], np.int64))], parts, axis=0))
        q, k, v = (node("Squeeze", [p, init(f"ax{i}", np.array([0], np.int64))]) for i, p in enumerate(parts))
        root = init("sqrt_scale", np.array(h**-0.25, np.float32))
        scores = node(
            "MatMul", [node("Mul", [q, root]), node("Mul", [node("Transpose", [k], perm=[0, 1, 3, 2]), root])]
        )
    if mask:
        inputs.append(("m", [1, 1, s, s]))
        scores = node("Add", [scores, "m"])
    o = node("MatMul", [node("Softmax", [scores], axis=-1), v])
    y = node("Reshape", [node("Transpose", [o], perm=[0, 2, 1, 3]), init("shape3", np.array([b, s, d], np.int64))])
    if shared_q:  # an inner tensor with a user outside the pattern: not raised
        qt = node("Transpose", [heads["q"]], perm=[0, 2, 1, 3])
        y = node("Add", [y, node("Reshape", [qt, "shape3"])])
    nodes[-1].output[0] = "y"
    return _fission_of(nodes, inputs, [b, s, d], inits=inits)


@pytest.mark.parametrize("form,mask", [("bert", True), ("bert", False), ("timm", False)])
def test_self_attention_goes_back_as_one_attention_operator(form, mask):
    """Note [Raising attention]: the projections, head split, both MatMuls, the scale,
    the additive mask and the Softmax become one com.microsoft Attention."""
    orig, graph = _attention_model(form, mask=mask)
    feeds = {"x": randn(2, 5, 8)}
    if mask:
        feeds["m"] = np.where(rng.random((1, 1, 5, 5)) < 0.3, -1e4, 0.0).astype(np.float32)
    model = check(graph, feeds, rtol=1e-4, atol=1e-5)
    assert [n.op_type for n in model.graph.node] == ["Attention"]
    (att,) = model.graph.node
    assert att.domain == "com.microsoft" and {a.name: a.i for a in att.attribute if a.name == "num_heads"} == {
        "num_heads": 2
    }
    assert [i.name for i in model.graph.initializer if i.name.startswith("in")] == []  # no dead weights
    np.testing.assert_allclose(_run(model, feeds)["y"], _run(orig, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_attention_with_an_inner_tensor_used_elsewhere_stays():
    _, graph = _attention_model("bert", shared_q=True)
    model = check(graph, {"x": randn(2, 5, 8)}, rtol=1e-4, atol=1e-5)
    assert "Attention" not in [n.op_type for n in model.graph.node]
