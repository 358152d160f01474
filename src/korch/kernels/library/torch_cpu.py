"""The torch backend (optional): MATMUL or CONV plus an elementwise epilogue via torch (oneDNN).

Registered only where torch is installed; torch itself is imported on first build or
load, never by ``import korch``. Kernels are those ``match_linear`` accepts. A constant
per-channel bias right after a CONV (or a row bias after a 2D MATMUL) is handed to
conv / addmm, which fuse it; relu (MAX with scalar 0) runs in place. Inputs and
outputs cross between numpy and torch without copies (``torch.from_numpy``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.base import Backend, CompiledKernel, register
from korch.kernels.epilogue import EpilogueStep, LinearPlan, load_consts, match_linear, save_consts

if importlib.util.find_spec("torch") is None:
    raise ImportError("torch is not installed")


def _torch():
    import warnings

    import torch

    # inputs may be read-only views; torch never writes to them here
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    return torch


def _set_threads(n: int) -> None:
    torch = _torch()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def bias_for(plan: LinearPlan, step: EpilogueStep, consts: dict[str, np.ndarray]) -> np.ndarray | None:
    """The 1-D bias vector if ``step`` adds a constant per output channel (CONV) or per column (2D MATMUL)."""
    opd = step.operand
    if step.op is not Op.ADD or opd is None or opd.scalar is not None or opd.name not in consts:
        return None
    val = opd.view(consts[opd.name])
    if val.ndim != len(plan.shape):
        return None
    axis = 1 if plan.op is Op.CONV else len(plan.shape) - 1
    if plan.op is Op.MATMUL and len(plan.shape) != 2:
        return None
    if any(d != 1 for i, d in enumerate(val.shape) if i != axis) or val.shape[axis] != plan.shape[axis]:
        return None
    return np.ascontiguousarray(val.reshape(-1))


class TorchKernel(CompiledKernel):
    backend = "torch"

    def __init__(self, plan: LinearPlan, consts: dict[str, np.ndarray], num_threads: int):
        torch = _torch()
        self.torch = torch
        self.plan = plan
        self.num_threads = num_threads
        self.consts = {k: np.ascontiguousarray(v, dtype=plan.dtype) for k, v in consts.items() if k in plan.input_names}
        _set_threads(num_threads)
        bname = plan.input_names[plan.b]
        self._b = torch.from_numpy(self.consts[bname]) if bname in self.consts else None
        steps = list(plan.epilogue)
        self._bias = None
        if steps:
            bias = bias_for(plan, steps[0], self.consts)
            if bias is not None:
                self._bias = torch.from_numpy(bias)
                steps = steps[1:]
        self._steps = []
        for s in steps:
            value = None
            if s.operand is not None:
                if s.operand.scalar is not None:
                    value = s.operand.scalar
                elif s.operand.name in self.consts:
                    value = torch.from_numpy(np.ascontiguousarray(s.operand.view(self.consts[s.operand.name])))
            self._steps.append((s, value))
        self._conv = None
        self._mm = len(plan.a_shape) == 2 and len(plan.b_shape) == 2
        if plan.op is Op.CONV:
            nsp = len(plan.shape) - 2
            pads = plan.attrs["pads"]
            self._pre_pad = None
            if tuple(pads[:nsp]) != tuple(pads[nsp:]):
                # F.pad takes (last_begin, last_end, ..., first_begin, first_end)
                self._pre_pad = [p for i in reversed(range(nsp)) for p in (pads[i], pads[nsp + i])]
                padding = [0] * nsp
            else:
                padding = list(pads[:nsp])
            fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[nsp]
            strides, dil, group = list(plan.attrs["strides"]), list(plan.attrs["dilations"]), plan.attrs["group"]
            self._conv = lambda x, w, bias: fn(x, w, bias, strides, padding, dil, group)

    def _linear(self, a, b):
        torch = self.torch
        plan = self.plan
        if plan.op is Op.CONV:
            if self._pre_pad is not None:
                a = torch.nn.functional.pad(a, self._pre_pad)
            return self._conv(a, b, self._bias)
        if self._bias is not None:
            return torch.addmm(self._bias, a, b)
        if self._mm:
            return torch.mm(a, b)
        return torch.matmul(a, b)

    def set_threads(self, num_threads: int) -> None:
        self.num_threads = max(1, int(num_threads))

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        plan = self.plan
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        # no inference_mode(): nothing requires grad, and entering it costs ~5 us a call
        a = torch.from_numpy(np.ascontiguousarray(inputs[plan.a]))
        b = self._b if self._b is not None else torch.from_numpy(np.ascontiguousarray(inputs[plan.b]))
        y = self._linear(a, b)
        for s, value in self._steps:
            if s.operand is None:
                if s.op is Op.NEG:
                    y.neg_()
                elif s.op is Op.EXP:
                    y.exp_()
                elif s.op is Op.TANH:
                    y.tanh_()
                elif s.op is Op.SIGMOID:
                    y.sigmoid_()
                else:
                    y.abs_()
                continue
            if value is None:
                value = torch.from_numpy(np.ascontiguousarray(s.operand.view(inputs[s.operand.pos])))
            if s.op is Op.MAX and s.operand.scalar == 0.0:
                y.relu_()
            elif s.value_left:
                if s.op is Op.ADD:
                    y.add_(value)
                elif s.op is Op.SUB:
                    y.sub_(value)
                elif s.op is Op.MUL:
                    y.mul_(value)
                elif s.op is Op.DIV:
                    y.div_(value)
                elif s.op is Op.MAX:
                    y = torch.maximum(y, torch.as_tensor(value, dtype=y.dtype), out=y)
                else:
                    y = torch.minimum(y, torch.as_tensor(value, dtype=y.dtype), out=y)
            else:
                v = torch.as_tensor(value, dtype=y.dtype)
                fn = {
                    Op.ADD: torch.add,
                    Op.SUB: torch.sub,
                    Op.MUL: torch.mul,
                    Op.DIV: torch.div,
                    Op.MAX: torch.maximum,
                    Op.MIN: torch.minimum,
                }[s.op]
                y = fn(v, y, out=y)
        return [y.numpy()]

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        return save_consts(self.backend, self.plan, self.consts, Path(directory), stem)


class TorchBackend(Backend):
    name = "torch"
    kinds = frozenset({"linear"})

    def supports(self, kgraph: Graph) -> bool:
        return match_linear(kgraph) is not None

    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        plan = match_linear(kgraph)
        if plan is None:
            raise ValueError("torch backend: not a MATMUL/CONV with an elementwise epilogue")
        return TorchKernel(plan, consts, num_threads)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel:
        plan, consts = load_consts(meta, directory)
        return TorchKernel(plan, consts, num_threads)

    def version(self) -> str:
        return f"torch-{_torch().__version__}"


register(TorchBackend())
