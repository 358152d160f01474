"""The pipeline's "rewrite" step on the attention test model (fast: stops after rewrite).

Numbers: the rewritten primitive graph (numpy interpreter, and exported to ONNX) matches
onnxruntime on the original model within 1e-4. Structure: the softmax . V row sum rides
inside a MatMul (a CONCAT feeds it), the Q/K/V MatMuls sharing the input merge, and
``rewrite=False`` leaves the fissioned graph alone. The full pipeline with rewrites on is
checked end to end in test_pipeline.py.
"""

from __future__ import annotations

import pytest

from korch.cli import build_parser, settings_from_args
from korch.config import Settings
from korch.ir import Op, evaluate, print_graph
from korch.kernels.ort.export import to_onnx
from korch.models import build, random_inputs
from korch.pipeline import STEPS, Context
from korch.profile.e2e import max_rel_error, ort_session

TOL = 1e-4


def run_until(step: str, settings: Settings, model) -> Context:
    ctx = Context(settings, model, None)
    for name, fn in STEPS:
        fn(ctx)
        if name == step:
            return ctx
    raise AssertionError(f"no step {step}")


@pytest.fixture(scope="module")
def attention():
    model = build("attention")
    feeds = random_inputs(model, seed=1)
    want = dict(zip([o.name for o in model.graph.output], ort_session(model, 1).run(None, feeds)))
    # stopped by patience, not by time, so the result does not depend on the machine's load
    s = Settings(rewrite_time_limit_s=120.0)
    return model, feeds, want, s


def test_rewrite_step_attention(attention):
    model, feeds, want, s = attention
    ctx = run_until("rewrite", s, model)
    r = ctx.report
    assert r["rewrites_applied"].get("softmax_matmul_rowsum") == 1, r
    assert r["rewrites_applied"].get("merge_matmul_shared_lhs", 0) >= 1, r
    assert r["rewrite_cost_after"] < r["rewrite_cost_before"]
    assert r["rewrite_seconds"] >= 0 and r["rewrite_stopped"] == "patience"
    g = ctx.graph
    # structure: [V | 1] feeds a MatMul; the Q, K, V projections are one MatMul of x
    concat_into_matmul = [n for n in g.nodes if n.op is Op.MATMUL and any(g.nodes[i].op is Op.CONCAT for i in n.inputs)]
    assert len(concat_into_matmul) == 1
    x = g.inputs["x"]
    assert sum(1 for n in g.nodes if n.op is Op.MATMUL and n.inputs[0] == x) == 1
    # numbers: interpreter and onnxruntime on the exported graph, against the original model
    assert max_rel_error(evaluate(g, feeds), want) <= TOL
    sess = ort_session(to_onnx(g), 1)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert max_rel_error(got, want) <= TOL


def test_rewrite_off_applies_none(attention):
    model, _, _, s = attention
    ctx = run_until("rewrite", s.replace(rewrite=False), model)
    assert ctx.report["rewrites_applied"] == {}
    fissioned = run_until("fission", s, model).graph
    assert print_graph(ctx.graph) == print_graph(fissioned)


@pytest.mark.parametrize("command", [["optimize", "m.onnx", "-o", "out"], ["example", "attention"]])
def test_cli_no_rewrite_flag(command):
    p = build_parser()
    assert settings_from_args(p.parse_args(command)).rewrite is True
    assert settings_from_args(p.parse_args([*command, "--no-rewrite"])).rewrite is False
    composed = settings_from_args(p.parse_args([*command, "--composed-only"]))
    assert (composed.library_regions, composed.whole_plans) == (0, False)
    assert (settings_from_args(p.parse_args(command)).whole_plans, Settings().library_regions) == (True, 3)


def test_default_settings_rewrite_on():
    s = Settings()
    assert s.rewrite and s.rewrite_time_limit_s <= 5.0 and s.rewrite_patience < s.rewrite_budget
    assert [n for n, _ in STEPS][:3] == ["load", "fission", "rewrite"]


def _decode_head_model():
    """Segformer's decode head in small, as torch exports it: per stage a channels-last
    MatMul + bias, a transpose and reshape to NCHW, a bilinear Resize (two stages), a
    Concat and a 1x1 fuse Conv; then a Mix-FFN tail (depthwise conv in NCHW, GELU on the
    channels-last view, a narrowing MatMul) and a 9x9 conv to 3 channels (Candy's last
    layer)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def w(name, *shape):
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name))
        return name

    def const_i64(name, vals):
        inits.append(numpy_helper.from_array(np.array(vals, np.int64), name))
        return name

    c, parts = 8, []
    for k, hw in enumerate((4, 8)):
        x = f"x{k}"
        nodes += [
            helper.make_node("MatMul", [x, w(f"p{k}", 6, c)], [f"m{k}"]),
            helper.make_node("Add", [f"m{k}", w(f"b{k}", c)], [f"a{k}"]),
            helper.make_node("Transpose", [f"a{k}"], [f"t{k}"], perm=[0, 2, 1]),
            helper.make_node("Reshape", [f"t{k}", const_i64(f"s{k}", [1, c, hw, hw])], [f"r{k}"]),
        ]
        if hw != 8:
            nodes.append(
                helper.make_node(
                    "Resize",
                    [f"r{k}", "", "", const_i64(f"z{k}", [1, c, 8, 8])],
                    [f"u{k}"],
                    mode="linear",
                    coordinate_transformation_mode="half_pixel",
                )
            )
            parts.append(f"u{k}")
        else:
            parts.append(f"r{k}")
    nodes += [
        helper.make_node("Concat", parts, ["cat"], axis=1),
        helper.make_node("Conv", ["cat", w("fw", 32, 2 * c, 1, 1), w("fb", 32)], ["fuse"]),
        helper.make_node("Conv", ["fuse", w("dw", 32, 1, 3, 3)], ["dconv"], group=32, pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["dconv", const_i64("s_cl", [1, 32, 64])], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["cl"], perm=[0, 2, 1]),
        helper.make_node("Gelu", ["cl"], ["g"], domain=""),
        helper.make_node("MatMul", ["g", w("fc2", 32, 4)], ["n"]),
        helper.make_node("Transpose", ["n"], ["nt"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["nt", const_i64("s_n", [1, 4, 8, 8])], ["img"]),
        helper.make_node("Conv", ["img", w("last", 3, 4, 9, 9)], ["y"], pads=[4, 4, 4, 4]),
    ]
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, hw * hw, 6]) for k, hw in enumerate((4, 8))]
    graph = helper.make_graph(
        nodes, "decode_head", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def test_layer_rewrites_reach_onnxruntime_and_match_it():
    """The three layer rules fire on their patterns (sink the fuse conv, narrow the
    Mix-FFN projection, space-to-depth the conv to 3 channels), and the rewritten graph,
    exported to ONNX as a one-region plan would be, matches onnxruntime on the model
    within 1e-4, with no Concat left and the 9x9 conv's layout changes raised."""
    import numpy as np

    model = _decode_head_model()
    rng = np.random.default_rng(1)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }
    want = dict(zip(["y"], ort_session(model, 1).run(None, feeds)))
    ctx = run_until("rewrite", Settings(rewrite_time_limit_s=120.0), model)
    applied = ctx.report["rewrites_applied"]
    assert applied.get("sink_pointwise_conv") == 1, applied
    assert applied.get("narrow_before_transpose") == 1, applied
    assert applied.get("conv_few_outputs_space_to_depth") == 1, applied
    assert max_rel_error(evaluate(ctx.graph, feeds), want) < TOL
    onnx_model = to_onnx(ctx.graph)
    ops = [n.op_type for n in onnx_model.graph.node]
    assert "Concat" not in ops and "SpaceToDepth" in ops and "DepthToSpace" in ops, ops
    got = dict(zip(["y"], ort_session(onnx_model, 1).run(None, feeds)))
    assert max_rel_error(got, want) < TOL
