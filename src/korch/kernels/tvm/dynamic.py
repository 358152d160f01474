"""Generated kernels compiled once with a dynamic dimension, tiled per call (GE's way).

Note [Dynamic kernels]
~~~~~~~~~~~~~~~~~~~~~~
GE compiles a dynamic-shape kernel once, with symbolic dimensions and several
*tiling keys* (branches of the kernel for the schedule choices that cannot be loop
bounds), and ships a host *tiling function* that, at launch, solves the tiling for
the concrete shape and hands the kernel its key and tiling data. Here:

* ``DynamicKernel(kgraph, axis)`` lowers the kernel graph with axis ``axis`` of its
  description (``korch.tiling.describe``) as the TVM symbol ``n``: every tensor dim
  that is that axis whole (``_dynamic_dims``: a batch, rows, a sequence) has extent n,
  bound from the arguments' shapes when the function is called, so loop bounds and
  tails are runtime values (the tiling data). A primitive whose index arithmetic would
  need n's value (a reshape that merges the axis, a pad, slice, concat, gather or
  window along it, a reduction over it) is refused at construction.
* The loop structure (which leading axes are fused into the row loop, what is
  computed at it, inlined, vectorised) is the ``TileConfig`` the tiling model gives at
  the build extent. The one choice that changes with n and cannot be a loop bound is
  whether the row loop runs on the thread pool: the model keeps small kernels on one
  core (a parallel launch pays a fork-join), large ones on all. So two tiling keys are
  compiled into one library, ``serial`` and ``parallel``.
* Each call binds n from the inputs, runs the tiling function
  (``korch.tiling.dynamic.TilingFunction``, memoised per extent) and launches the key
  its solution picks: cores > 1 (or a split reduction) -> parallel.

Not dynamic: the rest of the ``TileConfig`` (fixed at the build extent, as GE fixes a
kernel's template at compile time); hence a kernel compiled at one extent and run at
a very different one may lose to a static compile at that extent, which is what
``benchmarks/dynamic_tiling.py --kernels`` measures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import GroupOp, Op
from korch.kernels.base import ALIGN, aligned_copy
from korch.kernels.tvm.backend import buffer_address, carve_outputs, output_layout
from korch.kernels.tvm.tiling import TileConfig

KEYS = ("serial", "parallel")


def graph_at(g: Graph, dims: dict[int, tuple[int, ...]], n: int) -> Graph:
    """``g`` with the dims ``dims`` names (per node id) of extent ``n``: the kernel graph
    a static compile at that extent would get (for tests and the benchmark)."""
    b = GraphBuilder()
    new: dict[int, int] = {}
    names = {nid: name for name, nid in g.inputs.items()}

    def at(nid: int, shape) -> tuple[int, ...]:
        return tuple(n if j in dims.get(nid, ()) else d for j, d in enumerate(shape))

    for nid, node in enumerate(g.nodes):
        if node.op is Op.INPUT:
            new[nid] = b.input(names[nid], at(nid, node.shape), node.dtype)
            continue
        if node.op in GroupOp.SOURCE:
            attrs = dict(node.attrs)
            new[nid] = b.add(node.op, shape=at(nid, node.shape), dtype=node.dtype, **attrs)
            continue
        attrs = dict(node.attrs)
        if node.op in (Op.BROADCAST, Op.RESHAPE):
            attrs["shape"] = at(nid, attrs["shape"])
        elif node.op is Op.SLICE:
            attrs["lengths"] = at(nid, attrs["lengths"])
        new[nid] = b.add(node.op, [new[i] for i in node.inputs], **attrs)
    for name, nid in g.outputs.items():
        b.output(name, new[nid])
    return b.graph


def _row_loop_over_n(cfg: TileConfig, dims: dict[int, tuple[int, ...]]) -> TileConfig:
    """``cfg`` with a flat loop (every anchor axis fused, split by ``inner_tile``) made a
    row loop over the anchor's axes up to its last dynamic one: a static split of a
    symbolic loop leaves a bounds test in every lane and no vector loop, while the rows'
    static axes vectorise (gelu [n, 3072]: 3.4x the static kernel's time flat)."""
    anchor_dims = dims.get(cfg.anchor, ())
    if not anchor_dims or not cfg.inner_tile:
        return cfg
    return dataclasses.replace(cfg, parallel_axes=max(anchor_dims) + 1, inner_tile=0)


@dataclasses.dataclass(frozen=True)
class _Plan:
    key: str
    in_shapes: tuple[tuple[int, ...], ...]
    outs: tuple  # (shape, dtype, byte offset, bytes) per output
    out_bytes: int


@dataclasses.dataclass(frozen=True)
class _Arg:
    shape: tuple[int, ...]
    dyn: tuple[int, ...]  # the dims that are n
    dtype: np.dtype

    def at(self, n: int) -> tuple[int, ...]:
        return tuple(n if j in self.dyn else d for j, d in enumerate(self.shape))


class DynamicKernel:
    """Kernel ``kgraph`` compiled once with axis ``axis`` (of its description) dynamic;
    ``kernel(inputs)`` runs it at the inputs' extent (Note [Dynamic kernels])."""

    def __init__(
        self,
        kgraph: Graph,
        axis: int,
        num_threads: int,
        target: str = "cpu",
        solver: str = "axis-ge",
    ):
        from tvm import tirx

        from korch.kernels.tvm.backend import host_target, import_tvm, set_tvm_threads, vector_bytes
        from korch.kernels.tvm.lower import Dynamic, lower
        from korch.kernels.tvm.schedule import schedule
        from korch.kernels.tvm.tiling import tile_config_from_solution
        from korch.tiling.describe import describe
        from korch.tiling.dynamic import TilingFunction
        from korch.tiling.model import _dynamic_dims

        t0 = time.perf_counter()
        set_tvm_threads(num_threads)  # before TVM's pool starts (it reads TVM_NUM_THREADS once)
        desc = describe(kgraph)
        if not 0 <= axis < len(desc.axes):
            raise ValueError(f"axis {axis} out of range for a kernel with {len(desc.axes)} axes")
        if desc.axes[axis].reduce:
            raise ValueError(f"axis {axis} is reduced: a dynamic axis must be a parallel one")
        self.graph, self.axis, self.num_threads = kgraph, axis, num_threads
        self.dims = _dynamic_dims(desc, axis)  # raises for an axis that is not whole dims
        self.extent = desc.axes[axis].extent
        self.tiling = TilingFunction(desc, axis, target, solver)
        sol = self.tiling(self.extent)
        if sol is None:
            raise ValueError("the tiling model has no feasible tiling at the build extent")
        base = _row_loop_over_n(tile_config_from_solution(kgraph, sol, num_threads, vector_bytes(), desc), self.dims)
        self.config: TileConfig = dataclasses.replace(base, parallel=False)
        n = tirx.Var("n", "int32")
        lw = lower(kgraph, Dynamic(n, self.dims))
        keys = KEYS if num_threads > 1 else KEYS[:1]
        funcs, self.reports = {}, {}
        for key in keys:
            cfg = dataclasses.replace(base, parallel=key == "parallel")
            func, report = schedule(lw.func, kgraph, cfg, lw.block_of, lw.copies)
            funcs[f"korch_dyn_{key}"] = func.with_attr("global_symbol", f"korch_dyn_{key}")
            self.reports[key] = report
        tvm = import_tvm()
        self.lib = tvm.compile(tvm.IRModule(funcs), target=host_target(num_threads))
        self.funcs = {key: self.lib[f"korch_dyn_{key}"] for key in keys}
        self.inputs = [self._arg(kgraph.inputs[name]) for name in lw.input_names]
        self.outputs = [self._arg(kgraph.outputs[name]) for name in lw.output_names]
        self.hidden = [aligned_copy(h) for h in lw.hidden]
        self.build_seconds = time.perf_counter() - t0
        self.calls: dict[str, int] = dict.fromkeys(keys, 0)
        self._plans: dict[int, _Plan] = {}
        # where a call reads n: the first input with the dynamic dim
        self._n_from = next(((i, s.dyn[0]) for i, s in enumerate(self.inputs) if s.dyn), None)

    def _arg(self, nid: int) -> _Arg:
        node = self.graph.nodes[nid]
        return _Arg(node.shape, self.dims.get(nid, ()), np.dtype(node.dtype))

    def key(self, n: int) -> str:
        """The tiling key the tiling function's solution at extent ``n`` picks."""
        sol = self.tiling(n)
        wide = sol is not None and (sol.cores > 1 or sol.reduce_split > 1)
        return "parallel" if wide and "parallel" in self.funcs else "serial"

    def extent_of(self, inputs: Sequence[np.ndarray]) -> int:
        """n as the inputs give it; ValueError when they disagree or have the wrong shape."""
        n = None
        for i, (spec, x) in enumerate(zip(self.inputs, inputs)):
            shape = np.shape(x)
            if len(shape) != len(spec.shape):
                raise ValueError(f"input {i}: rank {len(shape)}, expected {len(spec.shape)}")
            for j, d in enumerate(shape):
                if j in spec.dyn:
                    if n is not None and d != n:
                        raise ValueError(f"input {i}: dim {j} is {d} where another input gives n = {n}")
                    n = d
                elif d != spec.shape[j]:
                    raise ValueError(f"input {i}: dim {j} is {d}, expected {spec.shape[j]}")
        if n is None:
            raise ValueError("no input has the dynamic dim: pass n")
        if n < 1:
            raise ValueError(f"dynamic extent {n} < 1")
        return n

    def __call__(self, inputs: Sequence[np.ndarray], n: int | None = None) -> list[np.ndarray]:
        if len(inputs) != len(self.inputs):
            raise ValueError(f"{len(inputs)} inputs, expected {len(self.inputs)}")
        if n is None:
            if self._n_from is None:
                raise ValueError("no input has the dynamic dim: pass n")
            i, j = self._n_from
            n = np.shape(inputs[i])[j]
        plan = self._plans.get(n) or self._plan(n)
        args = []
        for spec, shape, x in zip(self.inputs, plan.in_shapes, inputs):
            a = x if type(x) is np.ndarray else np.asarray(x)
            if a.shape != shape:
                self.extent_of(inputs)  # raises, saying which input and dim
                raise ValueError(f"input shapes {[np.shape(x) for x in inputs]} do not match n = {n}")
            if a.dtype != spec.dtype or not a.flags.c_contiguous or not a.flags.writeable or buffer_address(a) % ALIGN:
                a = aligned_copy(np.asarray(a, dtype=spec.dtype, order="C"))
            args.append(a)
        outs = carve_outputs(plan.outs, plan.out_bytes)
        self.calls[plan.key] += 1
        self.funcs[plan.key](*args, *outs, *self.hidden)
        return outs

    def _plan(self, n: int) -> _Plan:
        """What a call at extent ``n`` needs, memoised per extent: the tiling key (the
        tiling function's solution, a solve the first time), the input shapes, the
        outputs' layout in one allocation."""
        if n < 1:
            raise ValueError(f"dynamic extent {n} < 1")
        outs, total = output_layout([(spec.at(n), spec.dtype) for spec in self.outputs])
        plan = self._plans[n] = _Plan(self.key(n), tuple(spec.at(n) for spec in self.inputs), outs, total)
        return plan

    def static_config(self, n: int) -> TileConfig:
        """The config this kernel runs with at extent ``n`` (its loop structure, the
        key's parallel flag)."""
        return dataclasses.replace(self.config, parallel=self.key(n) == "parallel")


def dynamic_axes(kgraph: Graph) -> list[int]:
    """The axes of ``kgraph``'s description a ``DynamicKernel`` may take (parallel,
    whole tensor dims, extent > 1), without compiling: the ones ``_dynamic_dims``
    accepts. Lowering may still refuse one (Note [Dynamic kernels])."""
    from korch.tiling.describe import describe
    from korch.tiling.model import _dynamic_dims

    desc = describe(kgraph)
    out = []
    for i, a in enumerate(desc.axes):
        if a.reduce or a.fixed or a.extent < 2:
            continue
        try:
            _dynamic_dims(desc, i)
        except ValueError:
            continue
        out.append(i)
    return out


__all__ = ["KEYS", "DynamicKernel", "dynamic_axes", "graph_at"]
