"""A misbehaving backend for testing measurement isolation (test-only fault injection).

Loaded into spawned workers as a backend plugin: ``KORCH_BACKENDS=chaos_backend`` with
this folder on ``PYTHONPATH`` (``korch.kernels.registry``).

It runs kernels with the reference interpreter, except that a kernel containing NEG
segfaults, EXP hangs, LOG raises, SQRT returns wrong numbers, and RECIPROCAL
allocates memory without bound (64 MiB a step, touched so that it is resident).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

from korch.ir.graph import Graph
from korch.ir.interp import evaluate
from korch.ir.ops import Op
from korch.kernels.base import Backend, CompiledKernel, register


class _ChaosKernel(CompiledKernel):
    backend = "chaos"

    def __init__(self, kgraph: Graph):
        self.kgraph = kgraph
        self.ops = {n.op for n in kgraph.nodes}

    def __call__(self, inputs):
        if Op.NEG in self.ops:
            os.kill(os.getpid(), signal.SIGSEGV)
        if Op.EXP in self.ops:
            time.sleep(3600)
        if Op.LOG in self.ops:
            raise RuntimeError("chaos: log kernels raise")
        if Op.RECIPROCAL in self.ops:
            hog = []
            while True:  # runaway memory: only the parent's memory watch stops this
                hog.append(np.ones(64 * 2**20, dtype=np.uint8))
                time.sleep(0.01)
        out = list(evaluate(self.kgraph, dict(zip(self.kgraph.inputs, inputs))).values())
        if Op.SQRT in self.ops:
            out = [o + 1.0 for o in out]
        return out

    def save(self, directory: Path, stem: str) -> dict:
        raise NotImplementedError


class ChaosBackend(Backend):
    name = "chaos"
    kinds = frozenset({"memory"})

    def supports(self, kgraph: Graph) -> bool:
        return True

    def build(self, kgraph, consts, num_threads):
        if any(n.op is Op.FLOOR for n in kgraph.nodes):
            os.kill(os.getpid(), signal.SIGSEGV)  # crash while building
        return _ChaosKernel(kgraph)

    def load(self, meta, directory, num_threads):
        raise NotImplementedError


register(ChaosBackend())

__all__ = ["ChaosBackend"]
