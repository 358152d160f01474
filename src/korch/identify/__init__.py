"""Kernel identification: execution states and candidate kernels of a partition."""

from korch.identify.candidates import MAX_REDUCTIONS, candidates, convex_sets, generatable, group_by_hash
from korch.identify.states import (
    LocalDag,
    TooManyStates,
    bits,
    count_states,
    execution_states,
    local_dag,
)

__all__ = [
    "MAX_REDUCTIONS",
    "LocalDag",
    "TooManyStates",
    "bits",
    "candidates",
    "convex_sets",
    "count_states",
    "execution_states",
    "generatable",
    "group_by_hash",
    "local_dag",
]
