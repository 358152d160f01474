"""The values orchestration works on: candidate kernels with their costs, and plans.

A ``Candidate`` is a candidate kernel of one partition (``korch.ir.subgraph.Kernel``)
with what profiling learned of it: its best measured cost and the backend that ran it.
A ``Plan`` is a set of chosen candidates in execution order, of one of two families:
*composed* (the BLP's choice among korch's candidates, whatever the cost function it was
solved on) or *baseline* (one library session over the whole graph: the model as loaded,
or korch's graph exported back to ONNX). The final selection stage (``korch.select``)
races plans end to end and keeps one.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from korch.ir.subgraph import Kernel, KernelKind


@dataclasses.dataclass
class Candidate:
    partition: int  # -1: a kernel over the whole graph (a baseline plan's)
    kernel: Kernel
    kind: KernelKind
    hash: str
    backends: tuple[str, ...]
    cost_us: float = math.inf
    backend: str = ""
    tile_config: Any = None  # tvm: the TileConfig it was measured with (and is built with)


class PlanFamily(str, enum.Enum):
    COMPOSED = "composed"  # chosen by the BLP from korch's candidates
    BASELINE = "baseline"  # one library session over the whole graph

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class Plan:
    name: str  # "blp", "regions x0.7", "near ties", "in place 1", "the model", ...
    family: PlanFamily
    chosen: list[Candidate]
    executable: Any = None  # korch.executable.Executable, once built

    @property
    def kernels(self) -> tuple[tuple[int, ...], ...]:
        """What tells two plans apart: the primitives of each chosen kernel, in order."""
        return tuple(c.kernel.nodes for c in self.chosen)


__all__ = ["Candidate", "KernelKind", "Plan", "PlanFamily"]
