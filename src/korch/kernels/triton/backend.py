"""The Triton backend (``cuda`` target): memory-bound candidates -> one generated Triton kernel each.

``triton_tiling.choose_and_generate`` writes the kernel as Python source (Note [Triton
row tiles]); the source is written to a file (Triton's JIT reads its function's source
from disk), imported, and launched on the kernel's grid with the chosen warps and
stages. Kernels are device kernels (Note [Device kernels]): without a GPU they run
under Triton's interpreter when ``TRITON_INTERPRET=1``.

In an executable folder a kernel is ``<stem>.py`` (its source, loadable on its own)
plus metadata in plan.json and any gather table as ``<stem>.hidden<i>.npy``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp
from korch.kernels import device as D
from korch.kernels.base import Backend, CompiledKernel, register
from korch.kernels.triton.lower import TritonConfig, TritonSource, unsupported_reason
from korch.kernels.triton.tiling import choose_and_generate

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    raise ImportError("triton and torch are needed for the triton backend")


def _cache_dir() -> Path:
    base = Path(os.environ.get("KORCH_CACHE_DIR", str(Path.home() / ".cache" / "korch")))
    d = base / "triton"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _import(path: Path, name: str):
    """Import the generated module at ``path`` and return its kernel function."""
    mod_name = f"korch_triton_{abs(hash(str(path.resolve()))):x}"
    if mod_name in sys.modules:
        return getattr(sys.modules[mod_name], name)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


def _check_runnable() -> None:
    if not D.interpret() and not D.has_cuda():
        raise RuntimeError("the triton backend needs a CUDA GPU, or TRITON_INTERPRET=1 to run on the CPU")


class TritonKernel(CompiledKernel):
    backend = "triton"
    device_kernel = True

    def __init__(self, src: TritonSource, path: Path, build_s: float = 0.0):
        _check_runnable()
        self.src = src
        self.path = Path(path)
        self.fn = _import(self.path, src.name)
        self.device = D.device_name()
        self.input_specs = [(tuple(s), d) for s, d in src.inputs]
        self.output_specs = [(tuple(s), d) for s, d in src.outputs]
        self.hidden = [D.to_device(h, self.device) for h in src.hidden]
        self.grid = tuple(src.grid)
        self.build_s = build_s
        torch = D.torch()
        self._out_dtypes = [D.torch_dtype(d) for _, d in self.output_specs]
        self._empty = torch.empty

    def run_device(self, xs: Sequence[Any]) -> list[Any]:
        outs = [self._empty(s, dtype=dt, device=self.device) for (s, _), dt in zip(self.output_specs, self._out_dtypes)]
        cfg = self.src.config
        self.fn[self.grid](*xs, *outs, *self.hidden, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return outs

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return D.run_numpy(self, inputs)

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{stem}.py").write_text(self.src.text)
        hidden = []
        for i, h in enumerate(self.src.hidden):
            name = f"{stem}.hidden{i}.npy"
            np.save(directory / name, h)
            hidden.append(name)
        return {
            "backend": "triton",
            "source": f"{stem}.py",
            "name": self.src.name,
            "grid": list(self.grid),
            "inputs": [[list(s), d] for s, d in self.src.inputs],
            "outputs": [[list(s), d] for s, d in self.src.outputs],
            "hidden": hidden,
            "config": dataclasses.asdict(self.src.config),
            "triton_version": _triton_version(),
        }


def _triton_version() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source checkout of triton
        import triton

        return str(triton.__version__)


def write_source(src: TritonSource) -> Path:
    path = _cache_dir() / f"k_{src.digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src.text)
        os.replace(tmp, path)
    return path


class TritonBackend(Backend):
    name = "triton"
    kinds = frozenset({"memory"})
    targets = frozenset({"cuda"})

    def supports(self, kgraph: Graph) -> bool:
        if any(n.op not in GroupOp.MEMORY_BOUND and n.op not in GroupOp.SOURCE for n in kgraph.nodes):
            return False
        return unsupported_reason(kgraph) is None

    def generate(self, kgraph: Graph, config: TritonConfig | None = None) -> TritonSource:
        use_model = os.environ.get("KORCH_TRITON_TILING", "model") != "heuristic"
        return choose_and_generate(kgraph, interpret=D.interpret(), use_model=use_model, config=config)

    def build(
        self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int, config: TritonConfig | None = None
    ) -> TritonKernel:
        """Generate and load one kernel (constants are passed at call time like any input)."""
        t0 = time.perf_counter()
        src = self.generate(kgraph, config)
        return TritonKernel(src, write_source(src), time.perf_counter() - t0)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> TritonKernel:
        directory = Path(directory)
        path = directory / meta["source"]
        cfg = TritonConfig(**meta["config"])
        src = TritonSource(
            path.read_text(),
            meta["name"],
            tuple(meta["grid"]),  # type: ignore[arg-type]
            [(tuple(s), d) for s, d in meta["inputs"]],
            [(tuple(s), d) for s, d in meta["outputs"]],
            [np.load(directory / h) for h in meta["hidden"]],
            cfg,
        )
        return TritonKernel(src, path)

    def version(self) -> str:
        mode = "interpret" if D.interpret() else "cuda"
        return f"triton-{_triton_version()}-{mode}"


register(TritonBackend())


_PTR = {
    "float32": "*fp32",
    "float16": "*fp16",
    "float64": "*fp64",
    "int64": "*i64",
    "int32": "*i32",
    "int8": "*i8",
    "uint8": "*u8",
    "bool": "*i1",
}


def compile_offline(src: TritonSource, path: Path, arch: int = 90) -> dict[str, Any]:
    """Compile a generated kernel to a cubin for ``sm_{arch}`` without a GPU (ptxas ships
    with Triton) and return its resource use. Needs ``TRITON_INTERPRET`` unset: run it in
    a fresh process (``python -m korch.kernels.triton.backend FILE...``)."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = _import(Path(path), src.name)
    sig = {f"in{i}_ptr": _PTR[d] for i, (_, d) in enumerate(src.inputs)}
    sig.update({f"out{j}_ptr": _PTR[d] for j, (_, d) in enumerate(src.outputs)})
    sig.update({f"g{k}_ptr": "*i32" for k in range(len(src.hidden))})
    ast = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs={})
    ck = triton.compile(
        ast,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": src.config.num_warps, "num_stages": src.config.num_stages},
    )
    return {"shared": ck.metadata.shared, "cubin_bytes": len(ck.asm["cubin"])}


def _main(argv: Sequence[str]) -> int:
    """``python -m korch.kernels.triton.backend plan_dir_or_meta.json ...``: compile offline."""
    import json

    bad = 0
    for arg in argv:
        meta = json.loads(Path(arg).read_text())
        for m in meta if isinstance(meta, list) else [meta]:
            directory = Path(m["directory"])
            src = TritonSource(
                (directory / m["source"]).read_text(),
                m["name"],
                tuple(m["grid"]),  # type: ignore[arg-type]
                [(tuple(s), d) for s, d in m["inputs"]],
                [(tuple(s), d) for s, d in m["outputs"]],
                [np.load(directory / h) for h in m["hidden"]],
                TritonConfig(**m["config"]),
            )
            try:
                info = compile_offline(src, directory / m["source"])
                print(json.dumps({"source": m["source"], "ok": True, **info}))
            except Exception as e:  # noqa: BLE001 - reported per kernel
                bad += 1
                print(json.dumps({"source": m["source"], "ok": False, "error": str(e)[-2000:]}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
