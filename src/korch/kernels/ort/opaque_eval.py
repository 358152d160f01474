"""OPAQUE primitives evaluated by onnxruntime, for ``korch.ir.interp.evaluate(opaque=...)``:
what the measurement's output check compares onnxruntime-run opaque kernels against."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from korch.ir.graph import Node
from korch.ir.opaque import opaque_input_names, opaque_model_bytes


@functools.lru_cache(maxsize=256)
def _session(model_bytes: bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def run_opaque_ort(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    model = opaque_model_bytes(node, [x.shape for x in xs], [str(x.dtype) for x in xs])
    (out,) = _session(model).run(None, dict(zip(opaque_input_names(node), xs)))
    return out
