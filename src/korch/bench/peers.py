"""The peers korch is benchmarked against, built in the process that times them: PyTorch
(eager and torch.compile, rebuilt from a model's torch sidecar), OpenVINO at fp32 and
TVM's untuned build."""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from korch.errors import KorchError

log = logging.getLogger("korch")


def sidecar_path(model: Path) -> Path:
    return model.with_suffix("").with_suffix(".torch.json")


def torch_module(model: Path):
    """(module, ordered input names) rebuilt from the model's torch sidecar, or None."""
    sc = sidecar_path(model)
    if not sc.exists():
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        log.warning("torch is not installed: skipping the PyTorch peers")
        return None
    meta = json.loads(sc.read_text())
    script = Path(meta["script"])
    if not script.is_absolute():
        script = sc.parent / script
    spec = importlib.util.spec_from_file_location("_korch_suite_builders", script)
    if spec is None or spec.loader is None:
        raise KorchError(f"{sc}: cannot import builder script {script}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module, feeds = mod.build(meta["builder"], meta.get("batch", 1), meta.get("seed", 0))
    return module, list(feeds)


def torch_runner(module, input_names: list[str], feeds: dict[str, np.ndarray], out_names: list[str]):
    import torch

    tfeeds = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in input_names]

    def run():
        with torch.inference_mode():
            out = module(*tfeeds)
        outs = out if isinstance(out, (tuple, list)) else [out]
        return dict(zip(out_names, (o.numpy() for o in outs)))

    return run


def tvm_runner(model_path: Path, feeds: dict[str, np.ndarray], out_names: list[str], threads: int):
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from korch.frontend import load_model

    folded = load_model(str(model_path))
    mod = from_onnx(folded, keep_params_in_input=False)
    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm", "num-cores": threads}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    names = [i.name for i in folded.graph.input]
    args = [tvm.runtime.tensor(np.ascontiguousarray(feeds[n])) for n in names]

    def run():
        out = vm["main"](*args)
        outs = [out] if hasattr(out, "numpy") else list(out)
        return dict(zip(out_names, (o.numpy() for o in outs)))

    return run


# --- one model -------------------------------------------------------------------------------


OPENVINO_PRECISION = "f32"


def openvino_runner(model_path, feeds: Mapping[str, np.ndarray], out_names: list[str], num_threads: int):
    """(run, info): the ONNX file compiled by OpenVINO for its CPU plugin, always at fp32.

    On CPUs with AMX (or AVX-512 bf16) the CPU plugin otherwise infers in bf16, a
    different accuracy from every other engine here, so ``INFERENCE_PRECISION_HINT`` is
    set to f32 and read back from the compiled model; the latency hint and the thread
    count are those of the other peers (one stream, ``num_threads`` threads).
    ``run()`` returns the outputs by name. Raises ImportError without ``openvino``."""
    import openvino as ov

    core = ov.Core()
    config = {
        "INFERENCE_PRECISION_HINT": OPENVINO_PRECISION,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": int(num_threads),
    }
    compiled = core.compile_model(core.read_model(str(model_path)), "CPU", config)
    precision = compiled.get_property("INFERENCE_PRECISION_HINT")
    if precision != ov.Type.f32:
        raise RuntimeError(f"OpenVINO compiled at {precision}, not f32")
    request = compiled.create_infer_request()
    ports = {p.get_any_name(): p for p in compiled.outputs}
    order = [ports.get(n, compiled.outputs[i]) for i, n in enumerate(out_names)]
    data = {k: np.ascontiguousarray(v) for k, v in feeds.items()}

    def run():
        res = request.infer(data)
        return {n: res[p] for n, p in zip(out_names, order)}

    info = {
        "openvino": ov.__version__.split("-")[0],
        "precision": precision.get_type_name(),
        "threads": int(num_threads),
    }
    return run, info
