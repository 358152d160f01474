"""Test models: small ONNX blocks (``zoo``) and hand-built primitive graphs (``synthetic``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from korch.models.zoo import BUILDERS, EXTRA_BUILDERS

NAMES: list[str] = list(BUILDERS)
EXTRA_NAMES: list[str] = list(EXTRA_BUILDERS)  # encoder12 (scale), chain6 (process tests); build() takes them


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """The model ``name`` (one of ``NAMES`` or ``EXTRA_NAMES``) with weights drawn from ``seed``."""
    builder = BUILDERS.get(name) or EXTRA_BUILDERS.get(name)
    if builder is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(NAMES + EXTRA_NAMES)}")
    return builder(seed=seed)


def save(name: str, path: str | Path, seed: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(name, seed), str(path))
    return path


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float32 feeds for every (static-shaped) graph input."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


__all__ = ["EXTRA_NAMES", "NAMES", "build", "random_inputs", "save"]
