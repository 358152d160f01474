"""Orchestration: choose candidate kernels and their order by a binary linear program.

``solve`` is the entry point (Note [Strengthened BLP], Note [Lazy order cuts]);
``check`` validates its result independently.
"""

from korch.orchestrate.blp import Orchestration, build_model, lp_relaxation, lp_relaxation_gap, solve
from korch.orchestrate.check import check
from korch.orchestrate.problem import OrchestrationError, Problem, needed_sets, prepare, schedule
from korch.orchestrate.states import shortest_path

__all__ = [
    "Orchestration",
    "OrchestrationError",
    "Problem",
    "build_model",
    "check",
    "lp_relaxation",
    "lp_relaxation_gap",
    "needed_sets",
    "prepare",
    "schedule",
    "shortest_path",
    "solve",
]
