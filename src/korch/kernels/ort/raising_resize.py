"""Fission's resizes raised back to onnxruntime's Resize (Note [Raising] in
``korch.kernels.ort.raising``): nearest upsampling Gathers and the Gather/Mul/Add steps of a
linear resize. Used by ``korch.kernels.ort.export``.
"""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.ort.raising import const_value, effective


def upsample_factor(idx: np.ndarray, n_in: int) -> int:
    """k when ``idx`` is ``arange(k * n_in) // k`` (nearest upsampling by k >= 2), else 0."""
    if idx.ndim != 1 or n_in < 1 or idx.size % n_in or idx.size < 2 * n_in:
        return 0
    k = idx.size // n_in
    return k if np.array_equal(idx, np.arange(idx.size) // k) else 0


def raise_nearest_upsamples(
    graph: Graph, eff: dict[int, tuple[int, ...]]
) -> dict[int, tuple[tuple[int, ...], str, dict]]:
    """One nearest Resize for two chained nearest-upsample Gathers on different axes
    (fission's 2-D nearest Resize, one Gather per axis; each alone is exported as a
    one-axis Resize): candy_b1's two 2x upsamples ran as four Resizes, 2.65 ms of
    onnxruntime's time against 0.41 ms for the model's two (2 threads)."""
    ins, users = effective(graph, eff)
    outs = set(graph.outputs.values())
    nodes = graph.nodes

    def upsample_axis(nid: int) -> int | None:
        node = nodes[nid]
        if node.op is not Op.GATHER or len(node.shape) < 3:
            return None
        idx = node.gather_indices()
        axis = int(node.attr("axis"))
        return axis if upsample_factor(idx, nodes[ins(nid)[0]].shape[axis]) else None

    found: dict[int, tuple[tuple[int, ...], str, dict]] = {}
    for d, node in enumerate(nodes):
        a = upsample_axis(d)
        if a is None:
            continue
        (u,) = ins(d)
        b = upsample_axis(u)
        if b is None or b == a or u in outs or set(users[u]) != {d}:
            continue
        found[d] = (
            ins(u),
            "Resize",
            {
                "sizes": list(node.shape),
                "mode": "nearest",
                "coordinate_transformation_mode": "asymmetric",
                "nearest_mode": "floor",
            },
        )
    return found


_COORD_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric")


def _linear_coord_mode(lo, hi, w_lo, w_hi, out: int, size: int) -> str | None:
    """The coordinate_transformation_mode whose linear resize from ``size`` to ``out``
    (scale out/size in float32, as onnxruntime derives it from sizes) gives exactly
    these neighbours and weights (fission/resize.py computes them the same way)."""
    from korch.fission.resize import _source_coords

    f = np.float32
    for mode in _COORD_MODES:
        try:
            coords = _source_coords(mode, out, size, f(out) / f(size))
        except Exception:  # noqa: BLE001 - a mode that does not apply
            continue
        coords = np.clip(coords, f(0), f(size - 1))
        want_lo = coords.astype(np.int64)
        want_hi = np.minimum(want_lo + 1, size - 1)
        wl, wh = np.abs(coords - want_hi.astype(f)), np.abs(coords - want_lo.astype(f))
        same = want_lo == want_hi
        wl[same], wh[same] = 0.5, 0.5
        if (
            np.array_equal(lo, want_lo)
            and np.array_equal(hi, want_hi)
            and np.array_equal(w_lo, wl.astype(w_lo.dtype))
            and np.array_equal(w_hi, wh.astype(w_hi.dtype))
        ):
            return mode
    return None


def raise_linear_resizes(
    graph: Graph, eff: dict[int, tuple[int, ...]], const_inputs: dict[str, np.ndarray] | None = None
) -> dict[int, tuple[tuple[int, ...], str, dict]]:
    """Resize (linear) for fission's per-axis ADD(MUL(GATHER(x, lo), w_lo),
    MUL(GATHER(x, hi), w_hi)) on the spatial axes of an NCHW tensor; two such steps over
    H then W become one bilinear Resize. onnxruntime runs Resize in one pass (in its
    blocked layout after a Conv); as Gathers on inner axes it is a generic copy
    (segformer_b1's decode head: 12 Gathers on tensors up to 256x128x128).
    ``attrs["sizes"]`` is the output shape (the exporter feeds it as Resize's sizes).
    The weights are constants, or inputs with a value in ``const_inputs`` (a kernel's)."""
    ins, users = effective(graph, eff)
    input_name = {nid: name for name, nid in graph.inputs.items()}
    const_inputs = const_inputs or {}

    def value(nid: int) -> np.ndarray | None:
        return const_value(graph, nid, const_inputs, input_name)

    outs = set(graph.outputs.values())
    nodes = graph.nodes
    only = lambda nid, allowed: nid not in outs and set(users[nid]) <= allowed  # noqa: E731

    def half(m: int, top: int) -> tuple[int, int, np.ndarray, np.ndarray, int] | None:
        """(x, axis, indices, weights, the GATHER) of MUL(GATHER(x), w) private to ``top``."""
        if nodes[m].op is not Op.MUL or len(ins(m)) != 2 or not only(m, {top}):
            return None
        g, w = ins(m)
        if nodes[g].op is not Op.GATHER:
            g, w = w, g
        if nodes[g].op is not Op.GATHER or not only(g, {m}):
            return None
        axis = int(nodes[g].attr("axis"))
        wv = value(w)
        if wv is None or wv.size != nodes[g].shape[axis] or nodes[w].shape[axis] != wv.size:
            return None
        return ins(g)[0], axis, np.asarray(nodes[g].attr("indices")).reshape(-1), wv.reshape(-1), g

    found: dict[int, tuple[tuple[int, ...], str, dict]] = {}
    for t, node in enumerate(nodes):
        if node.op is not Op.ADD or len(node.shape) != 4 or np.dtype(node.dtype).kind != "f" or len(ins(t)) != 2:
            continue
        a, b = (half(m, t) for m in ins(t))
        if a is None or b is None or a[0] != b[0] or a[1] != b[1] or a[1] not in (2, 3):
            continue
        x, axis = a[0], a[1]
        size, out = nodes[x].shape[axis], node.shape[axis]
        mode = _linear_coord_mode(a[2], b[2], a[3], b[3], out, size)
        if mode is None:
            mode = _linear_coord_mode(b[2], a[2], b[3], a[3], out, size)
        if mode is None:
            continue
        src, sizes = x, list(node.shape)
        inner = found.get(x)
        if inner is not None and only(x, {a[4], b[4]}) and inner[2]["coordinate_transformation_mode"] == mode:
            src = inner[0][0]  # H then W: one bilinear Resize
            del found[x]
        found[t] = ((src,), "Resize", {"mode": "linear", "coordinate_transformation_mode": mode, "sizes": sizes})
    return found
