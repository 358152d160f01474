"""The Python API: ``korch.optimize(path, **options)`` and ``korch.load(outdir)``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from korch.config import Settings


class CompiledModel:
    """An optimized model: call it with ``{input name: array}`` to get ``{output name: array}``."""

    def __init__(self, executable, report: dict[str, Any] | None = None, graph=None):
        self.executable = executable
        self.report = report or {}
        self.graph = graph

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.executable(feeds)

    @property
    def input_names(self) -> list[str]:
        return list(self.executable.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.executable.outputs)


def optimize(
    model: str | Path | Any,
    output_dir: str | Path | None = None,
    shapes=None,
    settings: Settings | None = None,
    measure: bool = True,
    **options,
) -> CompiledModel:
    """Optimize an ONNX model (path or ModelProto). ``options`` override ``Settings`` fields."""
    from korch.pipeline import run_pipeline, save_outputs

    settings = (settings or Settings()).replace(**options) if options else (settings or Settings())
    t0 = time.perf_counter()
    ctx = run_pipeline(str(model) if isinstance(model, Path) else model, settings, shapes, measure=measure)
    ctx.report["optimize_seconds"] = round(time.perf_counter() - t0, 2)
    if output_dir is not None:
        save_outputs(ctx, output_dir)
    return CompiledModel(ctx.executable, ctx.report, ctx.graph)


def load(output_dir: str | Path, num_threads: int | None = None) -> CompiledModel:
    import json

    from korch.executable import Executable

    exe = Executable.load(output_dir, num_threads)
    rp = Path(output_dir) / "report.json"
    report = json.loads(rp.read_text()) if rp.exists() else {}
    return CompiledModel(exe, report)
