"""Nearest 2x upsampling followed by a 3x3 convolution, as a 2x2 convolution at the low
resolution whose phases Col2Im interleaves (Note [Sub-pixel convolution]).

Used by ``korch.kernels.ort.export`` on every model it exports; an ONNX-to-ONNX pass.
"""

from __future__ import annotations

import numpy as np

from korch.kernels.ort.layout import finish_rewrite, node_attrs, users_of

# Note [Sub-pixel convolution]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A decoder's Resize(nearest, 2x) -> Pad(1) -> Conv(3x3) (Candy, fast style transfer)
# convolves an image in which every pixel is repeated 2x2, so each output pixel's
# phase (its row's and column's parity) sees only 2 distinct input rows and columns:
# along one axis, with U[j] = X[j // 2] and taps w0 w1 w2,
#     O[2m]   = w0 X[m-1] + (w1 + w2) X[m]
#     O[2m+1] = (w0 + w1) X[m] + w2 X[m+1].
# So the four phases are four 2x2 convolutions of X, padded by one: with the edge
# value when the Pad was reflect (a reflected row of the upsampled image is the edge
# row of X), with zero when it was zero. One Conv with 2x2 kernels and 4 x Cout
# output channels over the padded X, at every one of its (H+1) x (W+1) positions,
# gives phase "odd" of output m-1 and phase "even" of output m at position m: laid
# out as 2x2 blocks, that is the output image shifted by one row and column. Col2Im
# (opset 18) with 2x2 blocks at stride 2 lays them out and, with pads of 1, drops the
# first and last row and column. Exact up to the order of float additions (taps are
# summed in the weights).
#
# It does 16 multiply-adds per input pixel and output channel instead of 36, reads a
# quarter of the pixels, and drops the upsampled image and its reflect Pad (which
# onnxruntime runs outside its blocked layout). DepthToSpace and a Slice would also
# lay the phases out, but onnxruntime's DepthToSpace is a generic 6-D transpose: 4.8
# ms for candy_b1's last upsampling layer (32 x 226 x 226), more than the convolution
# saved; Col2Im is a strided copy. candy_b1's rewritten graph as one session: 55.3 ->
# 50.0 ms (2 threads, alternating).

_PHASES = (
    # phase 0 (row 2m-1, "odd"): taps (w0 + w1, w2); phase 1 (row 2m, "even"): (w0, w1 + w2)
    np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
    np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]),
)


def subpixel_weights(w: np.ndarray) -> np.ndarray:
    """[Cout, Cin, 3, 3] -> [4 Cout, Cin, 2, 2], channel 4 o + 2 ph + pw (Col2Im's order:
    channel, then block row, then block column)."""
    phases = [
        np.einsum("ai,ocij,bj->ocab", _PHASES[ph], w.astype(np.float64), _PHASES[pw]) for ph in (0, 1) for pw in (0, 1)
    ]
    return np.stack(phases, axis=1).reshape(4 * w.shape[0], w.shape[1], 2, 2).astype(w.dtype)


def subpixel_convs(model):
    """``model`` (an ``onnx.ModelProto``, changed in place and returned) with every
    Resize(nearest 2x) -> [Pad(1)] -> Conv(3x3) of Note [Sub-pixel convolution]
    rewritten."""
    from onnx import helper, numpy_helper

    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 18 or not any(n.op_type == "Resize" for n in g.node):
        return model  # Col2Im is opset 18
    inits = {t.name: t for t in g.initializer}
    users = users_of(g)
    outputs = {v.name for v in g.output}

    def const(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]) if name in inits else None

    def only_user(name: str):
        us = users.get(name, [])
        return us[0] if len(us) == 1 and name not in outputs else None

    replaced: dict[int, list] = {}  # id(conv) -> nodes in its place
    dead: set[int] = set()
    fresh = iter(range(1 << 30))
    new_inits = []
    for r in g.node:
        if r.op_type != "Resize":
            continue
        a = node_attrs(r)
        if (
            a.get("mode", b"nearest") != b"nearest"
            or a.get("coordinate_transformation_mode", b"half_pixel") != b"asymmetric"
            or a.get("nearest_mode", b"round_prefer_floor") != b"floor"
        ):
            continue
        x = r.input[0]
        sizes = const(r.input[3]) if len(r.input) > 3 and r.input[3] else None
        scales = const(r.input[2]) if len(r.input) > 2 and r.input[2] else None
        # the input's shape: from the sizes and the scale 2 this pass requires
        if sizes is not None and sizes.size == 4:
            if sizes[2] % 2 or sizes[3] % 2:
                continue
            h, w = int(sizes[2]) // 2, int(sizes[3]) // 2
        elif scales is not None and scales.size == 4 and list(scales) == [1, 1, 2, 2]:
            h = w = None
        else:
            continue
        nxt = only_user(r.output[0])
        pad_mode = None
        if nxt is not None and nxt.op_type == "Pad":
            pads = const(nxt.input[1]) if len(nxt.input) > 1 else None
            mode = node_attrs(nxt).get("mode", b"constant")
            value = const(nxt.input[2]) if len(nxt.input) > 2 and nxt.input[2] else None
            if pads is None or list(pads) != [0, 0, 1, 1, 0, 0, 1, 1] or len(nxt.input) > 3:
                continue
            if mode == b"reflect" or mode == b"edge":
                pad_mode = "edge"  # a reflected (or edge) row of the upsampled image is X's edge row
            elif mode == b"constant" and (value is None or float(value.reshape(-1)[0]) == 0.0):
                pad_mode = "zero"
            else:
                continue
            conv = only_user(nxt.output[0])
            conv_pads = [0, 0, 0, 0]
        else:
            conv, nxt = nxt, None
            conv_pads = [1, 1, 1, 1]
            pad_mode = "zero"
        if conv is None or conv.op_type != "Conv" or conv.input[0] != (nxt or r).output[0]:
            continue
        ca = node_attrs(conv)
        wt = const(conv.input[1]) if len(conv.input) > 1 else None
        bias = const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
        if (
            wt is None
            or wt.ndim != 4
            or wt.shape[2:] != (3, 3)
            or ca.get("group", 1) != 1
            or list(ca.get("strides", [1, 1])) != [1, 1]
            or list(ca.get("dilations", [1, 1])) != [1, 1]
            or list(ca.get("pads", [0, 0, 0, 0])) != conv_pads
            or ca.get("auto_pad", b"NOTSET") != b"NOTSET"
            or (len(conv.input) > 2 and conv.input[2] and bias is None)
        ):
            continue
        if h is None:
            continue  # scales without sizes: the shape is not known here
        k = next(fresh)

        def init(base: str, value, k: int = k) -> str:
            name = f"subpixel{k}_{base}"
            new_inits.append(numpy_helper.from_array(np.asarray(value), name))
            return name

        nodes, src = [], x
        if pad_mode == "edge":
            src = f"subpixel{k}_padded"
            nodes.append(
                helper.make_node(
                    "Pad", [x, init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], [src], mode="edge"
                )
            )
        conv_in = [src, init("W", subpixel_weights(wt))]
        if bias is not None:
            conv_in.append(init("B", np.repeat(bias, 4)))
        z, cols = f"subpixel{k}_phases", f"subpixel{k}_columns"
        pads = [0, 0, 0, 0] if pad_mode == "edge" else [1, 1, 1, 1]
        nodes += [
            helper.make_node("Conv", conv_in, [z], kernel_shape=[2, 2], pads=pads),
            helper.make_node("Reshape", [z, init("shape", np.array([0, 4 * wt.shape[0], -1], np.int64))], [cols]),
            helper.make_node(
                "Col2Im",
                [cols, init("image", np.array([2 * h, 2 * w], np.int64)), init("block", np.array([2, 2], np.int64))],
                [conv.output[0]],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
            ),
        ]
        replaced[id(conv)] = nodes
        dead |= {id(r)} | ({id(nxt)} if nxt is not None else set())
    if not replaced:
        return model
    new_nodes = []
    for n in g.node:
        if id(n) in dead:
            continue
        new_nodes.extend(replaced.get(id(n), [n]))
    del g.node[:]
    g.node.extend(new_nodes)
    finish_rewrite(g, new_inits)
    return model
