"""Tiling functions for kernels with a dynamic dimension, GE's way (Note [Dynamic shapes]).

    tf = TilingFunction(describe(kgraph), axis=0, target="cpu")   # once, at compile time
    sol = tf(37)                                                  # per call: the shape's tiling

The template models are built and compiled once with the axis's extent as a symbol;
a call binds the concrete extent and runs the solver on the compiled models, so it
costs model evaluations, not a model build. ``tf(n)`` is the tiling ``solve`` gives
the kernel described at that shape (tests/tiling/test_dynamic.py checks it for every
memory-bound candidate of a small model); ``benchmarks/dynamic_tiling.py`` measures
the cost per call.
"""

from __future__ import annotations

import time

from korch.tiling.describe import KernelDesc
from korch.tiling.model import TemplateModel, _dynamic_dims
from korch.tiling.solvers import TilingSolution, best_over
from korch.tiling.target import Target, get_target


class TilingFunction:
    """The tiling of ``desc`` with axis ``axis`` of any extent, solved per call."""

    def __init__(self, desc: KernelDesc, axis: int, target: Target | str = "cpu", solver: str = "axis-ge"):
        if not 0 <= axis < len(desc.axes):
            raise ValueError(f"axis {axis} out of range for a kernel with {len(desc.axes)} axes")
        _dynamic_dims(desc, axis)  # refuses an axis that is not whole tensor dims
        self.desc, self.axis, self.solver = desc, axis, solver
        self.target = get_target(target) if isinstance(target, str) else target
        t0 = time.perf_counter()
        self.models = tuple(TemplateModel(desc, self.target, tpl, "fast", dynamic=axis) for tpl in desc.templates)
        self.build_seconds = time.perf_counter() - t0
        self._memo: dict[int, TilingSolution | None] = {}

    def solve(self, n: int) -> TilingSolution | None:
        """The best tiling over the templates at extent ``n`` (not memoised)."""
        return best_over([m.bind(n) for m in self.models], self.solver)

    def __call__(self, n: int) -> TilingSolution | None:
        """``solve(n)``, memoised per extent (a launch with a shape seen before is a lookup)."""
        if n not in self._memo:
            self._memo[n] = self.solve(n)
        return self._memo[n]


__all__ = ["TilingFunction"]
