"""Export the Korch model suite to ONNX from public model definitions with random weights.

Nothing is downloaded: every network is built from code (torch, ``timm`` with
``pretrained=False``, ``transformers`` from a config) with weights drawn from a fixed
seed, put in eval mode and exported with torch's TorchScript-based exporter
(``dynamo=False``), opset 17, static shapes. Beside each ``NAME.onnx`` goes
``NAME.torch.json``, a sidecar naming this script, the builder and the seed, so that
``korch bench`` can rebuild the same torch module (same weights) for the PyTorch
eager and torch.compile peers.

    .venv/bin/python benchmarks/export_suite.py            # all models -> benchmarks/models/
    .venv/bin/python benchmarks/export_suite.py vit_tiny bert2 --check

Needs the optional extra ``korch[bench]`` (torch, timm, transformers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "models"
OPSET = 17


# --- torchvision: timm imports it, but only for FrozenBatchNorm2d -------------------------
def _ensure_torchvision() -> None:
    """timm imports ``torchvision.ops.misc.FrozenBatchNorm2d`` at import time. A CPU-only torch
    with the PyPI torchvision wheel (built against CUDA torch) cannot load torchvision's C
    extension; none of the suite's models use torchvision ops, so stand in a minimal module."""
    try:
        import torchvision.ops.misc  # noqa: F401

        return
    except Exception:  # noqa: BLE001 - missing or broken (extension built for another torch)
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
    import torch

    class FrozenBatchNorm2d(torch.nn.Module):  # the subset timm touches
        def __init__(self, num_features: int, eps: float = 1e-5):
            super().__init__()
            self.eps = eps
            for n, v in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
                self.register_buffer(n, torch.full((num_features,), v))

        def forward(self, x):
            scale = self.weight * (self.running_var + self.eps).rsqrt()
            bias = self.bias - self.running_mean * scale
            return x * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)

    import importlib.abc
    import importlib.machinery

    class _Placeholder(type):
        def __getattr__(cls, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Placeholder(attr, (), {})

    class _Stub(types.ModuleType):
        """A torchvision (sub)module whose unknown attributes are inert placeholder classes
        (timm.data imports datasets and transforms it never calls while building a model)."""

        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Placeholder(attr, (), {"__init__": lambda self, *a, **k: None})

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):
            if fullname == "torchvision" or fullname.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            m = _Stub(spec.name)
            m.__path__ = []
            if spec.name == "torchvision":
                m.__version__ = "0.0+korch-stub"
            if spec.name == "torchvision.ops.misc":
                m.FrozenBatchNorm2d = FrozenBatchNorm2d
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())


# --- hand-written networks ------------------------------------------------------------------
def _candy():
    """Fast neural style transfer (Johnson et al.; the 'candy' model of the ONNX zoo):
    reflection-padded convs with InstanceNorm and ReLU, five residual blocks, two
    nearest-upsample convs."""
    from torch import nn

    class ConvLayer(nn.Sequential):
        def __init__(self, cin, cout, k, stride=1, upsample=None):
            layers = [nn.Upsample(scale_factor=upsample, mode="nearest")] if upsample else []
            layers += [nn.ReflectionPad2d(k // 2), nn.Conv2d(cin, cout, k, stride)]
            super().__init__(*layers)

    def conv_in_relu(cin, cout, k, stride=1, upsample=None):
        return [ConvLayer(cin, cout, k, stride, upsample), nn.InstanceNorm2d(cout, affine=True), nn.ReLU()]

    class Residual(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = nn.Sequential(
                ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True), nn.ReLU(),
                ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True),
            )  # fmt: skip

        def forward(self, x):
            return x + self.body(x)

    return nn.Sequential(
        *conv_in_relu(3, 32, 9),
        *conv_in_relu(32, 64, 3, 2),
        *conv_in_relu(64, 128, 3, 2),
        *[Residual(128) for _ in range(5)],
        *conv_in_relu(128, 64, 3, upsample=2),
        *conv_in_relu(64, 32, 3, upsample=2),
        ConvLayer(32, 3, 9),
    )


def _yolo():
    """A YOLOX-nano / YOLOv5n-style detector: Conv-BN-SiLU, CSP (C3) blocks, SPPF, a PAN
    neck with nearest upsampling and concats, and three 1x1 detection heads."""
    import torch
    from torch import nn

    class Conv(nn.Sequential):
        def __init__(self, cin, cout, k=1, s=1):
            super().__init__(nn.Conv2d(cin, cout, k, s, (k - 1) // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

    class Bottleneck(nn.Module):
        def __init__(self, c, shortcut=True):
            super().__init__()
            self.cv1, self.cv2, self.add = Conv(c, c, 1), Conv(c, c, 3), shortcut

        def forward(self, x):
            y = self.cv2(self.cv1(x))
            return x + y if self.add else y

    class C3(nn.Module):
        def __init__(self, cin, cout, n=1, shortcut=True):
            super().__init__()
            h = cout // 2
            self.cv1, self.cv2, self.cv3 = Conv(cin, h), Conv(cin, h), Conv(2 * h, cout)
            self.m = nn.Sequential(*[Bottleneck(h, shortcut) for _ in range(n)])

        def forward(self, x):
            return self.cv3(torch.cat([self.m(self.cv1(x)), self.cv2(x)], 1))

    class SPPF(nn.Module):
        def __init__(self, cin, cout, k=5):
            super().__init__()
            h = cin // 2
            self.cv1, self.cv2 = Conv(cin, h), Conv(4 * h, cout)
            self.m = nn.MaxPool2d(k, 1, k // 2)

        def forward(self, x):
            x = self.cv1(x)
            y1 = self.m(x)
            y2 = self.m(y1)
            return self.cv2(torch.cat([x, y1, y2, self.m(y2)], 1))

    class Yolo(nn.Module):
        def __init__(self, w=(16, 32, 64, 128, 256), n_out=85 * 3):
            super().__init__()
            a, b, c, d, e = w
            self.stem = Conv(3, a, 6, 2)
            self.s2 = nn.Sequential(Conv(a, b, 3, 2), C3(b, b, 1))
            self.s3 = nn.Sequential(Conv(b, c, 3, 2), C3(c, c, 2))
            self.s4 = nn.Sequential(Conv(c, d, 3, 2), C3(d, d, 3))
            self.s5 = nn.Sequential(Conv(d, e, 3, 2), C3(e, e, 1), SPPF(e, e))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.lat5, self.c4 = Conv(e, d, 1), C3(2 * d, d, 1, False)
            self.lat4, self.c3 = Conv(d, c, 1), C3(2 * c, c, 1, False)
            self.down3, self.n4 = Conv(c, c, 3, 2), C3(2 * c, d, 1, False)
            self.down4, self.n5 = Conv(d, d, 3, 2), C3(2 * d, e, 1, False)
            self.heads = nn.ModuleList(nn.Conv2d(ch, n_out, 1) for ch in (c, d, e))

        def forward(self, x):
            p3 = self.s3(self.s2(self.stem(x)))
            p4 = self.s4(p3)
            p5 = self.s5(p4)
            t5 = self.lat5(p5)
            t4 = self.lat4(self.c4(torch.cat([self.up(t5), p4], 1)))
            o3 = self.c3(torch.cat([self.up(t4), p3], 1))
            o4 = self.n4(torch.cat([self.down3(o3), t4], 1))
            o5 = self.n5(torch.cat([self.down4(o4), t5], 1))
            return tuple(h(o) for h, o in zip(self.heads, (o3, o4, o5)))

    return Yolo()


# --- library networks -----------------------------------------------------------------------
def _timm(name: str):
    _ensure_torchvision()
    import timm

    return timm.create_model(name, pretrained=False)


def _segformer():
    from torch import nn
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    cfg = SegformerConfig(  # MiT-b0 (nvidia/mit-b0), 150 ADE20K classes, decoder width 256
        num_channels=3,
        num_encoder_blocks=4,
        depths=[2, 2, 2, 2],
        sr_ratios=[8, 4, 2, 1],
        hidden_sizes=[32, 64, 160, 256],
        num_attention_heads=[1, 2, 5, 8],
        decoder_hidden_size=256,
        num_labels=150,
    )

    class Seg(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = SegformerForSemanticSegmentation(cfg)

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).logits

    return Seg()


def _bert2():
    from torch import nn
    from transformers import BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=2)  # BERT-base: hidden 768, 12 heads, ffn 3072

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = BertModel(cfg, add_pooling_layer=False)
            self.m.set_attn_implementation("eager") if hasattr(self.m, "set_attn_implementation") else None

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Bert()


# name -> (builder, {input name: (shape without batch, dtype)}, output names)
IMG = {"input": ((3, 224, 224), "float32")}
MODELS: dict[str, tuple] = {
    "candy": (_candy, IMG, ["output"]),
    "segformer": (_segformer, {"pixel_values": ((3, 512, 512), "float32")}, ["logits"]),
    "efficientvit": (lambda: _timm("efficientvit_b0"), IMG, ["logits"]),
    "yolo": (_yolo, {"images": ((3, 320, 320), "float32")}, ["p3", "p4", "p5"]),
    "bert2": (_bert2, {"input_ids": ((128,), "int64"), "attention_mask": ((128,), "int64")}, ["hidden"]),
    "vit_tiny": (lambda: _timm("vit_tiny_patch16_224"), IMG, ["logits"]),
}
# the suite: (model, batch)
SUITE = [
    ("vit_tiny", 1),
    ("efficientvit", 1),
    ("bert2", 1),
    ("yolo", 1),
    ("candy", 1),
    ("segformer", 1),
    ("segformer", 16),
    ("efficientvit", 16),
]


def file_stem(name: str, batch: int) -> str:
    return f"{name}_b{batch}"


def _like_trained(module, seed: int) -> None:
    """Give every parameter and buffer that its initialiser left constant (norm weights
    of ones, biases and running means of zeros, running variances of ones) random values
    near it, as training would. Left constant, every layer's LayerNorm weight is the same
    tensor, which korch's graph builder hash-conses into one constant shared by all
    layers (vit_tiny_b1: one broadcast of it read by every kernel), unlike any trained
    model."""
    import torch

    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point() or t.numel() < 2 or bool((t != t.flatten()[0]).any()):
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=t.dtype) * 0.1
            t.copy_((t + noise).abs() + 0.5 if name.endswith("running_var") else t + noise)


def build(name: str, batch: int = 1, seed: int = 0):
    """(eval-mode torch module, example inputs as a dict of tensors) for suite model ``name``."""
    import torch

    builder, inputs, _ = MODELS[name]
    _ensure_torchvision()  # timm and transformers import it (segformer alone failed without)
    torch.manual_seed(seed)
    module = builder().eval()
    _like_trained(module, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    feeds = {}
    for iname, (shape, dtype) in inputs.items():
        full = (batch, *shape)
        if iname == "input_ids":
            feeds[iname] = torch.randint(0, 30522, full, generator=gen)
        elif iname == "attention_mask":
            feeds[iname] = torch.ones(full, dtype=torch.int64)
        else:
            feeds[iname] = torch.randn(full, generator=gen, dtype=getattr(torch, dtype))
    return module, feeds


def export(name: str, batch: int, out_dir: Path, seed: int = 0) -> Path:
    import torch

    module, feeds = build(name, batch, seed)
    path = out_dir / f"{file_stem(name, batch)}.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            module,
            tuple(feeds.values()),
            str(path),
            input_names=list(feeds),
            output_names=MODELS[name][2],
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    sidecar = {
        "script": str(Path(__file__).resolve()),
        "builder": name,
        "batch": batch,
        "seed": seed,
        "inputs": {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in feeds.items()},
        "torch": torch.__version__,
    }
    path.with_suffix("").with_suffix(".torch.json").write_text(json.dumps(sidecar, indent=1))
    return path


def check(path: Path) -> dict:
    """Load through korch's frontend, fission, and count primitive classes and opaque ops."""
    import onnx

    from korch.fission import fission
    from korch.frontend import load_model
    from korch.ir import Op

    model = load_model(str(path))
    g = fission(model)
    opaque: dict[str, int] = {}
    for n in g.nodes:
        if n.op is Op.OPAQUE:
            proto = onnx.NodeProto.FromString(dict(n.attrs)["node"])
            key = proto.op_type
            opaque[key] = opaque.get(key, 0) + 1
    ops: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {"onnx_ops": ops, "primitives": len(g.compute_ids()), "classes": g.count(), "opaque": opaque}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"models (default: the whole suite); any of {', '.join(MODELS)}")
    p.add_argument("-o", "--out", default=str(DEFAULT_OUT))
    p.add_argument("--batch", type=int, help="only this batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="load and fission each exported model with korch")
    args = p.parse_args(argv)
    todo = [(n, b) for n, b in SUITE if (not args.names or n in args.names) and (not args.batch or b == args.batch)]
    for n in args.names:
        if n not in MODELS:
            p.error(f"unknown model {n!r}")
        if not any(t[0] == n for t in todo):
            todo.append((n, args.batch or 1))
    for name, batch in todo:
        t0 = time.perf_counter()
        path = export(name, batch, Path(args.out), args.seed)
        msg = f"{path.name}: {path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s"
        if args.check:
            info = check(path)
            msg += f"; {info['primitives']} primitives {dict(info['classes'])}; opaque: {info['opaque'] or 'none'}"
        print(msg, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
