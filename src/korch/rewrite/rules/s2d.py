"""A convolution with few output channels, run on the space-to-depth of its input.

Note [Space-to-depth convolutions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Blocked CPU convolutions (onnxruntime's NCHWc, with 16 channels a block on AVX-512)
compute output channels a block at a time, so a convolution with 3 output channels
does the work of 16: Candy's last layer, a 9x9 convolution from 32 channels to RGB at
224x224, took 10.9 of its 51 ms in onnxruntime (its costliest node, measured with
onnxruntime's profiler). The same convolution on the 2x2 space-to-depth of its input
has 4x the output channels (12, in one block) at a quarter of the positions:

    conv(x, W[Co, Ci, k, k]) = d2s(conv(s2d(x), W'[4 Co, 4 Ci, k//2+1, k//2+1]))
    W'[(a, b, o), (r, s, c), q, p] = W[o, c, 2q + r - a, 2p + s - b]  (zero outside)

where ``s2d`` moves each 2x2 pixel block into channels and ``d2s`` moves them back
(both a reshape, a transpose and a reshape). The true multiply-adds grow by
((k//2+1) * 2 / k)^2 (1.23x for k = 9); the blocked ones drop 3.2x. onnxruntime, the
whole Candy model, alternating in one process: 76.7 -> 68.7 ms.

The rewrite cost (Note [Rewrite cost]) rounds a convolution's output channels up to
``CONV_CHANNEL_BLOCK`` so that the search sees this; the rule applies to stride-1,
ungrouped, undilated convolutions with at most ``S2D_MAX_OUT`` output channels, a
kernel of at least 3 and an even output size.
"""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import Op
from korch.rewrite.pattern import Lookup, Match, P, Rule, X, is_float

S2D_MAX_OUT = 4


def _ok(g: Graph, m: Match) -> bool:
    node = g.nodes[m.roots[0]]
    w = m.node("w")
    if not is_float(node) or len(node.shape) != 4 or node.attr("group") != 1 or len(w.shape) != 4:
        return False
    if any(int(s) != 1 for s in node.attr("strides")) or any(int(d) != 1 for d in node.attr("dilations")):
        return False
    co, _, kh, kw = w.shape
    return co <= S2D_MAX_OUT and min(kh, kw) >= 3 and node.shape[2] % 2 == 0 and node.shape[3] % 2 == 0


def s2d_weight(w: np.ndarray) -> np.ndarray:
    """``W'`` of Note [Space-to-depth convolutions] for ``W[Co, Ci, kh, kw]``."""
    co, ci, kh, kw = w.shape
    qh, qw = kh // 2 + 1, kw // 2 + 1
    out = np.zeros((2, 2, co, 2, 2, ci, qh, qw), dtype=w.dtype)
    for a in (0, 1):
        for b in (0, 1):
            for r in (0, 1):
                for s in (0, 1):
                    for q in range(qh):
                        u = 2 * q + r - a
                        if not 0 <= u < kh:
                            continue
                        for p in range(qw):
                            v = 2 * p + s - b
                            if 0 <= v < kw:
                                out[a, b, :, r, s, :, q, p] = w[:, :, u, v]
    return out.reshape(4 * co, 4 * ci, qh, qw)


def _s2d(b: GraphBuilder, m: Match, v: Lookup) -> int:
    g = m.graph
    node = g.nodes[m.roots[0]]
    w = m.value("w")
    co, ci, kh, kw = w.shape
    n, _, ho, wo = node.shape
    x = v("x")
    pads = [int(p) for p in node.attr("pads")]  # begin..., end...
    # the input as the convolution reads it, each spatial size made even (a row or
    # column past the last one any output reads)
    hin, win = ho + kh - 1, wo + kw - 1
    extra_h, extra_w = hin % 2, win % 2
    pad_pairs = ((0, 0), (0, 0), (pads[0], pads[2] + extra_h), (pads[1], pads[3] + extra_w))
    if any(a or e for a, e in pad_pairs):
        x = b.add(Op.PAD, [x], pads=pad_pairs, mode="constant", value=0.0)
    hs, ws = (hin + extra_h) // 2, (win + extra_w) // 2
    x = b.reshape(x, (n, ci, hs, 2, ws, 2))
    x = b.reshape(b.transpose(x, (0, 3, 5, 1, 2, 4)), (n, 4 * ci, hs, ws))
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)
    y = b.add(Op.CONV, [x, b.const(s2d_weight(w))], **attrs)
    y = b.reshape(y, (n, 2, 2, co, ho // 2, wo // 2))
    return b.reshape(b.transpose(y, (0, 3, 4, 1, 5, 2)), (n, co, ho, wo))


S2D_RULES = (
    Rule(
        "conv_few_outputs_space_to_depth",
        P(Op.CONV, X("x"), X("w", Op.CONST)),
        _s2d,
        _ok,
        "conv(x, W[Co <= 4, Ci, k, k]) = d2s(conv(s2d(x), W'[4 Co, 4 Ci, k//2+1, k//2+1]))  "
        "(Note [Space-to-depth convolutions])",
    ),
)
