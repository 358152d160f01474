"""Every rule is an equation: check each on random instances against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from korch.ir import GraphBuilder, Op, evaluate, print_graph, verify
from korch.rewrite import ALL_RULES, RULES_BY_NAME, apply_rule
from korch.rewrite.rules.common import slice_axis

RTOL, ATOL = 1e-4, 1e-5
SEEDS = range(3)


def _dim(rng, lo=2, hi=6) -> int:
    return int(rng.integers(lo, hi))


def _w(rng, *shape, lo=None, hi=None):
    if lo is not None:
        return rng.uniform(lo, hi, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def _softmax(b: GraphBuilder, x: int, variant: int) -> int:
    r = len(b.shape(x))
    e = b.unary(Op.EXP, b.binary(Op.SUB, x, b.reduce(Op.REDUCE_MAX, x, [r - 1])))
    if variant == 2:  # the row sum already turned into a MatMul with ones
        s = b.add(Op.MATMUL, [e, b.const(np.ones((b.shape(e)[-1], 1), np.float32))])
    else:
        s = b.reduce(Op.REDUCE_SUM, e, [r - 1])
    if variant == 1:  # multiply by the reciprocal instead of dividing
        return b.binary(Op.MUL, e, b.unary(Op.RECIPROCAL, s))
    return b.binary(Op.DIV, e, s)


# Each builder returns a graph in which the rule matches; ``seed`` varies the shapes and
# the variant of the pattern.


def inst_reduce_sum_to_matmul(rng, seed):
    b = GraphBuilder()
    x = b.input("x", (_dim(rng), _dim(rng), _dim(rng)), "float32")
    b.output("y", b.unary(Op.EXP, b.reduce(Op.REDUCE_SUM, x, [2])))
    return b.graph


def inst_matmul_ones_to_reduce_sum(rng, seed):
    b = GraphBuilder()
    k = _dim(rng)
    x = b.input("x", (_dim(rng), k), "float32")
    b.output("y", b.add(Op.MATMUL, [x, b.const(np.ones((k, 1), np.float32))]))
    return b.graph


def inst_softmax_matmul_rowsum(rng, seed):
    b = GraphBuilder()
    bt, m, k, n = _dim(rng), _dim(rng), _dim(rng), _dim(rng)
    x = b.input("x", (bt, m, k), "float32")
    v = b.input("v", (bt, k, n), "float32") if seed != 1 else b.const(_w(rng, k, n))
    b.output("y", b.add(Op.MATMUL, [_softmax(b, x, seed), v]))
    return b.graph


def _scaled(b, rng, x, seed):
    if seed % 2:
        return b.binary(Op.DIV, x, b.scalar(float(rng.uniform(0.5, 2)), x))
    return b.binary(Op.MUL, b.scalar(float(rng.uniform(-2, 2)), x), x)  # scalar first: commutativity


def inst_matmul_scaled_lhs_out(rng, seed):
    b = GraphBuilder()
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    x = b.input("x", (m, k), "float32")
    b.output("y", b.add(Op.MATMUL, [_scaled(b, rng, x, seed), b.const(_w(rng, k, n))]))
    return b.graph


def inst_matmul_scaled_rhs_out(rng, seed):
    b = GraphBuilder()
    bt, m, k, n = _dim(rng), _dim(rng), _dim(rng), _dim(rng)
    x = b.input("x", (bt, m, k), "float32")
    w = b.input("w", (bt, k, n), "float32")
    b.output("y", b.add(Op.MATMUL, [x, _scaled(b, rng, w, seed)]))
    return b.graph


def _scale_after(rng, seed):
    b = GraphBuilder()
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    x = b.input("x", (m, k), "float32")
    w = b.input("w", (k, n), "float32")
    b.output("y", _scaled(b, rng, b.add(Op.MATMUL, [x, w]), seed))
    return b.graph


inst_matmul_scale_into_lhs = _scale_after
inst_matmul_scale_into_rhs = _scale_after


def inst_merge_matmul_shared_lhs(rng, seed):
    b = GraphBuilder()
    m, k = _dim(rng), _dim(rng)
    x = b.input("x", (m, k), "float32")
    x = b.unary(Op.TANH, x)
    y1 = b.add(Op.MATMUL, [x, b.const(_w(rng, k, _dim(rng)))])
    y2 = b.add(Op.MATMUL, [x, b.const(_w(rng, k, _dim(rng)))])
    b.output("y1", y1)
    b.output("y2", b.unary(Op.EXP, y2))
    return b.graph


def _conv_attrs(rng):
    s = int(rng.integers(1, 3))
    return dict(strides=(s, s), dilations=(1, 1), pads=(1, 1, 1, 1), group=1)


def inst_merge_conv_shared_input(rng, seed):
    b = GraphBuilder()
    c, h = _dim(rng), _dim(rng, 4, 8)
    x = b.input("x", (1, c, h, h), "float32")
    attrs = _conv_attrs(rng)
    y1 = b.add(Op.CONV, [x, b.const(_w(rng, _dim(rng), c, 3, 3))], **attrs)
    y2 = b.add(Op.CONV, [x, b.const(_w(rng, _dim(rng), c, 3, 3))], **attrs)
    b.output("y1", y1)
    b.output("y2", y2)
    return b.graph


_POINTWISE = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)


def inst_pointwise_over_split(rng, seed):
    """A merged convolution's split, each part with its bias and SiLU (yolo's C3); seed 1
    a MatMul split on its last axis with a scalar scale; seed 2 the product of two
    splits' parts."""
    b = GraphBuilder()
    c, n1, n2 = _dim(rng), _dim(rng), _dim(rng)
    if seed == 1:
        x = b.add(Op.MATMUL, [b.input("a", (3, c), "float32"), b.const(_w(rng, c, n1 + n2))])
    else:
        w = b.const(_w(rng, n1 + n2, c, 1, 1))
        x = b.add(Op.CONV, [b.input("a", (1, c, 4, 4), "float32"), w], **_POINTWISE)
    axis = 1
    y = b.unary(Op.TANH, x)
    for i, (at, n) in enumerate(((0, n1), (n1, n2))):
        part = slice_axis(b, x, axis, at, n)
        if seed == 1:
            out = b.binary(Op.MUL, part, b.scalar(0.5, part))
        elif seed == 2:
            out = b.binary(Op.MUL, part, slice_axis(b, y, axis, at, n))
        else:
            bias = b.const(_w(rng, 1, n, 1, 1))
            out = b.binary(Op.ADD, part, b.broadcast_to(bias, b.shape(part)))
        b.output(f"y{i}", out)
    return b.graph


def _const_op(op, lo=None, hi=None):
    def build(rng, seed):
        b = GraphBuilder()
        m, n = _dim(rng), _dim(rng)
        x = b.input("x", (m, n), "float32")
        c = _w(rng, 1, n, lo=lo, hi=hi) if seed != 2 else _w(rng, m, n, lo=lo, hi=hi)
        b.output("y", b.binary(op, x, b.const(c)))
        return b.graph

    return build


inst_sub_const_to_add = _const_op(Op.SUB)
inst_div_const_to_mul = _const_op(Op.DIV, 0.5, 2.0)


def _chain(outer, inner):
    def build(rng, seed):
        b = GraphBuilder()
        m, n = _dim(rng), _dim(rng)
        x = b.input("x", (1, m, n), "float32")
        c1 = b.const(_w(rng, 1, 1, n)) if seed != 1 else b.scalar(1.5, x)
        c2 = b.const(_w(rng, 1, m, 1))
        b.output("y", b.binary(outer, b.binary(inner, x, c1), c2))
        return b.graph

    return build


inst_mul_const_chain = _chain(Op.MUL, Op.MUL)
inst_add_const_chain = _chain(Op.ADD, Op.ADD)
inst_mul_over_add_const = _chain(Op.MUL, Op.ADD)


def _conv_fold(with_bias):
    def build(rng, seed):
        b = GraphBuilder()
        c, o, h = _dim(rng), _dim(rng), _dim(rng, 3, 7)
        x = b.input("x", (_dim(rng, 1, 3), c, h, h), "float32")
        y = b.add(Op.CONV, [x, b.const(_w(rng, o, c, 3, 3))], **_conv_attrs(rng))
        if with_bias:
            y = b.binary(Op.ADD, y, b.const(_w(rng, 1, o, 1, 1)))
        s = b.const(_w(rng, 1, o, 1, 1)) if seed != 1 else b.scalar(0.7, x)
        b.output("y", b.binary(Op.MUL, s, y))
        return b.graph

    return build


inst_fold_scale_into_conv = _conv_fold(False)
inst_fold_scale_into_conv_bias = _conv_fold(True)


def _matmul_fold(with_bias):
    def build(rng, seed):
        b = GraphBuilder()
        m, k, n = _dim(rng), _dim(rng), _dim(rng)
        x = b.input("x", (_dim(rng), m, k), "float32")
        y = b.add(Op.MATMUL, [x, b.const(_w(rng, k, n))])
        if with_bias:
            y = b.binary(Op.ADD, y, b.const(_w(rng, n)))
        b.output("y", b.binary(Op.MUL, y, b.const(_w(rng, n))))
        return b.graph

    return build


def _input_affine(shift: bool):
    """A LayerNorm's gamma (and beta) before a Linear: x [1, m, k] * g[k] (+ b[k]) @ W
    [k, n]; seed 1 a scalar gain with the shift."""

    def build(rng, seed):
        b = GraphBuilder()
        m, k, n = _dim(rng), _dim(rng), _dim(rng)
        x = b.input("x", (1, m, k), "float32")
        g = b.scalar(1.5, x) if seed == 1 and shift else b.const(_w(rng, k))
        y = b.binary(Op.MUL, x, g)
        if shift:
            y = b.binary(Op.ADD, y, b.const(_w(rng, k)))
        b.output("y", b.add(Op.MATMUL, [y, b.const(_w(rng, k, n))]))
        return b.graph

    return build


inst_fold_input_affine_into_matmul = _input_affine(True)
inst_fold_input_scale_into_matmul = _input_affine(False)
inst_fold_scale_into_matmul = _matmul_fold(False)
inst_fold_scale_into_matmul_bias = _matmul_fold(True)


def inst_transpose_identity(rng, seed):
    b = GraphBuilder()
    x = b.input("x", (_dim(rng), _dim(rng)), "float32")
    b.output("y", b.unary(Op.EXP, b.add(Op.TRANSPOSE, [x], perm=(0, 1))))
    return b.graph


def inst_transpose_transpose(rng, seed):
    b = GraphBuilder()
    x = b.input("x", (_dim(rng), _dim(rng), _dim(rng)), "float32")
    p1 = [int(i) for i in rng.permutation(3)]
    p2 = [int(i) for i in rng.permutation(3)] if seed else [p1.index(i) for i in range(3)]  # seed 0: cancels
    t = b.add(Op.TRANSPOSE, [b.add(Op.TRANSPOSE, [x], perm=p1)], perm=p2)
    b.output("y", b.unary(Op.EXP, t))
    return b.graph


def inst_reshape_identity(rng, seed):
    b = GraphBuilder()
    x = b.input("x", (_dim(rng), _dim(rng)), "float32")
    b.output("y", b.unary(Op.EXP, b.add(Op.RESHAPE, [x], shape=b.shape(x))))
    return b.graph


def inst_reshape_reshape(rng, seed):
    b = GraphBuilder()
    m, n = _dim(rng), _dim(rng)
    x = b.input("x", (m, n), "float32")
    r = b.add(Op.RESHAPE, [b.add(Op.RESHAPE, [x], shape=(m * n,))], shape=(n, m) if seed else (m, n))
    b.output("y", b.unary(Op.EXP, r))
    return b.graph


def inst_broadcast_identity(rng, seed):
    b = GraphBuilder()
    x = b.input("x", (_dim(rng), _dim(rng)), "float32")
    b.output("y", b.unary(Op.EXP, b.add(Op.BROADCAST, [x], shape=b.shape(x))))
    return b.graph


def inst_slice_identity(rng, seed):
    b = GraphBuilder()
    m, n = _dim(rng), _dim(rng)
    x = b.input("x", (m, n), "float32")
    b.output("y", b.unary(Op.EXP, b.add(Op.SLICE, [x], starts=(0, 0), steps=(1, 1), lengths=(m, n))))
    return b.graph


def inst_slice_slice(rng, seed):
    b = GraphBuilder()
    n = _dim(rng, 8, 12)
    x = b.input("x", (3, n), "float32")
    s1 = b.add(Op.SLICE, [x], starts=(1, 1), steps=(1, 2), lengths=(2, (n - 2) // 2 + 1))
    m = b.shape(s1)[1]
    s2 = b.add(
        Op.SLICE, [s1], starts=(0, 1), steps=(1, 2 if seed else 1), lengths=(2, (m - 2) // (2 if seed else 1) + 1)
    )
    b.output("y", b.unary(Op.EXP, s2))
    return b.graph


def inst_transpose_weight_into_matmul(rng, seed):
    b = GraphBuilder()
    bt, m, k, n = _dim(rng), _dim(rng), _dim(rng), _dim(rng)
    x = b.input("x", (bt, m, k), "float32")
    if seed == 1:
        wt = b.add(Op.TRANSPOSE, [b.const(_w(rng, bt, n, k))], perm=(0, 2, 1))
    else:
        wt = b.add(Op.TRANSPOSE, [b.const(_w(rng, n, k))], perm=(1, 0))
    b.output("y", b.add(Op.MATMUL, [x, wt]))
    return b.graph


def inst_const_fold(rng, seed):
    b = GraphBuilder()
    m, n = _dim(rng), _dim(rng)
    x = b.input("x", (m, n), "float32")
    c = b.unary(Op.SQRT, b.binary(Op.ADD, b.const(_w(rng, m, n, lo=0.1, hi=2)), b.scalar(1e-5, x)))
    b.output("y", b.binary(Op.DIV, x, c))
    return b.graph


def inst_one_element_scalar(rng, seed):
    """A [1, 1] constant broadcast as an operand (GraphBuilder.broadcast_to no longer
    makes one, a folded constant still may); seed 1 puts it first in a SUB."""
    b = GraphBuilder()
    m, n = _dim(rng), _dim(rng)
    x = b.input("x", (m, n), "float32")
    c = b.add(Op.BROADCAST, [b.const(_w(rng, 1, 1, lo=0.5, hi=2))], shape=(m, n))
    b.output("y", b.add(Op.SUB, [c, x]) if seed == 1 else b.add(Op.DIV, [x, c]))
    return b.graph


def _decode_stage(b: GraphBuilder, rng, x: int, c: int, hw: int, out: int, nearest: bool) -> int:
    """A Segformer decode-head stage: channels-last projection to ``c`` with a bias,
    viewed as NCHW, upsampled from ``hw`` to ``out`` (per axis: two gathers mixed by
    constant spatial weights, or one nearest gather)."""
    p = b.binary(Op.ADD, b.add(Op.MATMUL, [x, b.const(_w(rng, b.shape(x)[-1], c))]), b.const(_w(rng, c)))
    y = b.reshape(b.transpose(p, (0, 2, 1)), (1, c, hw, hw))
    for axis in (2, 3):
        lo = np.arange(out) * hw // out
        hi = np.minimum(lo + 1, hw - 1)
        if nearest:
            y = b.add(Op.GATHER, [y], axis=axis, indices=tuple(lo), indices_shape=(out,))
            continue
        shape = [1, 1, 1, 1]
        shape[axis] = out
        mixed = []
        for idx, wt in ((lo, rng.uniform(0, 1, out)), (hi, rng.uniform(0, 1, out))):
            gth = b.add(Op.GATHER, [y], axis=axis, indices=tuple(idx), indices_shape=(out,))
            mixed.append(b.binary(Op.MUL, gth, b.const(wt.astype(np.float32).reshape(shape))))
        y = b.add(Op.ADD, mixed)
    return y


def inst_sink_pointwise_conv(rng, seed):
    """Segformer's decode head in small: stages upsampled to one size, concatenated,
    fused by a 1x1 convolution (seed 2: a full-resolution stage that is not resized)."""
    b = GraphBuilder()
    c, out = _dim(rng, 4, 8), 6
    parts = []
    for k, hw in enumerate((2, 3) if seed != 2 else (3, 6)):
        x = b.input(f"x{k}", (1, hw * hw, _dim(rng)), "float32")
        parts.append(_decode_stage(b, rng, x, c, hw, out, nearest=seed == 1 and k == 0) if hw != out else None)
        if hw == out:
            p = b.add(Op.MATMUL, [x, b.const(_w(rng, b.shape(x)[-1], c))])
            parts[-1] = b.reshape(b.transpose(p, (0, 2, 1)), (1, c, out, out))
    cat = b.add(Op.CONCAT, parts, axis=1)
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)
    b.output("y", b.add(Op.CONV, [cat, b.const(_w(rng, _dim(rng), 2 * c, 1, 1))], **attrs))
    return b.graph


def inst_conv_few_outputs_space_to_depth(rng, seed):
    """Candy's last layer in small: a conv to RGB (seed 1: an even kernel and the conv's
    own zero padding; seed 2: a biased conv behind a reflect pad, as exported)."""
    b = GraphBuilder()
    ci = _dim(rng)
    k = (4 if seed == 1 else 3 + 2 * seed) if seed != 2 else 5
    x = b.input("x", (1, ci, 8, 10), "float32")
    pads = (1, 2, 2, 1) if seed == 1 else (0, 0, 0, 0)
    if seed == 2:
        x = b.add(Op.PAD, [x], pads=((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect")
    elif seed == 0:
        x = b.add(Op.PAD, [x], pads=((0, 0), (0, 0), (1, 1), (1, 1)), mode="constant", value=0.0)
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=pads, group=1)
    y = b.add(Op.CONV, [x, b.const(_w(rng, 3, ci, k, k))], **attrs)
    b.output("y", b.binary(Op.ADD, y, b.const(_w(rng, 1, 3, 1, 1))))
    return b.graph


def inst_narrow_before_transpose(rng, seed):
    """Segformer's Mix-FFN in small: an NCHW depthwise output viewed channels-last, GELU
    (x * 0.5 * (1 + erf(x / sqrt 2))), a projection to fewer channels (seed 1: no
    activation; seed 2: two NCHW sources added)."""
    b = GraphBuilder()
    k, n = 8, _dim(rng, 2, 6)

    def cl(x):
        return b.transpose(b.reshape(x, (1, k, 12)), (0, 2, 1))

    d = b.input("d", (1, k, 3, 4), "float32")
    x = cl(d)
    if seed == 2:
        x = b.binary(Op.ADD, x, cl(b.input("e", (1, k, 3, 4), "float32")))
    if seed != 1:
        e = b.unary(Op.ERF, b.binary(Op.DIV, x, b.const(np.array(1.4142135, np.float32))))
        x = b.binary(
            Op.MUL,
            b.binary(Op.MUL, x, b.binary(Op.ADD, e, b.const(np.array(1.0, np.float32)))),
            b.const(np.array(0.5, np.float32)),
        )
    b.output("y", b.add(Op.MATMUL, [x, b.const(_w(rng, k, n))]))
    return b.graph


def inst_linear_attention_channel_major(rng, seed):
    """EfficientViT's LiteMLA core in small: channel-major qkv [B, heads, 3d, HW]
    transposed to token-major, ReLU on q and k, v padded with a ones column, o = q (k^T v),
    o[:d] / (o[d:] + eps), transposed back (seed 1: one head, seed 2: a leaky slope
    instead of ReLU)."""
    b = GraphBuilder()
    heads, d, hw = (2 if seed != 1 else 1), _dim(rng, 2, 5), _dim(rng, 5, 9)
    x = b.input("x", (1, heads, 3 * d, hw), "float32")
    swap = (0, 1, 3, 2)
    t = b.transpose(x, swap)

    def part(i):
        return b.add(Op.SLICE, [t], starts=(0, 0, 0, i * d), steps=(1, 1, 1, 1), lengths=(1, heads, hw, d))

    zero = b.const(np.array(0.0 if seed != 2 else 0.1, np.float32))
    act = Op.MAX if seed != 2 else Op.MUL
    q, k = b.add(act, [part(0), zero]), b.add(act, [part(1), zero])
    v = b.add(Op.PAD, [part(2)], pads=((0, 0), (0, 0), (0, 0), (0, 1)), mode="constant", value=1.0)
    o = b.add(Op.MATMUL, [q, b.add(Op.MATMUL, [b.transpose(k, swap), v])])
    num = b.add(Op.SLICE, [o], starts=(0, 0, 0, 0), steps=(1, 1, 1, 1), lengths=(1, heads, hw, d))
    den = b.add(Op.SLICE, [o], starts=(0, 0, 0, d), steps=(1, 1, 1, 1), lengths=(1, heads, hw, 1))
    den = b.add(Op.ADD, [den, b.const(np.array(1e-2, np.float32))])
    y = b.add(Op.DIV, [num, b.broadcast_to(den, (1, heads, hw, d))])
    b.output("y", b.transpose(y, swap))
    return b.graph


INSTANCES = {name[len("inst_") :]: fn for name, fn in globals().items() if name.startswith("inst_")}


def _inputs(g, rng):
    return {name: rng.standard_normal(g.nodes[nid].shape).astype(g.nodes[nid].dtype) for name, nid in g.inputs.items()}


def test_every_rule_has_an_instance():
    names = {r.name for r in ALL_RULES}
    assert names == set(INSTANCES), f"missing: {names - set(INSTANCES)}, unknown: {set(INSTANCES) - names}"
    assert all(r.equation for r in ALL_RULES), "every rule states its equation"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_rule_preserves_numbers(name, seed):
    rng = np.random.default_rng(1000 * seed + sum(map(ord, name)))
    g = INSTANCES[name](rng, seed)
    verify(g)
    rule = RULES_BY_NAME[name]
    g2 = apply_rule(g, rule)
    assert g2 is not None, f"{name} did not match its instance:\n{print_graph(g)}"
    verify(g2)
    assert print_graph(g2) != print_graph(g)
    for _ in range(2):
        feed = _inputs(g, rng)
        want, got = evaluate(g, feed), evaluate(g2, feed)
        assert want.keys() == got.keys()
        for out in want:
            np.testing.assert_allclose(got[out], want[out], rtol=RTOL, atol=ATOL, err_msg=f"{name} output {out}")


def test_a_wrong_rule_is_caught():
    """The check has teeth: a rule that drops the scale of a MatMul fails it."""
    from korch.rewrite import Rule
    from korch.rewrite.pattern import P, X

    bad = Rule(
        "bad",
        P(Op.MATMUL, P(Op.MUL, X("x"), X("s", Op.CONST)), X("w")),
        lambda b, m, v: b.add(Op.MATMUL, [v("x"), v("w")]),
    )
    g = inst_matmul_scaled_lhs_out(np.random.default_rng(0), 0)
    g2 = apply_rule(g, bad)
    feed = _inputs(g, np.random.default_rng(1))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(evaluate(g2, feed)["y"], evaluate(g, feed)["y"], rtol=RTOL, atol=ATOL)


def test_rules_do_not_match_elsewhere():
    """Conditions reject near misses: a sum over a non-last axis, a non-scalar scale, a grouped conv."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    r0 = b.reduce(Op.REDUCE_SUM, x, [0])
    y = b.binary(Op.MUL, x, b.const(_w(rng, 3, 4)))
    mm = b.add(Op.MATMUL, [y, b.const(_w(rng, 4, 2))])
    img = b.input("img", (1, 4, 5, 5), "float32")
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=2)
    c1 = b.add(Op.CONV, [img, b.const(_w(rng, 4, 2, 1, 1))], **attrs)
    c2 = b.add(Op.CONV, [img, b.const(_w(rng, 2, 2, 1, 1))], **attrs)
    for i, nid in enumerate((r0, mm, c1, c2)):
        b.output(f"o{i}", nid)
    g = b.graph
    for name in ("reduce_sum_to_matmul", "matmul_scaled_lhs_out", "merge_conv_shared_input"):
        assert apply_rule(g, RULES_BY_NAME[name]) is None, name


def test_sink_pointwise_conv_structure():
    """Sunk, the decode head has no CONCAT, no CONV and no gather on the fused width:
    each stage is one MatMul (projection and its slice of the fuse weight folded) at
    its own resolution, and the gathers move the fused channels."""
    g = inst_sink_pointwise_conv(np.random.default_rng(0), 0)
    g2 = apply_rule(g, RULES_BY_NAME["sink_pointwise_conv"])
    ops = [n.op for n in g2.nodes]
    assert Op.CONCAT not in ops and Op.CONV not in ops
    assert ops.count(Op.MATMUL) == 2
    co = g.nodes[g.outputs["y"]].shape[1]
    assert all(n.shape[1] == co for n in g2.nodes if n.op is Op.GATHER)
    # gathers that shrink the tensor are not passed: the convolution stays above them
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6), "float32")
    down = b.add(Op.GATHER, [x], axis=2, indices=(0, 2, 4), indices_shape=(3,))
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)
    b.output("y", b.add(Op.CONV, [down, b.const(_w(np.random.default_rng(1), 8, 4, 1, 1))], **attrs))
    assert apply_rule(b.graph, RULES_BY_NAME["sink_pointwise_conv"]) is None
    # a stage also read elsewhere is not pushed through (it would be computed twice)
    g = inst_sink_pointwise_conv(np.random.default_rng(0), 0)
    cat = next(i for i, n in enumerate(g.nodes) if n.op is Op.CONCAT)
    g.outputs["also"] = g.nodes[cat].inputs[0]
    g3 = apply_rule(g, RULES_BY_NAME["sink_pointwise_conv"])
    assert g3 is not None and [n.op for n in g3.nodes].count(Op.CONV) == 1


def test_sink_pointwise_conv_rank0_scalars():
    """Issue 26: a rank-0 scalar constant beside an NCHW tensor (``y * 0.5 + 3.0``, as in
    MobileNetV3's hardswish and ConvNeXt's GELU exports) ended the walk in an
    IndexError. A scalar is constant along channels, so the convolution passes it
    (conv(a * s) = conv(a) * s, conv(a + s) = conv(a) + s W.sum(1))."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    c, out = 4, 6
    parts = []
    for k, hw in enumerate((2, 3)):
        x = b.input(f"x{k}", (1, hw * hw, 3), "float32")
        parts.append(_decode_stage(b, rng, x, c, hw, out, nearest=False))
    y = b.add(Op.MUL, [parts[0], b.const(np.float32(0.5))])
    parts[0] = b.add(Op.ADD, [y, b.const(np.float32(3.0))])
    cat = b.add(Op.CONCAT, parts, axis=1)
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)
    b.output("y", b.add(Op.CONV, [cat, b.const(_w(rng, 5, 2 * c, 1, 1))], **attrs))
    g = b.graph
    verify(g)
    g2 = apply_rule(g, RULES_BY_NAME["sink_pointwise_conv"])
    assert g2 is not None
    verify(g2)
    feed = _inputs(g, np.random.default_rng(1))
    np.testing.assert_allclose(evaluate(g2, feed)["y"], evaluate(g, feed)["y"], rtol=RTOL, atol=ATOL)
    ops = [n.op for n in g2.nodes]  # both stages sunk into their projections
    assert Op.CONV not in ops and ops.count(Op.MATMUL) == 2


def test_narrow_before_transpose_structure():
    """After the rule the only transpose moves the projection's N channels, the GELU runs
    on the NCHW tensor, and a widening projection is left alone; ``for_library`` applies
    it wherever it matches."""
    from korch.rewrite import for_library

    g = inst_narrow_before_transpose(np.random.default_rng(0), 0)
    n = g.nodes[g.outputs["y"]].shape[-1]
    g2 = for_library(g)
    transposes = [node for node in g2.nodes if node.op is Op.TRANSPOSE]
    assert len(transposes) == 1 and g2.nodes[transposes[0].inputs[0]].shape[-1] == 12
    assert g2.nodes[transposes[0].inputs[0]].shape[1] == n
    assert [node.op for node in g2.nodes].count(Op.CONV) == 1
    assert all(node.shape[1] == 8 for node in g2.nodes if node.op is Op.ERF)
    b = GraphBuilder()
    d = b.input("d", (1, 4, 3, 4), "float32")
    x = b.transpose(b.reshape(d, (1, 4, 12)), (0, 2, 1))
    b.output("y", b.add(Op.MATMUL, [x, b.const(_w(np.random.default_rng(1), 4, 16))]))
    assert apply_rule(b.graph, RULES_BY_NAME["narrow_before_transpose"]) is None


def test_linear_attention_channel_major_structure():
    """After the rule no transpose touches the [HW, 3d] input or the [HW, d] result: the
    two left transpose v (d+1 x HW) and k^T v (d x d+1), the operands onnxruntime folds
    into its MatMul."""
    g = inst_linear_attention_channel_major(np.random.default_rng(0), 0)
    x = g.nodes[g.inputs["x"]]
    hw, three_d = x.shape[-1], x.shape[-2]
    g2 = apply_rule(g, RULES_BY_NAME["linear_attention_channel_major"])
    moved = [g2.nodes[n.inputs[0]].shape for n in g2.nodes if n.op is Op.TRANSPOSE]
    assert len(moved) == 2
    d = three_d // 3
    assert sorted(s[-2:] for s in moved) == sorted([(d + 1, hw), (d, d + 1)])


def test_mul_over_add_const_leaves_a_shared_sum():
    """HardSwish on ``y = conv + bias`` reads y twice (fission's y * hardsigmoid(y)).
    Distributing hardsigmoid's 1/6 over the bias would keep the ADD for the gate and
    fork the conv into two chains (Note [Register post-ops]): the rule must not fire,
    and it still fires where the sum has no other reader."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6), "float32")
    y = b.add(Op.CONV, [x, b.const(_w(rng, 8, 4, 1, 1))], **_conv_attrs(rng))
    y = b.binary(Op.ADD, y, b.const(_w(rng, 1, 8, 1, 1)))
    g = b.binary(Op.ADD, b.binary(Op.MUL, y, b.scalar(1 / 6, y)), b.scalar(0.5, y))
    g = b.binary(Op.MIN, b.binary(Op.MAX, g, b.scalar(0.0, y)), b.scalar(1.0, y))
    b.output("y", b.binary(Op.MUL, y, g))
    rule = RULES_BY_NAME["mul_over_add_const"]
    assert apply_rule(b.graph, rule) is None
    # the same sum read once: distributed
    b2 = GraphBuilder()
    x = b2.input("x", (1, 4, 6, 6), "float32")
    y = b2.add(Op.CONV, [x, b2.const(_w(rng, 8, 4, 1, 1))], **_conv_attrs(rng))
    y = b2.binary(Op.ADD, y, b2.const(_w(rng, 1, 8, 1, 1)))
    b2.output("y", b2.binary(Op.MUL, y, b2.scalar(1 / 6, y)))
    assert apply_rule(b2.graph, rule) is not None


def test_pointwise_over_split_moves_the_epilogue_above_the_split():
    """Note [Pointwise over a split]: bias, sigmoid and product of each part of a merged
    convolution become one chain on the convolution, then the split."""
    from korch.rewrite import for_library

    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 5, 5), "float32")
    y = b.add(Op.CONV, [x, b.const(_w(rng, 12, 8, 1, 1))], **_POINTWISE)
    for i, (at, n) in enumerate(((0, 4), (4, 8))):
        part = slice_axis(b, y, 1, at, n)
        part = b.binary(Op.ADD, part, b.broadcast_to(b.const(_w(rng, 1, n, 1, 1)), b.shape(part)))
        b.output(f"y{i}", b.binary(Op.MUL, part, b.unary(Op.SIGMOID, part)))
    g = b.graph
    g2 = for_library(g)
    ops = [n.op for n in g2.nodes]
    assert ops.count(Op.SIGMOID) == 1 and ops.count(Op.MUL) == 1 and ops.count(Op.SLICE) == 2
    conv = ops.index(Op.CONV)
    assert all(g2.nodes[u].op is Op.ADD for u in g2.users()[conv])  # the bias right on the conv
    feed = _inputs(g, rng)
    want, got = evaluate(g, feed), evaluate(g2, feed)
    for out in want:
        np.testing.assert_allclose(got[out], want[out], rtol=RTOL, atol=ATOL)


def test_an_input_affine_map_read_elsewhere_is_not_folded():
    """Note [An affine map before a MatMul]: a post-norm block also adds the LayerNorm's
    output to the residual; folding would keep the map and add a second MatMul weight."""

    def block(residual: bool):
        rng = np.random.default_rng(0)
        b = GraphBuilder()
        x = b.input("x", (1, 4, 8), "float32")
        y = b.binary(Op.ADD, b.binary(Op.MUL, x, b.const(_w(rng, 8))), b.const(_w(rng, 8)))
        z = b.add(Op.MATMUL, [y, b.const(_w(rng, 8, 8))])
        b.output("y", b.binary(Op.ADD, z, y) if residual else z)
        return b.graph

    rule = RULES_BY_NAME["fold_input_affine_into_matmul"]
    assert apply_rule(block(True), rule) is None
    g2 = apply_rule(block(False), rule)
    assert g2 is not None
    assert [g2.nodes[i].op for i in g2.compute_ids()].count(Op.MUL) == 0  # the gain is in W
