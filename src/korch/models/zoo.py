"""Small ONNX test models built with ``onnx.helper`` (no torch).

Each is one block of a model family the paper or the design brief benchmarks,
written in the operator forms exporters emit (Gelu as Div/Erf/Add/Mul/Mul, SiLU as
Sigmoid*x, Pad with a pads tensor, Split with a split tensor, Resize with scales),
opset 17, float32, static shapes, random weights from a fixed seed, and small
enough that onnxruntime runs each in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 9


class _Net:
    """Accumulates nodes and initializers; every tensor name is fresh."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count = 0

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def input(self, name: str, shape: Sequence[int]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, tensor: str, shape: Sequence[int]) -> None:
        self.outputs.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, list(shape)))

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, *shape: int, fan_in: int | None = None, hint: str = "w") -> str:
        scale = 1.0 / math.sqrt(fan_in if fan_in is not None else shape[0])
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), hint)

    def scalar(self, value: float) -> str:
        return self.const(np.array(value, dtype=np.float32), "s")

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.array(values, dtype=np.int64), "i")

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, out: str | None = None, **attrs) -> str:
        outs = [out or self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(f"n_{op_type}"), **attrs))
        return outs[0]

    def op_multi(self, op_type: str, inputs: Sequence[str], n_out: int, **attrs) -> list[str]:
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(f"n_{op_type}"), **attrs))
        return outs

    # --- layers, as exporters write them ------------------------------------------
    def linear(self, x: str, din: int, dout: int) -> str:
        y = self.op("MatMul", [x, self.weight(din, dout)])
        return self.op("Add", [y, self.const((self.rng.standard_normal(dout) * 0.1).astype(np.float32), "b")])

    def layer_norm(self, x: str, dim: int) -> str:
        gamma = self.const((1 + 0.1 * self.rng.standard_normal(dim)).astype(np.float32), "gamma")
        beta = self.const((0.1 * self.rng.standard_normal(dim)).astype(np.float32), "beta")
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        erf = self.op("Erf", [self.op("Div", [x, self.scalar(math.sqrt(2.0))])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [erf, self.scalar(1.0)])]), self.scalar(0.5)])

    def conv(
        self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0, group: int = 1, bias: bool = True
    ) -> str:
        w = self.weight(cout, cin // group, k, k, fan_in=cin // group * k * k)
        inputs = [x, w]
        if bias:
            inputs.append(self.const((0.1 * self.rng.standard_normal(cout)).astype(np.float32), "b"))
        return self.op(
            "Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, dilations=[1, 1], group=group
        )

    def batch_norm(self, x: str, c: int) -> str:
        r = self.rng
        scale = self.const((1 + 0.1 * r.standard_normal(c)).astype(np.float32), "bn_scale")
        bias = self.const((0.1 * r.standard_normal(c)).astype(np.float32), "bn_bias")
        mean = self.const((0.1 * r.standard_normal(c)).astype(np.float32), "bn_mean")
        var = self.const((0.5 + r.random(c)).astype(np.float32), "bn_var")
        return self.op("BatchNormalization", [x, scale, bias, mean, var], epsilon=1e-3, momentum=0.97)

    def conv_bn_silu(self, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        y = self.batch_norm(self.conv(x, cin, cout, k, stride, k // 2, bias=False), cout)
        return self.op("Mul", [y, self.op("Sigmoid", [y])])

    def attention(self, q: str, k: str, v: str, seq_q: int, seq_k: int, dim: int, heads: int) -> str:
        """Multi-head attention on [1, seq, dim] projections; returns [1, seq_q, dim]."""
        dh = dim // heads
        qh = self.op("Transpose", [self.op("Reshape", [q, self.ints([1, seq_q, heads, dh])])], perm=[0, 2, 1, 3])
        kt = self.op("Transpose", [self.op("Reshape", [k, self.ints([1, seq_k, heads, dh])])], perm=[0, 2, 3, 1])
        vh = self.op("Transpose", [self.op("Reshape", [v, self.ints([1, seq_k, heads, dh])])], perm=[0, 2, 1, 3])
        scores = self.op("Div", [self.op("MatMul", [qh, kt]), self.scalar(math.sqrt(dh))])
        ctx = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), vh])
        ctx = self.op("Transpose", [ctx], perm=[0, 2, 1, 3])
        return self.op("Reshape", [ctx, self.ints([1, seq_q, dim])])

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="korch.models")
        model.ir_version = IR_VERSION
        return model


def attention(seed: int = 0, seq: int = 64, dim: int = 128, heads: int = 4) -> onnx.ModelProto:
    """A BERT self-attention block: Q/K/V projections, softmax attention, output
    projection, residual Add, LayerNormalization."""
    n = _Net("attention", seed)
    x = n.input("x", (1, seq, dim))
    q, k, v = (n.linear(x, dim, dim) for _ in range(3))
    ctx = n.attention(q, k, v, seq, seq, dim, heads)
    y = n.layer_norm(n.op("Add", [n.linear(ctx, dim, dim), x]), dim)
    n.output(y, (1, seq, dim))
    return n.model()


def mlp(seed: int = 0, seq: int = 64, dim: int = 128) -> onnx.ModelProto:
    """A transformer MLP: LayerNorm, MatMul+bias, erf Gelu, MatMul+bias, residual."""
    n = _Net("mlp", seed)
    x = n.input("x", (1, seq, dim))
    h = n.gelu(n.linear(n.layer_norm(x, dim), dim, 4 * dim))
    y = n.op("Add", [n.linear(h, 4 * dim, dim), x])
    n.output(y, (1, seq, dim))
    return n.model()


def candy_block(seed: int = 0, c: int = 32, hw: int = 32) -> onnx.ModelProto:
    """A fast-style-transfer residual block: (reflect Pad, Conv, InstanceNorm, Relu) x2, Add."""
    n = _Net("candy_block", seed)
    x = n.input("x", (1, c, hw, hw))
    h = x
    for _ in range(2):
        h = n.op("Pad", [h, n.ints([0, 0, 1, 1, 0, 0, 1, 1])], mode="reflect")
        h = n.conv(h, c, c, 3)
        scale = n.const((1 + 0.1 * n.rng.standard_normal(c)).astype(np.float32), "in_scale")
        bias = n.const((0.1 * n.rng.standard_normal(c)).astype(np.float32), "in_bias")
        h = n.op("Relu", [n.op("InstanceNormalization", [h, scale, bias], epsilon=1e-5)])
    n.output(n.op("Add", [h, x]), (1, c, hw, hw))
    return n.model()


def segformer_block(seed: int = 0, hw: int = 16, dim: int = 64, heads: int = 2, sr: int = 4) -> onnx.ModelProto:
    """A SegFormer encoder block: efficient self-attention (keys and values from tokens
    reduced by a stride-``sr`` Conv and a LayerNorm) and a Mix-FFN (MatMul, depthwise
    3x3 Conv on the token image, Gelu, MatMul), each with a residual."""
    n = _Net("segformer_block", seed)
    tokens, reduced = hw * hw, (hw // sr) ** 2
    x = n.input("x", (1, tokens, dim))
    h = n.layer_norm(x, dim)
    q = n.linear(h, dim, dim)
    img = n.op("Reshape", [n.op("Transpose", [h], perm=[0, 2, 1]), n.ints([1, dim, hw, hw])])
    red = n.conv(img, dim, dim, sr, stride=sr)
    red = n.op("Transpose", [n.op("Reshape", [red, n.ints([1, dim, reduced])])], perm=[0, 2, 1])
    red = n.layer_norm(red, dim)
    k, v = n.linear(red, dim, dim), n.linear(red, dim, dim)
    ctx = n.attention(q, k, v, tokens, reduced, dim, heads)
    x = n.op("Add", [n.linear(ctx, dim, dim), x])
    # Mix-FFN
    hidden = 4 * dim
    f = n.linear(n.layer_norm(x, dim), dim, hidden)
    fimg = n.op("Reshape", [n.op("Transpose", [f], perm=[0, 2, 1]), n.ints([1, hidden, hw, hw])])
    fimg = n.conv(fimg, hidden, hidden, 3, pad=1, group=hidden)
    f = n.op("Transpose", [n.op("Reshape", [fimg, n.ints([1, hidden, tokens])])], perm=[0, 2, 1])
    y = n.op("Add", [n.linear(n.gelu(f), hidden, dim), x])
    n.output(y, (1, tokens, dim))
    return n.model()


def yolo_block(seed: int = 0, c: int = 16, hw: int = 64) -> onnx.ModelProto:
    """A YOLOv5/v8-like neck piece: stride-2 Conv+BN+SiLU, a C2f-style Split into two
    branches with a residual bottleneck, Concat, SPPF (three chained MaxPools,
    Concat), nearest Resize x2 and a Concat with the input."""
    n = _Net("yolo_block", seed)
    x = n.input("x", (1, c, hw, hw))
    c2 = 2 * c
    h = n.conv_bn_silu(x, c, c2, 3, stride=2)  # [1, 2c, hw/2, hw/2]
    h = n.conv_bn_silu(h, c2, c2, 1)
    a, b = n.op_multi("Split", [h, n.ints([c, c])], 2, axis=1)
    t = n.conv_bn_silu(n.conv_bn_silu(b, c, c, 1), c, c, 3)
    b2 = n.op("Add", [b, t])
    h = n.conv_bn_silu(n.op("Concat", [a, b, b2], axis=1), 3 * c, c2, 1)
    # SPPF
    s0 = n.conv_bn_silu(h, c2, c, 1)
    pools = [s0]
    for _ in range(3):
        pools.append(n.op("MaxPool", [pools[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
    h = n.conv_bn_silu(n.op("Concat", pools, axis=1), 4 * c, c2, 1)
    up = n.op(
        "Resize",
        [h, "", n.const(np.array([1, 1, 2, 2], dtype=np.float32), "scales")],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )
    y = n.conv_bn_silu(n.op("Concat", [up, x], axis=1), c2 + c, c, 1)
    n.output(y, (1, c, hw, hw))
    return n.model()


def opaque(seed: int = 0, seq: int = 64, dim: int = 128, k: int = 16) -> onnx.ModelProto:
    """Fusable ops around TopK, which no fission rule splits into primitives: a linear
    layer with Relu, TopK over the features, a softmax of the top values, and a
    residual output that bypasses TopK."""
    n = _Net("opaque", seed)
    x = n.input("x", (1, seq, dim))
    h = n.op("Relu", [n.linear(x, dim, dim)])
    values, _indices = n.op_multi("TopK", [h, n.ints([k])], 2, axis=-1, largest=1, sorted=1)
    y = n.op("Softmax", [n.op("Mul", [values, n.scalar(0.5)])], axis=-1)
    z = n.op("Add", [n.op("Sigmoid", [h]), x])
    n.output(y, (1, seq, k))
    n.output(z, (1, seq, dim))
    return n.model()


def encoder12(
    seed: int = 0, layers: int = 12, seq: int = 64, dim: int = 256, heads: int = 8, ffn: int = 1024
) -> onnx.ModelProto:
    """A 12-layer BERT-style encoder (post-LayerNorm) for the scale benchmark: each layer
    is self-attention with an additive attention mask, residual, LayerNorm, a Gelu MLP,
    residual, LayerNorm. As some exporters write it, attention runs head by head (Q, K
    and V Split into heads, one scores/softmax/context chain per head, Concat) and
    LayerNorm is written out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
    Add), so the model has over 2,000 primitives. Every layer has its own weights; weights are kernel inputs, so
    equal layers share canonical kernels (and measurements)."""
    n = _Net("encoder12", seed)
    x = n.input("x", (1, seq, dim))
    mask = n.const(np.where(np.arange(seq) < seq - 4, 0.0, -1e4).astype(np.float32).reshape(1, 1, seq), "mask")

    def layer_norm(h: str) -> str:
        mean = n.op("ReduceMean", [h], axes=[-1], keepdims=1)
        d = n.op("Sub", [h, mean])
        var = n.op("ReduceMean", [n.op("Pow", [d, n.scalar(2.0)])], axes=[-1], keepdims=1)
        y = n.op("Div", [d, n.op("Sqrt", [n.op("Add", [var, n.scalar(1e-5)])])])
        gamma = n.const((1 + 0.1 * n.rng.standard_normal(dim)).astype(np.float32), "gamma")
        beta = n.const((0.1 * n.rng.standard_normal(dim)).astype(np.float32), "beta")
        return n.op("Add", [n.op("Mul", [y, gamma]), beta])

    dh = dim // heads
    h = x
    for _ in range(layers):
        split = n.ints([dh] * heads)
        qs, ks, vs = (n.op_multi("Split", [n.linear(h, dim, dim), split], heads, axis=2) for _ in range(3))
        ctxs = []
        for qh, kh, vh in zip(qs, ks, vs):
            scores = n.op("MatMul", [qh, n.op("Transpose", [kh], perm=[0, 2, 1])])
            scores = n.op("Add", [n.op("Div", [scores, n.scalar(math.sqrt(dh))]), mask])
            ctxs.append(n.op("MatMul", [n.op("Softmax", [scores], axis=-1), vh]))
        ctx = n.op("Concat", ctxs, axis=2)
        h = layer_norm(n.op("Add", [n.linear(ctx, dim, dim), h]))
        f = n.linear(n.gelu(n.linear(h, dim, ffn)), ffn, dim)
        h = layer_norm(n.op("Add", [f, h]))
    n.output(h, (1, seq, dim))
    return n.model()


def chain6(seed: int = 0, rows: int = 64, cols: int = 128) -> onnx.ModelProto:
    """Six elementwise primitives in a chain with a residual (21 candidate kernels):
    the smallest model that still profiles for a while, for resume and RPC tests."""
    n = _Net("chain6", seed)
    x = n.input("x", (rows, cols))
    a = n.op("Exp", [n.op("Tanh", [n.op("Mul", [x, n.weight(rows, cols)])])])
    y = n.op("Mul", [n.op("Sigmoid", [n.op("Add", [a, x])]), n.scalar(0.5)])
    n.output(y, (rows, cols))
    return n.model()


# Built by name (korch.models.build) but not in NAMES, which tests and examples
# iterate over: a large model for the scale benchmark, a tiny one for process tests.
EXTRA_BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {"encoder12": encoder12, "chain6": chain6}

BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "attention": attention,
    "mlp": mlp,
    "candy_block": candy_block,
    "segformer_block": segformer_block,
    "yolo_block": yolo_block,
    "opaque": opaque,
}
