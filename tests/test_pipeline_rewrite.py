"""The pipeline's "rewrite" step on the attention test model (fast: stops after rewrite).

Numbers: the rewritten primitive graph (numpy interpreter, and exported to ONNX) matches
onnxruntime on the original model within 1e-4. Structure: the softmax . V row sum rides
inside a MatMul (a CONCAT feeds it), the Q/K/V MatMuls sharing the input merge, and
``rewrite=False`` leaves the fissioned graph alone. The full pipeline with rewrites on is
checked end to end in test_pipeline.py.
"""

from __future__ import annotations

import pytest

from korch.bench.compare import max_rel_error, ort_session
from korch.cli import _settings, build_parser
from korch.config import Settings
from korch.ir import Op, evaluate, print_graph
from korch.ir.to_onnx import to_onnx
from korch.models import build, random_inputs
from korch.pipeline import STEPS, Context

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
    assert _settings(p.parse_args(command)).rewrite is True
    assert _settings(p.parse_args([*command, "--no-rewrite"])).rewrite is False


def test_default_settings_rewrite_on():
    s = Settings()
    assert s.rewrite and s.rewrite_time_limit_s <= 5.0 and s.rewrite_patience < s.rewrite_budget
    assert [n for n, _ in STEPS][:3] == ["load", "fission", "rewrite"]
