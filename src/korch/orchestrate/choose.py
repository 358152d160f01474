"""The BLP of every partition on one cost function: the chosen candidates in execution
order (``solve_partitions``)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

from korch.ir.graph import Graph
from korch.orchestrate.blp import solve
from korch.orchestrate.plan import Candidate
from korch.orchestrate.problem import OrchestrationError

log = logging.getLogger("korch")


# Note [Unmeasurable partitions]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A partition may have no orchestration among its measured candidates: every candidate
# writing some output failed its measurement. segformer_b16's decoder did so at the
# old 4 GiB worker memory limit (each kernel writing its 1 GB concat was killed). A
# failure to *measure* is not a failure to run, and onnxruntime runs any primitive
# subgraph correctly, so the partition is solved again with its unmeasured candidates
# that onnxruntime can run (library regions, linear and opaque kernels) at a penalty
# cost, ``UNMEASURED_PENALTY_US`` each: the BLP takes as few of them as it can (one
# region over the unmeasurable part, usually). The report lists such partitions
# (``unmeasured_partitions``); the optimization completes, the end-to-end check still
# times the result. The guided profiling rounds solve such a partition the same way
# (``with_unmeasured_penalty``), so that the rest of it is measured: roberta's token-type
# Gather could not be measured, the rounds skipped its whole partition, and the
# LayerNorm after it, generated kernels only, had no cost when the final solve came.
UNMEASURED_PENALTY_US = 1e9


def with_unmeasured_penalty(cands: Sequence[Candidate], costs: Sequence[float]) -> list[float]:
    """``costs`` with every non-finite cost of a candidate onnxruntime can run at
    ``UNMEASURED_PENALTY_US`` (Note [Unmeasurable partitions])."""
    return [UNMEASURED_PENALTY_US if not math.isfinite(x) and "ort" in c.backends else x for c, x in zip(cands, costs)]


@dataclasses.dataclass
class Choice:
    chosen: list[Candidate]  # in execution order, partition by partition
    seconds: float  # the solves' time, summed
    max_seconds: float  # the longest solve
    unmeasured: list[int]  # partitions solved again at a penalty (Note [Unmeasurable partitions])


def solve_partitions(
    graph: Graph,
    partitions: Sequence[Sequence[int]],
    candidates: Sequence[Candidate],
    cost: Callable[[Candidate], float],
    time_limit_s: float,
) -> Choice:
    """The BLP of every partition on ``cost`` (a candidate's cost in microseconds).

    A partition with no orchestration among its finite costs is solved again with its
    unmeasured onnxruntime-runnable candidates at ``UNMEASURED_PENALTY_US``; those it
    then chooses get backend "ort" and that cost (Note [Unmeasurable partitions]).
    """
    out = Choice([], 0.0, 0.0, [])
    for pi, part in enumerate(partitions):
        cands = [c for c in candidates if c.partition == pi]
        costs = [cost(c) for c in cands]
        try:
            orch = solve(graph, part, [c.kernel for c in cands], costs, time_limit_s=time_limit_s)
        except OrchestrationError as e:
            penal = with_unmeasured_penalty(cands, costs)
            if penal == costs:
                raise
            log.warning(
                "partition %d: %s; onnxruntime runs its unmeasured part (Note [Unmeasurable partitions])", pi, e
            )
            orch = solve(graph, part, [c.kernel for c in cands], penal, time_limit_s=time_limit_s)
            for i in orch.chosen:
                if not math.isfinite(costs[i]):
                    cands[i].backend, cands[i].cost_us = "ort", UNMEASURED_PENALTY_US
            out.unmeasured.append(pi)
        out.seconds += orch.seconds
        out.max_seconds = max(out.max_seconds, orch.seconds)
        out.chosen.extend(cands[i] for i in orch.order)
    return out
