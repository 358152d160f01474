"""Export the real-model zoo to ONNX: public model definitions nobody tuned korch for.

The suite (``export_suite.py``) is eight models korch was developed against; the zoo
is a broad set it never was: CNNs, vision transformers, hybrid mobile nets, detectors,
encoder and decoder language models, a U-Net, at batch 1 and a few at batch 8. (Not
``korch.models.zoo``, the built-in toy models of the tests.) As in the suite, nothing
is downloaded: ``timm`` models with ``pretrained=False``, ``transformers`` models from
a config object (``HF_HUB_OFFLINE=1``), weights from a fixed seed and norm statistics
randomised like trained ones (``export_suite._like_trained``), eval mode, the
TorchScript exporter (``dynamo=False``), opset 17, static shapes. Language models keep
their architecture's widths but only a few layers and an 8192-token vocabulary, so
that each optimizes in minutes; decoders run without a KV cache.

Each model is checked after export: onnxruntime runs it on the exporter's inputs and
its outputs are compared with torch's. ``models/zoo/manifest.json`` lists every model
(name, file, family, batch, input shapes, ONNX node count, whether onnxruntime ran
it and its error against torch); ``NAME.torch.json`` sidecars let ``korch bench``
rebuild the torch module for its PyTorch peers.

    .venv/bin/python benchmarks/export_zoo.py                 # all -> benchmarks/models/zoo/
    .venv/bin/python benchmarks/export_zoo.py --only bert_mini mobilenetv3_small
    .venv/bin/python benchmarks/zoo_bench.py                  # time them (zoo_bench.py)

Needs the optional extra ``korch[bench]`` (torch, timm, transformers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # also when korch bench imports this file by path
    sys.path.insert(0, str(HERE))
import export_suite as _suite  # noqa: E402 - after the path set-up above

DEFAULT_OUT = HERE / "models" / "zoo"
OPSET = _suite.OPSET
VOCAB = 8192  # language models: a small vocabulary, the embedding would dominate the file otherwise


# --- hand-written networks ------------------------------------------------------------------
def _unet():
    """U-Net (Ronneberger, Fischer and Brox, MICCAI 2015, arXiv:1505.04597): four 2x2
    max-pool downsamplings of double 3x3 conv + ReLU blocks, four 2x2 transposed-conv
    upsamplings concatenated with the skip connections, a 1x1 conv head. As in the
    widely used milesial/Pytorch-UNet, the convs are padded (no cropping) and
    batch-normalised; the width is halved (base 32, not 64)."""
    import torch
    from torch import nn

    def double_conv(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        )  # fmt: skip

    class UNet(nn.Module):
        def __init__(self, cin=3, n_classes=2, base=32):
            super().__init__()
            w = [base * 2**i for i in range(5)]
            self.inc = double_conv(cin, w[0])
            self.downs = nn.ModuleList(double_conv(w[i], w[i + 1]) for i in range(4))
            self.ups = nn.ModuleList(nn.ConvTranspose2d(w[i + 1], w[i], 2, stride=2) for i in reversed(range(4)))
            self.up_convs = nn.ModuleList(double_conv(2 * w[i], w[i]) for i in reversed(range(4)))
            self.pool = nn.MaxPool2d(2)
            self.head = nn.Conv2d(w[0], n_classes, 1)

        def forward(self, x):
            skips = [self.inc(x)]
            for d in self.downs:
                skips.append(d(self.pool(skips[-1])))
            y = skips.pop()
            for up, conv in zip(self.ups, self.up_convs):
                y = conv(torch.cat([skips.pop(), up(y)], 1))
            return self.head(y)

    return UNet()


# --- library networks -----------------------------------------------------------------------
def _timm(name: str, **kw):
    _suite._ensure_torchvision()
    import timm

    return timm.create_model(name, pretrained=False, **kw)


class _Out:
    """Wrap a transformers model so that forward takes tensors positionally and returns
    the named output field(s) as tensors (the exporter wants no ModelOutput dicts)."""

    @staticmethod
    def wrap(model, inputs: list[str], fields: list[str]):
        from torch import nn

        class Wrapped(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *args):
                out = self.m(**dict(zip(inputs, args)))
                got = tuple(getattr(out, f) for f in fields)
                return got[0] if len(got) == 1 else got

        return Wrapped()


def _hf(config_cls: str, model_cls: str, inputs: list[str], fields: list[str], **cfg):
    """A transformers model built from its config with random weights, eager attention."""
    import transformers

    config = getattr(transformers, config_cls)(**cfg)
    config._attn_implementation = "eager"  # the exporter traces eager attention most plainly
    if hasattr(config, "use_cache"):
        config.use_cache = False
    model = getattr(transformers, model_cls)(config)
    return _Out.wrap(model, inputs, fields)


def _detr():
    """DETR (Carion et al. 2020) with transformers' own ResNet-18 backbone (no timm), two
    encoder and two decoder layers, 100 queries, COCO's 91 classes."""
    from transformers import ResNetConfig

    backbone = ResNetConfig(
        depths=[2, 2, 2, 2], layer_type="basic", hidden_sizes=[64, 128, 256, 512], out_features=["stage4"]
    )
    return _hf(
        "DetrConfig",
        "DetrForObjectDetection",
        ["pixel_values"],
        ["logits", "pred_boxes"],
        backbone_config=backbone,
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        encoder_layers=2,
        decoder_layers=2,
        num_labels=91,
    )


def _yolos():
    """YOLOS-tiny (Fang et al. 2021): a DeiT-tiny ViT with 100 detection tokens, here at 320x320."""
    return _hf(
        "YolosConfig",
        "YolosForObjectDetection",
        ["pixel_values"],
        ["logits", "pred_boxes"],
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        image_size=[320, 320],
        num_detection_tokens=100,
        num_labels=91,
    )


ENC = ["input_ids", "attention_mask"]


def _bert_mini():  # google/bert_uncased_L-4_H-256_A-4
    return _hf("BertConfig", "BertModel", ENC, ["last_hidden_state"], vocab_size=VOCAB, hidden_size=256,
               num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)  # fmt: skip


def _distilbert():  # distilbert-base widths, 2 of 6 layers
    return _hf("DistilBertConfig", "DistilBertModel", ENC, ["last_hidden_state"], vocab_size=VOCAB, n_layers=2)


def _roberta():  # roberta-base widths, 2 of 12 layers
    return _hf("RobertaConfig", "RobertaModel", ENC, ["last_hidden_state"], vocab_size=VOCAB, num_hidden_layers=2,
               pad_token_id=1)  # fmt: skip


def _albert():  # albert-base-v2: one shared layer applied 4 times (12 in the original)
    return _hf("AlbertConfig", "AlbertModel", ENC, ["last_hidden_state"], vocab_size=VOCAB, hidden_size=768,
               num_attention_heads=12, intermediate_size=3072, num_hidden_layers=4)  # fmt: skip


def _deberta():  # deberta-v3-xsmall widths (disentangled relative attention), 2 of 12 layers
    return _hf("DebertaV2Config", "DebertaV2Model", ENC, ["last_hidden_state"], vocab_size=VOCAB, hidden_size=384,
               num_hidden_layers=2, num_attention_heads=6, intermediate_size=1536, relative_attention=True,
               position_buckets=256, pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
               position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True)  # fmt: skip


def _gpt2():  # gpt2 (124M) widths, 2 of 12 layers
    return _hf("GPT2Config", "GPT2LMHeadModel", ENC, ["logits"], vocab_size=VOCAB, n_layer=2,
               n_positions=1024)  # fmt: skip


def _llama():  # a Llama-architecture decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention (8 q / 2 kv heads)
    return _hf("LlamaConfig", "LlamaForCausalLM", ENC, ["logits"], vocab_size=VOCAB, hidden_size=512,
               intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
               max_position_embeddings=2048)  # fmt: skip


def _qwen2():  # Qwen2-0.5B widths (896, 14 q / 2 kv heads, q/k/v biases), 2 of 24 layers
    return _hf("Qwen2Config", "Qwen2ForCausalLM", ENC, ["logits"], vocab_size=VOCAB, hidden_size=896,
               intermediate_size=4864, num_hidden_layers=2, num_attention_heads=14, num_key_value_heads=2,
               max_position_embeddings=2048, tie_word_embeddings=True)  # fmt: skip


# name -> (family, builder, {input name: (shape without batch, dtype)}, output names, batch)
def _img(size: int = 224) -> dict:
    return {"input": ((3, size, size), "float32")}


TOK = {"input_ids": ((128,), "int64"), "attention_mask": ((128,), "int64")}
# decoders get an explicit all-ones mask, as generation passes one (without it transformers
# traces a packed-sequence check through aten::diff, which the exporter lacks)
DEC = {"input_ids": ((64,), "int64"), "attention_mask": ((64,), "int64")}
LOGITS = ["logits"]
MODELS: dict[str, tuple] = {
    # CNNs
    "resnet18": ("cnn", lambda: _timm("resnet18"), _img(), LOGITS, 1),
    "resnet50": ("cnn", lambda: _timm("resnet50"), _img(), LOGITS, 1),
    "mobilenetv3_small": ("cnn", lambda: _timm("mobilenetv3_small_100"), _img(), LOGITS, 1),
    "mobilenetv3_large": ("cnn", lambda: _timm("mobilenetv3_large_100"), _img(), LOGITS, 1),
    "efficientnet_b0": ("cnn", lambda: _timm("efficientnet_b0"), _img(), LOGITS, 1),
    "convnext_atto": ("cnn", lambda: _timm("convnext_atto"), _img(), LOGITS, 1),
    "regnety_002": ("cnn", lambda: _timm("regnety_002"), _img(), LOGITS, 1),
    "densenet121": ("cnn", lambda: _timm("densenet121"), _img(), LOGITS, 1),
    "ghostnet": ("cnn", lambda: _timm("ghostnet_100"), _img(), LOGITS, 1),
    "repvgg_a0": ("cnn", lambda: _timm("repvgg_a0"), _img(), LOGITS, 1),
    "mixnet_s": ("cnn", lambda: _timm("mixnet_s"), _img(), LOGITS, 1),
    "resnet18_b8": ("cnn", lambda: _timm("resnet18"), _img(), LOGITS, 8),
    # vision transformers
    "deit_tiny": ("vit", lambda: _timm("deit_tiny_patch16_224"), _img(), LOGITS, 1),
    "deit_tiny_b8": ("vit", lambda: _timm("deit_tiny_patch16_224"), _img(), LOGITS, 8),
    "swin_tiny": ("vit", lambda: _timm("swin_tiny_patch4_window7_224"), _img(), LOGITS, 1),
    "pit_ti": ("vit", lambda: _timm("pit_ti_224"), _img(), LOGITS, 1),
    "xcit_nano": ("vit", lambda: _timm("xcit_nano_12_p16_224"), _img(), LOGITS, 1),
    # hybrid mobile nets
    "mobilevit_xxs": ("hybrid", lambda: _timm("mobilevit_xxs"), _img(256), LOGITS, 1),
    "mobilevitv2_050": ("hybrid", lambda: _timm("mobilevitv2_050"), _img(256), LOGITS, 1),
    "levit_128s": ("hybrid", lambda: _timm("levit_128s"), _img(), LOGITS, 1),
    "efficientvit_m0": ("hybrid", lambda: _timm("efficientvit_m0"), _img(), LOGITS, 1),
    "fastvit_t8": ("hybrid", lambda: _timm("fastvit_t8"), _img(256), LOGITS, 1),
    "edgenext_xx_small": ("hybrid", lambda: _timm("edgenext_xx_small"), _img(256), LOGITS, 1),
    # detectors
    "detr_r18": ("detector", _detr, _img(320), ["logits", "pred_boxes"], 1),
    "yolos_tiny": ("detector", _yolos, _img(320), ["logits", "pred_boxes"], 1),
    # encoder language models
    "bert_mini": ("encoder-lm", _bert_mini, TOK, ["hidden"], 1),
    "bert_mini_b8": ("encoder-lm", _bert_mini, TOK, ["hidden"], 8),
    "distilbert": ("encoder-lm", _distilbert, TOK, ["hidden"], 1),
    "roberta": ("encoder-lm", _roberta, TOK, ["hidden"], 1),
    "albert": ("encoder-lm", _albert, TOK, ["hidden"], 1),
    "deberta_v3_xs": ("encoder-lm", _deberta, TOK, ["hidden"], 1),
    # decoder language models
    "gpt2": ("decoder-lm", _gpt2, DEC, LOGITS, 1),
    "llama": ("decoder-lm", _llama, DEC, LOGITS, 1),
    "qwen2": ("decoder-lm", _qwen2, DEC, LOGITS, 1),
    # segmentation
    "unet": ("segmentation", _unet, _img(256), ["mask"], 1),
}


def build(name: str, batch: int | None = None, seed: int = 0):
    """(eval-mode torch module, example inputs as a dict of tensors) for zoo model ``name``.
    The signature is the sidecar's contract with ``korch bench`` (``suite.torch_module``)."""
    import torch

    _, builder, inputs, _, default_batch = MODELS[name]
    batch = batch or default_batch
    _suite._ensure_torchvision()  # timm and transformers import it
    torch.manual_seed(seed)
    module = builder().eval()
    _suite._like_trained(module, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    feeds = {}
    for iname, (shape, dtype) in inputs.items():
        full = (batch, *shape)
        if iname == "input_ids":
            feeds[iname] = torch.randint(0, VOCAB, full, generator=gen)
        elif iname == "attention_mask":
            feeds[iname] = torch.ones(full, dtype=torch.int64)
        else:
            feeds[iname] = torch.randn(full, generator=gen, dtype=getattr(torch, dtype))
    return module, feeds


def export(name: str, out_dir: Path, seed: int = 0) -> dict:
    """Export zoo model ``name`` to ``out_dir/NAME.onnx`` with its sidecar and run it in
    onnxruntime; the manifest entry (raises if the export itself fails)."""
    import numpy as np
    import onnx
    import torch

    from korch.profile.e2e import max_rel_error, ort_session

    family, _, _, out_names, batch = MODELS[name]
    t0 = time.perf_counter()
    module, feeds = build(name, batch, seed)
    path = out_dir / f"{name}.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        ref = module(*feeds.values())
        torch.onnx.export(
            module,
            tuple(feeds.values()),
            str(path),
            input_names=list(feeds),
            output_names=out_names,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    inputs = {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in feeds.items()}
    sidecar = {"script": str(Path(__file__).resolve()), "builder": name, "batch": batch, "seed": seed,
               "inputs": inputs, "torch": torch.__version__}  # fmt: skip
    path.with_suffix(".torch.json").write_text(json.dumps(sidecar, indent=1))
    graph = onnx.load(str(path), load_external_data=False).graph
    entry = {"name": name, "file": path.name, "family": family, "batch": batch, "inputs": inputs,
             "outputs": out_names, "onnx_nodes": len(graph.node), "mb": round(path.stat().st_size / 1e6, 1),
             "export_seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    try:  # does onnxruntime run the file, and agree with torch?
        sess = ort_session(path.read_bytes(), 2)
        got = dict(zip(out_names, sess.run(None, {k: v.numpy() for k, v in feeds.items()})))
        refs = ref if isinstance(ref, (tuple, list)) else [ref]
        entry["ort_ok"] = True
        entry["ort_vs_torch"] = max_rel_error(got, {n: np.asarray(r.numpy()) for n, r in zip(out_names, refs)})
    except Exception as e:  # noqa: BLE001 - recorded in the manifest
        entry["ort_ok"] = False
        entry["ort_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return entry


def load_manifest(out_dir: Path) -> dict[str, dict]:
    p = Path(out_dir) / "manifest.json"
    return {e["name"]: e for e in json.loads(p.read_text())["models"]} if p.exists() else {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help=f"only these models; any of {', '.join(MODELS)}")
    p.add_argument("-o", "--out", default=str(DEFAULT_OUT))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="list the zoo's models and exit")
    args = p.parse_args(argv)
    if args.list:
        for n, (fam, _, inputs, _, b) in MODELS.items():
            print(f"{n:20s} {fam:13s} batch {b}  {inputs}")
        return 0
    names = args.only or list(MODELS)
    bad = [n for n in names if n not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # the manifest is written even when every export failed
    manifest = load_manifest(out)  # an --only run updates its entries and keeps the rest
    failed = []
    for name in names:
        try:
            entry = export(name, out, args.seed)
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the rest still export
            entry = {"name": name, "family": MODELS[name][0], "error": f"{type(e).__name__}: {str(e)[:300]}"}
            traceback.print_exc(limit=4)
        manifest[name] = entry
        ok = entry.get("ort_ok")
        failed += [] if ok else [name]
        if "error" in entry:
            print(f"{name}: export FAILED: {entry['error']}", flush=True)
        else:
            err = entry.get("ort_vs_torch")
            print(
                f"{name}: {entry['onnx_nodes']} nodes, {entry['mb']} MB in {entry['export_seconds']} s; onnxruntime "
                + (f"ok, rel err vs torch {err:.1e}" if ok else f"FAILED: {entry.get('ort_error')}"),
                flush=True,
            )
    order = {n: i for i, n in enumerate(MODELS)}
    rows = sorted(manifest.values(), key=lambda e: order.get(e["name"], len(order)))
    (out / "manifest.json").write_text(json.dumps({"opset": OPSET, "seed": args.seed, "models": rows}, indent=1))
    ran = sum(bool(e.get("ort_ok")) for e in rows)
    print(f"wrote {out / 'manifest.json'}: {ran} of {len(rows)} models run in onnxruntime")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
