"""Symbolic buffer-occupancy and pipe-time models of one kernel template on one target.

Note [Tiling model]
~~~~~~~~~~~~~~~~~~~
Variables: one tile size ``t_i`` per free axis (Note [Kernel description]) and the core
split: ``c``, the cores the parallel tile loop is shared across (each core runs
``ceil(N_par / c)`` of the ``N_par`` parallel tiles; the parent of every parallel
tile), and in the ``split-reduce`` template ``k``, the cores one row's reduce tiles are
shared across. Templates:

* ``elementwise``: no reduce axes; one pass;
* ``one-pass``: reduce axes resident (tile = extent): every input loaded once;
* ``multi-pass``: reduce axes tiled; pass p recomputes what it needs and reloads its
  inputs (softmax: 3 passes over x);
* ``split-reduce``: multi-pass with a row's reduce tiles also spread over ``k`` cores;
  every pass after the first is another launch (the partial results meet in GM).

Occupancy of each local level (GE): the largest set of tiles alive at once, each
rounded up to the level's alignment, times its buffer count (GM inputs and outputs go
through double-buffered queues, intermediates one buffer, RESHAPE a view), plus one
temporary per reduction; constraint: <= capacity - reserve.

Time (Note [Target cost formulas]): per pipe, per call cost x trip count summed over
the passes; a transfer's bytes round each contiguous run up to the GM alignment (a
strided tile moves whole lines/blocks), tile counts are ceilings (tails), small and
large transfers are piecewise. Kernel time = bottleneck pipe + heads + launch, in us.

The expressions are lambdified twice: with ``math`` for scalar probing (the fast
solvers) and with numpy for whole grids (the exhaustive solver).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import sympy as sp

from korch.tiling.describe import KernelDesc, TensorDesc
from korch.tiling.fastexpr import FastAlgebra, is_num
from korch.tiling.target import Target, TransferPipe

# sympy's own Max/Min/Piecewise/ceiling simplify on construction (comparisons, set
# solving) and take seconds on these expressions, which are only ever evaluated
# numerically. So the model uses opaque sympy functions, printed by lambdify as calls
# into the small tables below (one for scalar probing, one for numpy grids).
_VMAX, _VMIN, _VCEIL, _VGE, _VEQ = (sp.Function(n) for n in ("vmax", "vmin", "vceil", "vge", "veq"))

MATH_FUNCS = {
    "vmax": max,
    "vmin": min,
    "vceil": lambda x: math.ceil(x - 1e-9),
    "vge": lambda x, t, a, b: a if x >= t else b,
    "veq": lambda x, y, a, b: a if abs(x - y) < 1e-9 else b,
}
NUMPY_FUNCS = {
    "vmax": lambda *xs: functools.reduce(np.maximum, xs),
    "vmin": lambda *xs: functools.reduce(np.minimum, xs),
    "vceil": lambda x: np.ceil(np.asarray(x) - 1e-9),
    "vge": lambda x, t, a, b: np.where(np.asarray(x) >= t, a, b),
    "veq": lambda x, y, a, b: np.where(np.abs(np.asarray(x) - y) < 1e-9, a, b),
}


def _max(*args):
    return args[0] if len(args) == 1 else _VMAX(*args)


def _min(*args):
    return args[0] if len(args) == 1 else _VMIN(*args)


def _ceil(e):
    return e if isinstance(e, sp.Integer) else _VCEIL(e)


def _ge(x, threshold, then, other):
    """``then`` where x >= threshold, else ``other``."""
    return _VGE(x, threshold, then, other)


def _eq(x, y, then, other):
    return _VEQ(x, y, then, other)


def _sym(name: str) -> sp.Symbol:
    return sp.Symbol(name)


class SympyAlgebra:
    """The model's operations on sympy expressions: the symbolic form (Note [Fast model
    algebra] in fastexpr.py gives the same numbers without sympy)."""

    name = "sympy"
    sym = staticmethod(_sym)
    integer = staticmethod(sp.Integer)
    rational = staticmethod(sp.Rational)
    number = staticmethod(sp.nsimplify)
    max = staticmethod(_max)
    min = staticmethod(_min)
    ceil = staticmethod(_ceil)
    ge = staticmethod(_ge)
    eq = staticmethod(_eq)

    @staticmethod
    def mul(xs):
        return sp.Mul(*xs)

    @staticmethod
    def add(xs):
        return sp.Add(*xs)

    @staticmethod
    def compile(symbols, outputs, funcs):
        mod = "numpy" if funcs is NUMPY_FUNCS else "math"
        return sp.lambdify(list(symbols), list(outputs), [funcs, mod], cse=True)


@dataclasses.dataclass(frozen=True)
class Var:
    """A tiling variable and the flags the axis-ordering solver ranks it by."""

    name: str
    kind: str  # "tile" or "core"
    axis: int | None  # the axis a tile variable splits
    lo: int
    hi: int
    candidates: tuple[int, ...]  # the discrete values the solvers may take, ascending
    parent: bool = False
    reduce: bool = False
    broadcast: bool = False
    innermost: bool = False


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def tile_candidates(extent: int, align: int) -> tuple[int, ...]:
    """Powers of two, multiples of ``align`` when the axis is innermost, and the extent."""
    vals = set(_pow2_upto(extent)) | {extent}
    if align > 1 and extent > align:
        vals = {v for v in vals if v % align == 0 or v == extent}
    return tuple(sorted(vals))


def core_candidates(cores: int) -> tuple[int, ...]:
    return tuple(range(1, cores + 1))


def _term_extent(A, term, t: Mapping[int, sp.Expr], dim: int):
    ax, sc, off = term
    e = A.rational(sc.numerator, sc.denominator) * t[ax] + A.rational(off.numerator, off.denominator)
    if not (isinstance(sc, Fraction) and sc.denominator == 1 and off.denominator == 1):
        e = A.ceil(e)
    return A.min(e, dim)


def _dim_extent(A, entry, t, dim: int):
    if entry is None:
        return A.integer(dim)
    if entry == ():
        return A.integer(1)
    e = A.integer(1)
    for term in entry:
        e = e * _term_extent(A, term, t, dim)
    return A.min(e, dim) if len(entry) > 1 else e


# Note [Dynamic shapes]
# ~~~~~~~~~~~~~~~~~~~~~
# GE compiles a kernel with symbolic dimensions and a tiling function that solves for
# the concrete shape at launch. Here a TemplateModel built with ``dynamic=i`` has axis
# i's extent as one more symbol, n, ahead of the tile variables: built (and compiled)
# once; ``bind(n)`` gives the model at one shape (n bound, axis i's tile candidates
# and description at n) for the same solvers. ``korch.tiling.dynamic.TilingFunction``
# is the call-time side. The dynamic axis must be whole tensor dimensions (a batch or
# sequence axis): one a reshape splits or a window scales is refused.


def _dynamic_dims(desc: KernelDesc, axis: int) -> dict[int, tuple[int, ...]]:
    """Per tensor, the dims that are axis ``axis`` whole (Note [Dynamic shapes])."""
    if desc.fallback or desc.axes[axis].fixed:
        raise ValueError(f"axis {axis} of a {desc.kind} kernel cannot be dynamic (fallback or fixed axis)")
    whole = ((axis, Fraction(1), Fraction(0)),)
    out: dict[int, tuple[int, ...]] = {}
    for td in desc.tensors:
        dims = []
        for j, entry in enumerate(td.dims):
            if entry == whole:
                dims.append(j)
            elif entry and any(term[0] == axis for term in entry):
                raise ValueError(f"axis {axis} is not whole in dim {j} of {td.name}: it cannot be dynamic")
        out[td.node] = tuple(dims)
    return out


def with_extent(desc: KernelDesc, axis: int, n: int, dims: dict[int, tuple[int, ...]] | None = None) -> KernelDesc:
    """``desc`` with axis ``axis`` (and the tensor dims that are it, ``dims`` when
    known: ``_dynamic_dims``) of extent ``n``."""
    dims = _dynamic_dims(desc, axis) if dims is None else dims
    axes = tuple(dataclasses.replace(a, extent=n) if i == axis else a for i, a in enumerate(desc.axes))
    tensors = tuple(
        dataclasses.replace(td, shape=tuple(n if j in dims[td.node] else d for j, d in enumerate(td.shape)))
        for td in desc.tensors
    )
    return dataclasses.replace(desc, axes=axes, tensors=tensors)


class TemplateModel:
    """The symbolic model of ``desc`` under one template on ``target`` (Note [Tiling model])."""

    def __init__(
        self, desc: KernelDesc, target: Target, template: str, algebra: str = "sympy", dynamic: int | None = None
    ):
        if template not in desc.templates:
            raise ValueError(f"template {template!r} does not apply to a {desc.kind} kernel")
        A = SympyAlgebra() if algebra == "sympy" else FastAlgebra()
        self.algebra = A.name
        self.desc, self.target, self.template = desc, target, template
        axes = desc.axes
        # Note [Dynamic shapes]: axis ``dynamic``'s extent is the symbol n, bound per call
        self.dynamic = dynamic
        n_sym = A.sym("n") if dynamic is not None else None
        dyn_dims = _dynamic_dims(desc, dynamic) if dynamic is not None else {}
        self._dyn_dims = dyn_dims

        def extent(i: int):
            return n_sym if i == dynamic else A.integer(axes[i].extent)

        def dim_of(td: TensorDesc, j: int, d: int):
            return n_sym if j in dyn_dims.get(td.node, ()) else d

        itemsize = min((t.itemsize for t in desc.tensors), default=4)
        align_elems = max(1, target.vector_bytes // max(itemsize, 1))
        self._align_elems = align_elems  # an innermost axis's tile multiple (``bind`` too)
        vars_: list[Var] = []
        t: dict[int, sp.Expr] = {}
        for i, a in enumerate(axes):
            if a.fixed or (template == "one-pass" and a.reduce):
                t[i] = extent(i)
                continue
            name = f"t{i}"
            t[i] = A.sym(name)
            cands = tile_candidates(a.extent, align_elems if a.innermost else 1)
            vars_.append(
                Var(name, "tile", i, 1, a.extent, cands, reduce=a.reduce, broadcast=a.broadcast, innermost=a.innermost)
            )
        c = A.sym("c")
        vars_.append(Var("c", "core", None, 1, target.cores, core_candidates(target.cores), parent=True))
        k = A.integer(1)
        if template == "split-reduce":
            k = A.sym("k")
            kc = tuple(v for v in _pow2_upto(target.cores))
            vars_.append(Var("k", "core", None, 1, target.cores, kc, parent=True, reduce=True))
        self.vars = tuple(vars_)
        self.symbols = tuple(A.sym(v.name) for v in vars_)
        self.t = t
        self._bound: tuple = ()  # (n,) once a dynamic model is bound (``bind``)

        n_tiles = {i: A.ceil(extent(i) / t[i]) for i in range(len(axes))}
        n_par = A.mul([n_tiles[i] for i, a in enumerate(axes) if not a.reduce])
        n_red = A.mul([n_tiles[i] for i, a in enumerate(axes) if a.reduce])
        per_core_par = A.ceil(n_par / c)
        c_eff = A.ceil(n_par / per_core_par)  # balanced: no core left with a sliver
        per_core_red = A.ceil(n_red / k)
        cores = c_eff * k
        self.n_par, self.n_red, self.cores_used = n_par, n_red, cores

        # --- per-tensor tile sizes ---------------------------------------------------
        self.elems: dict[int, sp.Expr] = {}
        self.spans_reduce: dict[int, bool] = {}
        red = set(desc.reduce_axes)
        # a fallback description gives every tensor the anchor's axes (one entry per
        # axis, not per tensor dim): pair its entries with the axis extents
        axis_shape = tuple(a.extent for a in axes)

        def dim_shape(td: TensorDesc) -> tuple:
            return axis_shape if desc.fallback else td.shape

        for td in desc.tensors:
            e = A.integer(1)
            for j, (entry, dim) in enumerate(zip(td.dims, dim_shape(td))):
                e = e * _dim_extent(A, entry, t, dim_of(td, j, dim))
            if td.scale != 1.0:
                e = A.ceil(e * A.number(td.scale))
            self.elems[td.node] = e
            self.spans_reduce[td.node] = any(entry and any(term[0] in red for term in entry) for entry in td.dims)

        # --- buffer occupancy per local level -----------------------------------------
        self.buffers: list[tuple[str, sp.Expr, int]] = []
        for level in target.local_levels:

            def alloc(node: int, level=level) -> sp.Expr:
                td = desc.tensor(node)
                if td.alias:
                    return A.integer(0)
                nbytes = self.elems[node] * td.itemsize
                rounded = A.ceil(nbytes / level.alignment) * level.alignment
                count = 2 if td.level == "gm" or td.role == "output" else 1
                return rounded * count

            sets = [A.add([alloc(n) for n in live]) for live in desc.live_sets] or [A.integer(0)]
            temp = A.integer(0)
            for call in desc.calls:
                if call.api == "reduce":
                    out = self.elems[call.node] * call.itemsize
                    temp = temp + A.max(A.ceil(out / level.alignment) * level.alignment, target.vector_bytes)
            self.buffers.append((level.name, A.max(*sets) + temp, level.usable))

        # --- pipe times ------------------------------------------------------------------
        gm_align = target.levels[0].alignment if target.levels and target.levels[0].role == "gm" else 1

        def transfer_bytes(td: TensorDesc) -> sp.Expr:
            shape = [dim_of(td, j, d) for j, d in enumerate(dim_shape(td))]
            ext = [_dim_extent(A, e, t, d) for e, d in zip(td.dims, shape)]
            nz = [i for i, d in enumerate(shape) if not is_num(d) or d > 1]  # n: any size
            total = self.elems[td.node] * td.itemsize
            if not nz:
                return A.ceil(total / gm_align) * gm_align
            # a contiguous run grows past a dim only while the tile covers the dims
            # after it whole (two levels are enough for the kernels we see)
            run = cover = ext[nz[-1]]
            full = shape[nz[-1]]
            for j in list(reversed(nz[:-1]))[:2]:
                run = A.eq(cover, full, cover * ext[j], run)
                cover, full = cover * ext[j], full * shape[j]
            run_bytes = run * td.itemsize
            lines = A.ceil(run_bytes / gm_align) * gm_align
            return total / run_bytes * lines

        def transfer_cost(pipe: TransferPipe, nbytes: sp.Expr) -> sp.Expr:
            def one(bw) -> sp.Expr:
                return nbytes / (bw.a + bw.b / cores) + pipe.per_call

            if pipe.threshold <= 0 or pipe.large == pipe.small:
                return one(pipe.large)
            return A.ge(nbytes, pipe.threshold, one(pipe.large), one(pipe.small))

        def head(pipe: TransferPipe, nbytes: sp.Expr) -> sp.Expr:
            hl = pipe.head_large[0] * cores + pipe.head_large[1]
            hs = pipe.head_small[0] * cores + pipe.head_small[1]
            if pipe.threshold <= 0 or pipe.head_large == pipe.head_small:
                return hl
            return A.ge(nbytes, pipe.threshold, hl, hs)

        def trips(node: int) -> sp.Expr:
            return per_core_par * (per_core_red if self.spans_reduce[node] else 1)

        one_pass = template in ("elementwise", "one-pass")
        passes = [tuple(sorted({n for p in desc.pass_nodes for n in p}))] if one_pass else list(desc.pass_nodes)
        pass_of = dict(desc.pass_of)
        gm_inputs = {td.node: td for td in desc.tensors if td.level == "gm"}
        load = vec = store = A.integer(0)
        biggest_load = A.integer(0)
        for p, nodes in enumerate(passes):
            for n in nodes:
                if n in gm_inputs:
                    nb = transfer_bytes(gm_inputs[n])
                    load = load + trips(n) * transfer_cost(target.load, nb)
                    biggest_load = A.max(biggest_load, nb)
            for call in desc.calls:
                if call.node in nodes:
                    pe, pc = target.vec.coef(call.api, call.itemsize)
                    vec = vec + trips(call.tensor) * (pe * self.elems[call.tensor] + pc)
            for td in desc.tensors:
                if td.role == "output" and (one_pass or pass_of[td.node] == p):
                    store = store + trips(td.node) * transfer_cost(target.store, transfer_bytes(td))
        out_bytes = A.max(
            A.integer(0), *[self.elems[td.node] * td.itemsize for td in desc.tensors if td.role == "output"]
        )
        pipes = {
            "load": load + head(target.load, biggest_load) if gm_inputs else A.integer(0),
            "vec": vec + target.vec.head,
            "store": store + head(target.store, out_bytes),
        }
        bottleneck = A.max(*pipes.values())
        total = bottleneck
        if target.overlap < 1.0:
            total = total + (1.0 - target.overlap) * (A.add(pipes.values()) - bottleneck)
        launches = A.integer(1)
        if template == "split-reduce" and len(passes) > 1:
            launches = A.ge(k, 2, A.integer(len(passes)), A.integer(1))
            total = total + (launches - 1) * (target.vec.head + head(target.load, biggest_load))
        n_args = sum(1 for td in desc.tensors if td.level == "gm" or td.role == "output")
        total = total + launches * (target.launch + target.per_arg * n_args)
        if target.fork_join:
            total = total + launches * A.ge(cores, 2, A.number(target.fork_join), A.integer(0))
        self.pipes = {name: e * target.unit_us for name, e in pipes.items()}
        self.time = total * target.unit_us

        # --- constraints g(x) <= 0 --------------------------------------------------------
        cons = [expr - cap for _, expr, cap in self.buffers]
        cons.append(c - n_par)
        if template == "split-reduce":
            cons.append(k - n_red)
            cons.append(c * k - target.cores)
        self.constraints = cons
        # one function for everything a solver probes:
        # [time, cores, parallel tiles, reduce tiles, *buffers, *constraints]
        self._outputs = [self.time, cores, n_par, n_red, *[b for _, b, _ in self.buffers], *cons]
        self._alg = A
        if n_sym is not None:
            self.symbols = (n_sym, *self.symbols)
        self._f = A.compile(self.symbols, self._outputs, MATH_FUNCS)
        self._np = None
        self.evaluations = 0

    def bind(self, n: int) -> TemplateModel:
        """This dynamic model at extent ``n`` (Note [Dynamic shapes]): the compiled
        function is shared; variables, description and evaluation count are its own."""
        if self.dynamic is None:
            raise ValueError("bind() needs a model built with dynamic=axis")
        if n < 1:
            raise ValueError(f"extent {n} < 1")
        bound = copy.copy(self)
        bound._bound = (n,)
        bound.desc = with_extent(self.desc, self.dynamic, n, self._dyn_dims)
        align = self._align_elems
        bound.vars = tuple(
            dataclasses.replace(
                v, hi=n, candidates=tile_candidates(n, align if self.desc.axes[v.axis].innermost else 1)
            )
            if v.axis == self.dynamic
            else v
            for v in self.vars
        )
        bound.evaluations = 0
        return bound

    def one_core(self) -> TemplateModel:
        """This model on a target of one core: the same compiled function (the
        expressions see cores only through the core variables, and c = k = 1 meets the
        split-reduce core constraint of any target), the core variables held at 1; the
        same numbers as a model built for ``target.replace(cores=1)``, without a build."""
        one = copy.copy(self)
        one.target = self.target.replace(cores=1)
        one.vars = tuple(dataclasses.replace(v, hi=1, candidates=(1,)) if v.kind == "core" else v for v in self.vars)
        one.evaluations = 0
        return one

    # --- evaluation -----------------------------------------------------------------------
    def probe(self, x: Sequence[int]) -> tuple[float, bool]:
        """(predicted time in us, feasible) at one point."""
        self.evaluations += 1
        out = self._f(*self._bound, *x)
        nb = len(self.buffers)
        return float(out[0]), all(g <= 0 for g in out[4 + nb :])

    def time_us(self, x: Sequence[int]) -> float:
        return self.probe(x)[0]

    def feasible(self, x: Sequence[int]) -> bool:
        return self.probe(x)[1]

    def buffer_bytes(self, x: Sequence[int]) -> tuple[int, ...]:
        out = self._f(*self._bound, *x)
        return tuple(int(b) for b in out[4 : 4 + len(self.buffers)])

    def tile_counts(self, x: Sequence[int]) -> tuple[int, int]:
        """(parallel tiles, reduce tiles) at ``x``: what the core split shares out."""
        out = self._f(*self._bound, *x)
        return int(out[2]), int(out[3])

    def cores(self, x: Sequence[int]) -> int:
        return int(self._f(*self._bound, *x)[1])

    def tiles(self, x: Sequence[int]) -> tuple[int, ...]:
        """The tile size per axis (fixed axes at their extent)."""
        val = dict(zip((v.name for v in self.vars), x))
        fixed = lambda i: self.desc.axes[i].extent if i == self.dynamic else int(self.t[i])  # noqa: E731
        return tuple(int(val[f"t{i}"]) if f"t{i}" in val else fixed(i) for i in range(len(self.desc.axes)))

    def evaluate_grid(self, cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Time and feasibility at many points at once (columns of variable values)."""
        if self._np is None:
            exprs = [self.time, *self.constraints]
            self._np = self._alg.compile(self.symbols, exprs, NUMPY_FUNCS)
        cols = [np.asarray(c, dtype=np.float64) for c in cols]
        n = len(cols[0]) if cols else 1
        out = self._np(*self._bound, *cols)
        self.evaluations += n
        time = np.broadcast_to(np.asarray(out[0], dtype=np.float64), (n,))
        ok = np.ones(n, dtype=bool)
        for g in out[1:]:
            ok &= np.broadcast_to(np.asarray(g) <= 0, (n,))
        return time, ok


def build_models(desc: KernelDesc, target: Target) -> list[TemplateModel]:
    return [TemplateModel(desc, target, tpl) for tpl in desc.templates]


def clamp(v: int, var: Var) -> int:
    return max(var.lo, min(var.hi, v))
