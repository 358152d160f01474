"""Optimizations that raise are skipped and recorded (Note [Skipped optimizations]).

Numbers: a graph or model with a unit skipped computes what it did before (the numpy
interpreter, onnxruntime; rel 1e-4). Structure: the record names the stage, the rule
or pass and the message, and nothing is recorded when nothing raises.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from korch.diagnostics import collecting, guarded, run_passes
from korch.errors import ModelError
from korch.ir import GraphBuilder, Op, evaluate, verify
from korch.rewrite import RULES_BY_NAME, find_matches, optimize_graph

TOL = 1e-4


def _boom(*args, **kwargs):
    raise IndexError("tuple index out of range (injected)")


def test_guarded_records_and_skips():
    with collecting() as c:
        assert guarded("rewrite", "r1", _boom, default="kept") == "kept"
        assert guarded("rewrite", "r1", _boom) is None
        assert guarded("export", "p", lambda x: x + 1, 1) == 2
    (rec,) = c.records()
    assert rec == {
        "stage": "rewrite",
        "unit": "r1",
        "error": "IndexError",
        "message": "tuple index out of range (injected)",
        "count": 2,
    }


def test_guarded_lets_user_errors_and_interrupts_through():
    def model_error():
        raise ModelError("node 'c1' (Conv): bad")

    def interrupt():
        raise KeyboardInterrupt

    with collecting() as c:
        with pytest.raises(ModelError):
            guarded("rewrite", "r", model_error)
        with pytest.raises(KeyboardInterrupt):
            guarded("rewrite", "r", interrupt)
    assert not c.records()


def test_run_passes_undoes_a_half_done_pass():
    """A pass that changed its argument and then raised leaves nothing behind: the value
    is built again and the passes before it applied again."""

    def add_a(xs):
        xs.append("a")
        return xs

    def half_then_raise(xs):
        xs.append("half")
        raise KeyError("k")

    def add_b(xs):
        xs.append("b")
        return xs

    with collecting() as c:
        assert run_passes("export", list, [add_a, half_then_raise, add_b]) == ["a", "b"]
    assert [(r["unit"], r["error"]) for r in c.records()] == [("half_then_raise", "KeyError")]


def _conv_graph():
    """A 1x1 convolution over x * 0.5 (a rank-0 scalar) plus a constant channel bias."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 5), "float32")
    y = b.add(
        Op.MUL,
        [b.binary(Op.ADD, x, b.const(rng.standard_normal((1, 4, 1, 1)).astype(np.float32))), b.const(np.float32(0.5))],
    )
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)
    w = b.const(rng.standard_normal((3, 4, 1, 1)).astype(np.float32))
    b.output("y", b.add(Op.EXP, [b.add(Op.CONV, [y, w], **attrs)]))
    return b.graph


def test_search_skips_a_rule_that_raises():
    """A rule whose match or replacement raises is not applied; the search goes on with
    the others and the result is equivalent."""
    g = _conv_graph()
    good = [r for r, _ in find_matches(g, tuple(RULES_BY_NAME.values()))]
    assert good, "some rule matches the test graph"
    bad_match = dataclasses.replace(good[0], name="bad_match", pattern=_boom)
    bad_replace = dataclasses.replace(good[0], name="bad_replace", replacement=_boom)
    with collecting() as c:
        g2, stats = optimize_graph(g, rules=(bad_match, bad_replace, *good), time_limit_s=60.0, patience=5)
    verify(g2)
    units = {(r["stage"], r["unit"]) for r in c.records()}
    assert {("rewrite", "bad_match"), ("rewrite", "bad_replace")} <= units
    assert stats.failed >= 1 and "bad_replace" not in stats.applied
    feed = {"x": np.random.default_rng(1).standard_normal((1, 4, 5, 5)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(g2, feed)["y"], evaluate(g, feed)["y"], rtol=TOL, atol=1e-5)


def test_simplification_skips_a_rule_that_raises():
    from korch.rewrite import Rule, simplify_graph
    from korch.rewrite.pattern import P, X

    g = _conv_graph()
    rules = (Rule("bad_match", _boom, _boom), Rule("bad_replace", P(Op.EXP, X("x")), _boom))
    with collecting() as c:
        g2 = simplify_graph(g, rules)
    verify(g2)
    assert sorted(r["unit"] for r in c.records()) == ["bad_match", "bad_replace"]
    feed = {"x": np.random.default_rng(1).standard_normal((1, 4, 5, 5)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(g2, feed)["y"], evaluate(g, feed)["y"], rtol=TOL)


@pytest.mark.parametrize("where", ["raise_softmax", "flatten_rows", "pad_channels"])
def test_export_skips_a_pass_that_raises(monkeypatch, where):
    """A raising pass (pure) or a model pass (edits the model in place, here half way)
    that raises is skipped; the model still runs in onnxruntime and matches."""
    import onnxruntime as ort

    import korch.kernels.ort.export as to_onnx_mod

    real = getattr(to_onnx_mod, where)

    @functools.wraps(real)
    def half_then_raise(*args, **kwargs):
        out = real(*args, **kwargs)
        if hasattr(out, "graph"):  # a model pass: leave it half edited
            del out.graph.node[len(out.graph.node) // 2 :]
        raise ValueError(f"{where} injected")

    monkeypatch.setattr(to_onnx_mod, where, half_then_raise)
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    e = b.add(Op.EXP, [b.binary(Op.SUB, x, b.broadcast_to(b.reduce(Op.REDUCE_MAX, x, [1]), (4, 8)))])
    b.output("y", b.binary(Op.DIV, e, b.broadcast_to(b.reduce(Op.REDUCE_SUM, e, [1]), (4, 8))))
    g = b.graph
    with collecting() as c:
        model = to_onnx_mod.to_onnx(g)
    assert [(r["stage"], r["unit"], r["message"]) for r in c.records()] == [("export", where, f"{where} injected")]
    feed = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feed)[0], evaluate(g, feed)["y"], rtol=TOL, atol=1e-6)


def test_nothing_recorded_when_nothing_raises():
    from korch.kernels.ort.export import to_onnx

    g = _conv_graph()
    with collecting() as c:
        optimize_graph(g, time_limit_s=60.0, patience=3)
        to_onnx(g)
    assert not c.records()
