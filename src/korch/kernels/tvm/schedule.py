"""Apply a ``TileConfig`` to an unscheduled PrimFunc (see Note [Row tiling] in tvm_tiling).

The schedule, in order: inline the injective intermediates; fuse the anchor's leading
axes into one loop; ``compute_at`` every stored block the anchor needs under that loop
(reverse topological order, so each block's consumers are already there); vectorise
the innermost loop of every block under it (row reductions through ``rfactor`` into
``vector_width`` partial results, reductions with a long inner spatial loop by moving
the reduction loops outside it); mark the loop parallel. Blocks that are not under
the loop get their own parallel, vectorised nest. If any step of this fails, the
whole function is scheduled again by the simple rule (inline, then one nest per
block), and if that fails too it is left unscheduled: always valid, maybe slower.
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import s_tir, tirx

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp, Op
from korch.kernels.tvm.tiling import TileConfig, prefix_axes, rfactored


@dataclasses.dataclass
class ScheduleReport:
    mode: str  # "fused", "simple" or "none"
    errors: list[str] = dataclasses.field(default_factory=list)
    at_root: list[str] = dataclasses.field(default_factory=list)  # stored blocks not under the loop


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _lanes(extent: int | None, width: int) -> int:
    if extent is None:
        return 1
    while width > 1 and extent % width:
        width //= 2
    return width


class _Scheduler:
    def __init__(
        self, func: tirx.PrimFunc, g: Graph, cfg: TileConfig, block_of: dict[int, str], copies: dict[int, str]
    ):
        self.sch = s_tir.Schedule(tvm.IRModule({"main": func}))
        self.sch.work_on("main")
        self.g = g
        self.cfg = cfg
        self.block_of = block_of
        self.report = ScheduleReport("fused")
        self.rf: dict[int, object] = {}  # reduction node id -> its rfactor block
        out_nodes = list(g.outputs.values())
        self.copy_src = {name: out_nodes[j] for j, name in copies.items()}  # copy block -> node
        self.copy_of: dict[int, str] = {}
        for name, nid in self.copy_src.items():
            self.copy_of.setdefault(nid, name)

    def _parallel(self, loop) -> None:
        if self.cfg.parallel:
            self.sch.parallel(loop)

    def is_reduce(self, nid: int) -> bool:
        return self.g.nodes[nid].op in GroupOp.REDUCE

    def inline(self) -> set[int]:
        done = set()
        for nid in self.cfg.inline:
            try:
                self.sch.compute_inline(self.block_of[nid])
                done.add(nid)
            except s_tir.ScheduleError as e:
                self.report.errors.append(f"inline n{nid}: {type(e).__name__}")
        return done

    # -- innermost loops of one block ---------------------------------------------------
    def vectorize_injective(self, loops: list) -> None:
        sch = self.sch
        # a dynamic kernel's symbolic loops (Note [Dynamic kernels] in tvm_dynamic) stay
        # outside: the static ones after the last of them are vectorised
        while loops and any(_extent(sch, lp) is None for lp in loops):
            loops = loops[1:]
        if not loops:
            return
        loop = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        ext, width = _extent(sch, loop), self.cfg.vector_width
        lanes = _lanes(ext, width)
        if ext is not None and lanes < width < ext and self._vectorize_partitioned(loop, ext, width):
            return
        if lanes > 1:
            _, vi = sch.split(loop, [None, lanes])
            sch.vectorize(vi)

    # Note [Ragged rows]
    # ~~~~~~~~~~~~~~~~~~
    # A row whose length is not a multiple of the vector width (a 7x7 image: 49) had
    # its vectors halved until they divided it, down to none for an odd length; LLVM
    # then vectorised the loop *over rows* instead, with a gather and a scatter per
    # vector at the row stride: EfficientNet's SE scaling x * s, [1, 1152, 7, 7] by
    # [1, 1152, 1, 1], took 45 us on one Zen 4 core. Partitioned into the full vectors
    # and a scalar tail (48 + 1) it takes 5.6 us.
    def _vectorize_partitioned(self, loop, ext: int, width: int) -> bool:
        sch = self.sch
        main = ext - ext % width
        try:
            head, _tail = sch.loop_partition(loop, [main, None])
            _, vi = sch.split(head, [None, width])
            sch.vectorize(vi)
        except s_tir.ScheduleError as e:
            self.report.errors.append(f"partition: {type(e).__name__}")
            return False
        return True  # the tail (a loop from ``main``, which split does not take) stays scalar

    def rfactor_row(self, nid: int):
        """Split a reduction over the contiguous (last) input axis into ``vector_width``
        partial results (an ``_rf`` block) plus a short final reduction. Must run
        while the block still has its own loop nest. Returns the rf block or None."""
        sch, width, g = self.sch, self.cfg.vector_width, self.g
        if not rfactored(g, nid, self.cfg):  # the conditions root_nests predicts with
            return None
        node = g.nodes[nid]
        axes = node.attr("axes")
        loops = sch.get_loops(sch.get_sblock(self.block_of[nid]))
        red = loops[len(loops) - len(axes) :]
        r = sch.fuse(*red) if len(red) > 1 else red[0]
        _, ri = sch.split(r, [None, width])
        return sch.rfactor(ri, factor_axis=len(node.shape))

    def vectorize_rf(self, nid: int, rf, loops: list) -> None:
        """``loops``: the rf block's loops below its placement, one per block iter var."""
        sch = self.sch
        wb_red = {iv.var.name for iv in sch.get(sch.get_sblock(self.block_of[nid])).iter_vars if int(iv.iter_type) == 2}
        ivs = sch.get(rf).iter_vars
        red = [lp for lp, iv in zip(loops, ivs) if int(iv.iter_type) == 2]
        lane = [lp for lp, iv in zip(loops, ivs) if iv.var.name in wb_red]
        if not red or len(lane) != 1:
            return
        sch.reorder(*red, lane[0])
        sch.vectorize(lane[0])
        sch.decompose_reduction(rf, red[0])

    # Note [Window reductions stay scalar]
    # A pooling window's reduction (REDUCE_MAX/SUM over a WINDOW view) is left to LLVM:
    # split-and-vectorise along the output row, window loops outside, made YOLO's SPPF
    # max-pool kernels 4-10x slower than the plain nest (5x5 window, stride 1, the pad
    # inlined as a bounds test: 277-290 us vs 29-31 us for [1,16,32,32] on 2 cores,
    # with the pad stored, 53 vs 45 us), and the plain nest runs at the
    # tiling model's prediction (~30 us). Reductions over plain axes (a channel mean in
    # NCHW) keep the explicit vectorisation.
    def vectorize_reduce(self, nid: int, spatial: list, reduce: list) -> None:
        """Vectorise a reduction block with loops ``spatial + reduce`` along its last
        spatial loop (reduction loops moved outside it), e.g. a mean over channels."""
        sch, width = self.sch, self.cfg.vector_width
        if width <= 1 or not self.cfg.vectorize_reductions or not reduce:
            return
        if self.g.nodes[self.g.nodes[nid].inputs[0]].op == Op.WINDOW:
            return  # see Note [Window reductions stay scalar]
        sp = [s for s in spatial if _extent(sch, s) != 1]
        last = _extent(sch, sp[-1]) if sp else None
        if last is None or last < width or last % width:
            return
        block = sch.get_sblock(self.block_of[nid])
        _, vi = sch.split(sp[-1], [None, width])
        sch.reorder(*reduce, vi)
        sch.vectorize(vi)
        sch.decompose_reduction(block, reduce[0])

    def inner(self, nid: int, loops: list) -> None:
        """Schedule the loops of block ``nid`` below its placement (one per iter var)."""
        if self.is_reduce(nid):
            nred = len(self.g.nodes[nid].attr("axes"))
            if nid in self.rf:
                return  # the write-back of an rfactor: a short scalar loop
            self.vectorize_reduce(nid, loops[: len(loops) - nred], loops[len(loops) - nred :])
        else:
            self.vectorize_injective(loops)

    # -- a block with its own nest -------------------------------------------------------
    def standalone(self, nid: int) -> None:
        sch = self.sch
        block = sch.get_sblock(self.block_of[nid])
        if not self.is_reduce(nid):
            self.standalone_injective(self.block_of[nid])
            return
        nred = len(self.g.nodes[nid].attr("axes"))
        rf = self.rfactor_row(nid)
        if rf is not None:
            self.rf[nid] = rf
        loops = sch.get_loops(block)
        rank = len(self.g.nodes[nid].shape)
        spatial = loops[:rank]
        # parallel over all outputs but the ones vectorised side by side
        keep = 1 if rf is None and rank > 1 and (_extent(sch, spatial[-1]) or 0) >= self.cfg.vector_width else 0
        outer = spatial[: rank - keep]
        if outer:
            par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
            if (_extent(sch, par) or 2) > 1:
                self._parallel(par)
        if rf is not None:
            *_, ro, ri = sch.get_loops(rf)  # as rfactor_row split them
            sch.vectorize(ri)
            sch.decompose_reduction(rf, ro)
        else:
            self.vectorize_reduce(nid, spatial[rank - keep :], loops[rank : rank + nred])

    def standalone_injective(self, name: str) -> None:
        sch = self.sch
        spatial = sch.get_loops(sch.get_sblock(name))
        if not spatial:
            return
        symbolic = [i for i, lp in enumerate(spatial) if _extent(sch, lp) is None]
        if symbolic:  # a dynamic kernel's: parallel up to the last symbolic loop
            head, tail = spatial[: symbolic[-1] + 1], spatial[symbolic[-1] + 1 :]
            self._parallel(sch.fuse(*head) if len(head) > 1 else head[0])
            self.vectorize_injective(list(tail))
            return
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        ext = _extent(sch, fused) or 0
        lanes = _lanes(ext, self.cfg.vector_width)
        tile = lanes * max(1, min(64, ext // max(lanes, 1) // 64))
        while tile > lanes and ext % tile:
            tile -= lanes
        if ext > tile > 0 and ext % tile == 0:
            po, pi = sch.split(fused, [None, tile])
            self._parallel(po)
            if lanes > 1:
                _, vi = sch.split(pi, [None, lanes])
                sch.vectorize(vi)
        elif ext > 1:
            self._parallel(fused)

    # -- the fused schedule --------------------------------------------------------------
    def fused(self) -> None:
        cfg, sch, g = self.cfg, self.sch, self.g
        inlined = self.inline()
        anchor = cfg.anchor
        rank = len(g.nodes[anchor].shape)
        p = cfg.parallel_axes
        anchor_copy = self.copy_of.get(anchor)
        anchor_block = anchor_copy or self.block_of[anchor]
        remaining = [n for n in self.block_of if n not in inlined and (n != anchor or anchor_copy)]
        copies = [c for c in self.copy_src if c != anchor_copy]
        if p == 0:
            for n in remaining:
                self.standalone(n)
            for c in copies + ([anchor_copy] if anchor_copy else []):
                self.standalone_injective(c)
            if not anchor_copy:
                self.standalone(anchor)
            return
        targets = sorted((set(cfg.compute_at) | ({anchor} if anchor_copy else set())) & set(remaining), reverse=True)
        # a reduction as the anchor owns the loop: its rfactor block goes under it, and
        # its own loops below the row loop are a reduction's, not an injective block's
        anchor_reduce = not anchor_copy and self.is_reduce(anchor)
        for n in targets + ([anchor] if anchor_reduce else []):
            if self.is_reduce(n):
                rf = self.rfactor_row(n)
                if rf is not None:
                    self.rf[n] = rf
        loops = sch.get_loops(sch.get_sblock(anchor_block))
        outer = sch.fuse(*loops[:p]) if p > 1 else loops[0]
        rest = list(loops[p:])
        if p == rank and cfg.inner_tile and (_extent(sch, outer) or 0) > cfg.inner_tile:
            outer, tile_loop = sch.split(outer, [None, cfg.inner_tile])
            rest = [tile_loop] + rest
        # Output copies of stored nodes join the row loop first (loop merge), so that
        # every consumer of a stored node is under the loop when it is computed there.
        rows = _extent(sch, outer)
        copies_under = []
        # Not when a row reduction that is not itself copied is computed under the
        # loop: after such a merge TVM's compute_at put that reduction *after* its
        # consumer, over every row (the consumer read stale values; three Segformer
        # LayerNorm kernels, tests/kernels/test_tvm_backend.py). Those copies get their
        # own nest. A copied reduction (softmax's row sum as an output) needs the merge.
        copied = {self.copy_src[c] for c in copies}
        merge_ok = all(n in copied for n in targets if self.is_reduce(n))
        for c in copies:
            if self.copy_src[c] not in targets or rows is None or not merge_ok:
                continue
            k = prefix_axes(g.nodes[self.copy_src[c]].shape, rows)
            if not k:
                continue
            try:
                cl = sch.get_loops(sch.get_sblock(c))
                co = sch.fuse(*cl[:k]) if k > 1 else cl[0]
                outer = sch.merge(outer, co)
                copies_under.append(c)
            except s_tir.ScheduleError as e:
                self.report.errors.append(f"merge {c}: {type(e).__name__}")
        under: list[int] = []
        for n in targets:
            try:
                sch.compute_at(sch.get_sblock(self.block_of[n]), outer, preserve_unit_loops=True)
                if n in self.rf:
                    sch.compute_at(self.rf[n], outer, preserve_unit_loops=True)
                under.append(n)
            except s_tir.ScheduleError as e:
                self.report.errors.append(f"compute_at n{n}: {type(e).__name__}")
                self.report.at_root.append(f"n{n}")
                if n in self.rf or n == anchor:
                    raise  # a half-placed pair: start again with the simple schedule
        if anchor_reduce and anchor in self.rf:
            sch.compute_at(self.rf[anchor], outer, preserve_unit_loops=True)
        if (_extent(sch, outer) or 2) > 1:
            self._parallel(outer)
        if anchor_reduce:
            self.inner(anchor, rest)
            if anchor in self.rf:
                self.vectorize_rf(anchor, self.rf[anchor], list(sch.get_loops(self.rf[anchor]))[1:])
        else:
            self.vectorize_injective(rest)
        for n in under:
            self.inner(n, list(sch.get_loops(sch.get_sblock(self.block_of[n])))[1:])
            if n in self.rf:
                self.vectorize_rf(n, self.rf[n], list(sch.get_loops(self.rf[n]))[1:])
        for c in copies_under:
            self.vectorize_injective(list(sch.get_loops(sch.get_sblock(c)))[1:])
        for n in remaining:
            if n not in under:
                self.standalone(n)
        for c in copies:
            if c not in copies_under:
                self.standalone_injective(c)

    def simple(self) -> None:
        inlined = self.inline()
        for n in self.block_of:
            if n not in inlined:
                self.standalone(n)
        for c in self.copy_src:
            self.standalone_injective(c)


def schedule(
    func: tirx.PrimFunc, g: Graph, cfg: TileConfig, block_of: dict[int, str], copies: dict[int, str] | None = None
) -> tuple[tirx.PrimFunc, ScheduleReport]:
    """Schedule ``func`` (from ``tvm_lower.lower(g)``) by ``cfg``; never raises on a
    schedule error, falling back as Note at the top of this module says."""
    errors: list[str] = []
    for mode in ("fused", "simple"):
        s = _Scheduler(func, g, cfg, block_of, copies or {})
        try:
            getattr(s, mode)()
        except Exception as e:  # noqa: BLE001 - any failed step means: use the simpler schedule
            errors.append(f"{mode}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            continue
        s.report.mode = mode
        s.report.errors = errors + s.report.errors
        return s.sch.mod["main"], s.report
    return func, ScheduleReport("none", errors)
