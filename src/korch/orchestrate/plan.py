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


# Note [Fallback backends]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# Where the native backend takes a kernel, the libraries with pools of their own are
# not candidates (Note [One thread pool] in korch.pipeline), so a native build that
# fails (a compiler error, a shape the runtime refuses, a crash while measured) would
# leave that kernel nothing to run on, and a lone Conv's partition no plan at all. The
# backends taken away are kept as the candidate's ``fallback``: once every backend of
# a workload has a failed measurement, its fallback joins its backends, is measured
# like any other, and the report records the failure (stage "fallback"). A model
# therefore compiles whenever onnxruntime runs it, whatever korch's runtime refuses.
def fall_back(workloads, results: dict, fallback: dict[str, tuple[str, ...]]) -> list:
    """The workloads whose every backend failed and that have a fallback left, with it
    added to their backends (taken out of ``fallback``); Note [Fallback backends]."""
    from korch.diagnostics import record

    out = []
    for w in workloads:
        failed = [results.get((w.hash, b)) for b in w.backends]
        if w.hash not in fallback or not all(m is not None and not m.ok for m in failed):
            continue
        extra = fallback.pop(w.hash)
        why = "; ".join(f"{b}: {m.status} {(m.error or '').strip()[:120]}" for b, m in zip(w.backends, failed))
        record("fallback", f"{w.hash[:16]}/{'+'.join(extra)}", why, error="every backend failed")
        w.backends = tuple(w.backends) + extra
        out.append(w)
    return out


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
    fallback: tuple[str, ...] = ()  # measured only if every backend fails (Note [Fallback backends])


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
