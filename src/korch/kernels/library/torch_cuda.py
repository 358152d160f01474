"""The torch_cuda backend (``cuda`` target): MATMUL / CONV plus an elementwise epilogue
through torch on the device (cuBLAS / cuDNN).

Kernels are those ``match_linear`` accepts. A constant per-channel bias right after a
CONV (or a row bias after a 2-D MATMUL) goes into ``conv``/``addmm``, which fuse it;
the rest of the epilogue runs as in-place torch ops on the fresh result. Weights and
other constants are moved to the device once, at build. TF32 is switched off: the
target's contract is float32 results within 1e-4 of onnxruntime.

Device kernels (Note [Device kernels]): without a GPU they run on CPU torch tensors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels import device as D
from korch.kernels.base import Backend, CompiledKernel, register
from korch.kernels.epilogue import LinearPlan, load_consts, match_linear, save_consts
from korch.kernels.library.torch_cpu import bias_for

if importlib.util.find_spec("torch") is None:
    raise ImportError("torch is not installed")


def _binary(torch) -> dict:
    return {
        Op.ADD: torch.add,
        Op.SUB: torch.sub,
        Op.MUL: torch.mul,
        Op.DIV: torch.div,
        Op.MAX: torch.maximum,
        Op.MIN: torch.minimum,
    }


def _no_tf32(torch) -> None:
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


class TorchCudaKernel(CompiledKernel):
    backend = "torch_cuda"
    device_kernel = True

    def __init__(self, plan: LinearPlan, consts: dict[str, np.ndarray]):
        torch = D.torch()
        _no_tf32(torch)
        self.torch = torch
        self._binary = _binary(torch)
        self.plan = plan
        self.device = D.device_name()
        self.consts = {k: np.ascontiguousarray(v, dtype=plan.dtype) for k, v in consts.items() if k in plan.input_names}
        self.output_specs = [(tuple(plan.shape), plan.dtype)]
        dev = lambda a: D.to_device(a, self.device)  # noqa: E731
        bname = plan.input_names[plan.b]
        self._b = dev(self.consts[bname]) if bname in self.consts else None
        steps = list(plan.epilogue)
        self._bias = None
        if steps:
            bias = bias_for(plan, steps[0], self.consts)
            if bias is not None:
                self._bias = dev(bias)
                steps = steps[1:]
        self._steps = []
        for s in steps:
            value = None
            if s.operand is not None:
                if s.operand.scalar is not None:
                    # a device tensor made once: one made per call is a host-to-device
                    # copy, which a CUDA graph capture refuses (Note [CUDA graph choice])
                    value = torch.tensor(s.operand.scalar, dtype=D.torch_dtype(plan.dtype), device=self.device)
                elif s.operand.name in self.consts:
                    value = dev(np.ascontiguousarray(s.operand.view(self.consts[s.operand.name])))
            self._steps.append((s, value))
        self._mm = len(plan.a_shape) == 2 and len(plan.b_shape) == 2
        self._pre_pad = None
        if plan.op is Op.CONV:
            nsp = len(plan.shape) - 2
            pads = plan.attrs["pads"]
            if tuple(pads[:nsp]) != tuple(pads[nsp:]):
                self._pre_pad = [p for i in reversed(range(nsp)) for p in (pads[i], pads[nsp + i])]
                padding = [0] * nsp
            else:
                padding = list(pads[:nsp])
            F = torch.nn.functional
            fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
            strides, dil, group = list(plan.attrs["strides"]), list(plan.attrs["dilations"]), plan.attrs["group"]
            self._conv = lambda x, w, bias: fn(x, w, bias, strides, padding, dil, group)

    def _operand(self, s, value, xs):
        if value is not None:
            return value
        x = xs[s.operand.pos]
        for kind, shape in s.operand.steps:
            x = x.reshape(shape) if kind == "reshape" else x.expand(shape)
        return x

    def run_device(self, xs: Sequence[Any]) -> list[Any]:
        torch, plan = self.torch, self.plan
        _BINARY = self._binary
        a = xs[plan.a].reshape(plan.a_shape)
        b = self._b if self._b is not None else xs[plan.b].reshape(plan.b_shape)
        if plan.op is Op.CONV:
            if self._pre_pad is not None:
                a = torch.nn.functional.pad(a, self._pre_pad)
            y = self._conv(a, b, self._bias)
        elif self._bias is not None:
            y = torch.addmm(self._bias, a, b)
        elif self._mm:
            y = torch.mm(a, b)
        else:
            y = torch.matmul(a, b)
        for s, value in self._steps:
            if s.operand is None:
                {Op.NEG: y.neg_, Op.EXP: y.exp_, Op.TANH: y.tanh_, Op.SIGMOID: y.sigmoid_, Op.ABS: y.abs_}[s.op]()
                continue
            if s.op is Op.MAX and s.operand.scalar == 0.0:
                y.relu_()
                continue
            v = self._operand(s, value, xs)
            if not isinstance(v, torch.Tensor):
                v = torch.tensor(v, dtype=y.dtype, device=y.device)
            fn = _BINARY[s.op]
            y = fn(y, v, out=y) if s.value_left else fn(v, y, out=y)
        return [y.reshape(plan.shape)]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        xs = [D.to_device(x, self.device, self.plan.dtype) for x in inputs]
        return [D.to_host(o) for o in self.run_device(xs)]

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        return save_consts(self.backend, self.plan, self.consts, Path(directory), stem)


class TorchCudaBackend(Backend):
    name = "torch_cuda"
    kinds = frozenset({"linear"})
    targets = frozenset({"cuda"})

    def supports(self, kgraph: Graph) -> bool:
        plan = match_linear(kgraph)
        return plan is not None and plan.dtype in ("float32", "float16", "float64")

    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        plan = match_linear(kgraph)
        if plan is None:
            raise ValueError("torch_cuda backend: not a MATMUL/CONV with an elementwise epilogue")
        return TorchCudaKernel(plan, consts)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel:
        plan, consts = load_consts(meta, directory)
        return TorchCudaKernel(plan, consts)

    def version(self) -> str:
        torch = D.torch()
        return f"torch-{torch.__version__}-{D.device_name()}"


register(TorchCudaBackend())
