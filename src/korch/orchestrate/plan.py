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

# the backends whose kernels join native segments (korch.executable.native)
SEGMENT_BACKENDS = frozenset({"tvm", "native"})

# Note [A step outside the segments]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# With native segments, a kernel of another library (an onnxruntime session) is a step
# of its own between two segments: a Python step, a session call, and a wake-up of that
# session's pool, which sleeps between calls (Note [No spinning thread pools]) while
# korch's pool had the cores. Measured alone, back to back, it pays none of that. In
# place (``korch explain``, segformer_block composed, two threads) its onnxruntime
# MatMuls and Convs took 46-89 us more than measured alone (median 67), korch's native
# kernels 0.9-1.1x their measured time. Linear kernels the native backend takes have
# no library candidate for that reason (Note [One thread pool] in korch.pipeline);
# what remains outside the segments (opaque operators, linear kernels the native
# backend cannot take, library regions) costs its measurement plus
# ``FOREIGN_STEP_US``, both when a candidate's backend is chosen and in the BLP, so the
# plan runs as few library steps as it can.
FOREIGN_STEP_US = 50.0


def native_segments(settings) -> bool:
    """Whether the executable runs native segments (Note [A step outside the segments])."""
    return bool(settings.native) and settings.target == "cpu"


def step_cost_us(backend: str, native: bool) -> float:
    """What a kernel of ``backend`` costs besides its measurement (Note [A step outside
    the segments]); ``native``: the executable runs native segments."""
    return FOREIGN_STEP_US if native and backend not in SEGMENT_BACKENDS else 0.0


def step_us(m, backend: str, native: bool) -> float:
    """Measurement ``m`` of ``backend`` as a step of the plan: its median plus
    ``step_cost_us``; inf when it failed."""
    return math.inf if not m.ok or m.median_us is None else m.median_us + step_cost_us(backend, native)


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
