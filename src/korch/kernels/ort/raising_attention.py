"""Self-attention raised to onnxruntime's Attention operator (Note [Raising attention]).

Used by ``korch.kernels.ort.export``, after the Softmax raise of ``korch.kernels.ort.raising``.
"""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, strip_ones
from korch.ir.ops import Op
from korch.kernels.ort.raising import const_value, effective

# Note [Raising attention]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# softmax(Q K^T * scale + M) V, with Q, K and V the heads of projections X @ W + b of
# one X, goes to onnxruntime as its contrib Attention operator: one kernel for the
# three projections (the weights concatenated at export), the head split, both batched
# MatMuls and the Softmax, with M as its attention_bias. vit_tiny_b1 as one session:
# 12.1 -> 11.2 ms, alternating (the Reshapes, Transposes, the Split of timm's fused
# qkv and its Squeezes are gone). Recognised: the head split as a RESHAPE to
# [B, S, N, H] and a TRANSPOSE (Hugging Face's BERT: three projections), and timm's
# RESHAPE to [B, S, 3, N, H], TRANSPOSE (2, 0, 3, 1, 4) and SLICEs of one fused
# projection; scalar factors on Q, K^T or the scores multiply into ``scale``. Every
# node between X and the output RESHAPE must be private to the pattern.


def raise_attention(
    graph: Graph, eff: dict[int, tuple[int, ...]], const_inputs: dict, raised: dict
) -> dict[int, tuple[tuple[int, ...], str, dict]]:
    """Attention (com.microsoft) for self-attention over raised Softmaxes (Note
    [Raising attention]); ``attrs`` carry the concatenated weights and bias as arrays
    under ``weights`` and ``bias`` for the exporter."""
    ins, users = effective(graph, eff)
    nodes = graph.nodes
    outs = set(graph.outputs.values())
    input_name = {nid: name for name, nid in graph.inputs.items()}

    def value(nid: int) -> np.ndarray | None:
        return const_value(graph, nid, const_inputs, input_name, ins)

    def unscale(nid: int, inner: set[int]) -> tuple[int, float]:
        """(x, s) for ``nid`` = x times scalar constants s."""
        s = 1.0
        while nodes[nid].op is Op.MUL and len(ins(nid)) == 2:
            a, b = ins(nid)
            vb = value(b)
            if vb is None or vb.size != 1:
                a, b = b, a
                vb = value(b)
            if vb is None or vb.size != 1:
                break
            inner.add(nid)
            s *= float(vb.reshape(()))
            nid = a
        return nid, s

    def projection(f: int, inner: set[int]) -> tuple[int, np.ndarray, np.ndarray] | None:
        """(X, W, b) for ``f`` = X @ W + b (b optional) with constant W and b."""
        bias = None
        if nodes[f].op is Op.ADD and len(ins(f)) == 2:
            m, b = ins(f)
            if nodes[m].op is not Op.MATMUL:
                m, b = b, m
            bias = value(b)
            if bias is None or nodes[m].op is not Op.MATMUL:
                return None
            inner.add(f)
            f = m
        if nodes[f].op is not Op.MATMUL:
            return None
        x, w = ins(f)
        wv = value(w)
        if wv is None or wv.ndim != 2 or len(nodes[x].shape) != 3:
            return None
        d = wv.shape[1]
        bias = np.zeros(d, wv.dtype) if bias is None else bias
        if strip_ones(bias.shape) != (d,):  # one bias per column, not per row
            return None
        inner.add(f)
        return x, wv, bias.reshape(d)

    def heads(nid: int, perm_out: tuple[int, ...], inner: set[int]) -> tuple[int, np.ndarray, np.ndarray, int] | None:
        """(X, W, b, N) for the heads of a projection of X, as [B, N, S, H] (``perm_out``
        (0, 2, 1, 3)) or transposed [B, N, H, S] (``perm_out`` (0, 2, 3, 1))."""
        node = nodes[nid]
        if node.op is not Op.TRANSPOSE:
            return None
        perm = tuple(node.attr("perm"))
        (src,) = ins(nid)
        if perm == perm_out and nodes[src].op is Op.RESHAPE and len(nodes[src].shape) == 4:
            b_, s_, n_, h_ = nodes[src].shape
            (f,) = ins(src)
            if nodes[f].shape != (b_, s_, n_ * h_):
                return None
            p = projection(f, inner)
            if p is None:
                return None
            inner.update((nid, src))
            return (*p, n_)
        if perm_out == (0, 2, 3, 1) and perm == (0, 1, 3, 2):  # K^T of K's [B, N, S, H] heads
            got = heads_fused(src, inner) or heads(src, (0, 2, 1, 3), inner)
            if got is not None:
                inner.add(nid)
            return got
        return None

    def heads_fused(nid: int, inner: set[int]) -> tuple[int, np.ndarray, np.ndarray, int] | None:
        """timm's form: block j of RESHAPE(f, [B, S, 3, N, H]) moved to the front."""
        if nodes[nid].op is not Op.RESHAPE or len(nodes[nid].shape) != 4:
            return None
        (sl,) = ins(nid)
        if nodes[sl].op is not Op.SLICE:
            return None
        (t,) = ins(sl)
        if nodes[t].op is not Op.TRANSPOSE or tuple(nodes[t].attr("perm")) != (2, 0, 3, 1, 4):
            return None
        (r,) = ins(t)
        if nodes[r].op is not Op.RESHAPE or len(nodes[r].shape) != 5:
            return None
        b_, s_, k_, n_, h_ = nodes[r].shape
        starts, lengths, steps = (tuple(nodes[sl].attr(a)) for a in ("starts", "lengths", "steps"))
        if lengths != (1, b_, n_, s_, h_) or set(steps) != {1} or starts[1:] != (0, 0, 0, 0):
            return None
        (f,) = ins(r)
        if nodes[f].shape != (b_, s_, k_ * n_ * h_):
            return None
        p = projection(f, inner)
        if p is None:
            return None
        x, w, b = p
        j, d = starts[0], n_ * h_
        inner.update((nid, sl, t, r))
        return x, w[:, j * d : (j + 1) * d], b[j * d : (j + 1) * d], n_

    found: dict[int, tuple[tuple[int, ...], str, dict]] = {}
    for top, node in enumerate(nodes):
        if node.op is not Op.RESHAPE or node.dtype != "float32" or len(node.shape) != 3:
            continue
        (t,) = ins(top)
        if nodes[t].op is not Op.TRANSPOSE or tuple(nodes[t].attr("perm")) != (0, 2, 1, 3):
            continue
        (o,) = ins(t)
        if nodes[o].op is not Op.MATMUL:
            continue
        p, v = ins(o)
        sm = raised.get(p)
        if sm is None or sm[1] != "Softmax":
            continue
        inner = {t, o, p}
        (scores,) = ins(p)
        mask = None
        if nodes[scores].op is Op.ADD and len(ins(scores)) == 2:
            a, m = ins(scores)
            if nodes[a].op is not Op.MUL and nodes[a].op is not Op.MATMUL:
                a, m = m, a
            inner.add(scores)
            scores, mask = a, m
        scores, scale = unscale(scores, inner)
        if nodes[scores].op is not Op.MATMUL:
            continue
        inner.add(scores)
        q4, k4t = ins(scores)
        q4, sq = unscale(q4, inner)
        k4t, sk = unscale(k4t, inner)
        q = heads_fused(q4, inner) or heads(q4, (0, 2, 1, 3), inner)
        k = heads(k4t, (0, 2, 3, 1), inner)
        vv = heads_fused(v, inner) or heads(v, (0, 2, 1, 3), inner)
        if q is None or k is None or vv is None or not (q[0] == k[0] == vv[0]) or not (q[3] == k[3] == vv[3]):
            continue
        x = q[0]
        bsz, seq, _ = nodes[x].shape
        n_heads = q[3]
        shapes = {q[1].shape, k[1].shape, vv[1].shape}
        if len(shapes) != 1 or node.shape != (bsz, seq, q[1].shape[1]) or q[1].shape[1] % n_heads:
            continue
        if mask is not None:
            ms = nodes[mask].shape
            if len(ms) != 4 or ms[2:] != (seq, seq) or ms[0] not in (1, bsz) or ms[1] not in (1, n_heads):
                continue
            if nodes[mask].dtype != "float32":
                continue
        if any(i in outs or not set(users[i]) <= inner | {top} for i in inner):
            continue
        weights = np.concatenate([q[1], k[1], vv[1]], axis=1).astype(np.float32)
        bias = np.concatenate([q[2], k[2], vv[2]]).astype(np.float32)
        srcs = (x,) if mask is None else (x, mask)
        attrs = {"num_heads": int(n_heads), "scale": scale * sq * sk, "weights": weights, "bias": bias}
        found[top] = (srcs, "Attention", attrs)
    return found
