"""Candidate kernels: the convex subgraphs of a partition that some generator can emit.

Note [Convex extensions]
~~~~~~~~~~~~~~~~~~~~~~~~
Korch's Theorem 1: the convex subsets of a partition are exactly the differences
S2 \\ S1 of execution states S1 ⊂ S2. Forming all pairs costs O(S^2) and finds each
subset many times, so instead, for each state S1, we grow the *extensions* D with
S1 ∪ D down-closed, up to ``max_kernel_size`` primitives, by a branching search that
either adds a ready primitive or excludes it from the rest of the branch (so each
extension of S1 is reached once).

Each convex C is reported from one state only, its canonical one: the strict
ancestors of C, anc(C) \\ C (down-closed because C is convex). S1 is canonical for D
exactly when every maximal element of S1 has a direct user in D: a path from a
maximal m of S1 to D runs, after m, through ancestors of D outside S1, which lie in
D because S1 ∪ D is down-closed. Branches where some maximal element can no longer
be covered (all its users excluded) are cut, and so are branches that break a
monotone rule of ``generatable`` (every superset breaks it too). Connectivity is not
monotone (a later primitive can join two parts), so the search carries the weakly
connected components of D and reports D only when there is one.

Note [Generatable kernels]
~~~~~~~~~~~~~~~~~~~~~~~~~~
``generatable`` says whether some backend could emit a kernel; the rules are what
our generators (tiled memory-bound loop nests; library linear kernels with a fused
epilogue; the fallback for opaque primitives) handle:
* weakly connected: a disconnected set is two kernels launched as one, never better
  than its parts and it only grows the BLP;
* an OPAQUE primitive only alone: the fallback runs one operator at a time;
* at most one LINEAR primitive. With one, L, it reads only external tensors (no
  prologue) and every other member is either an elementwise/broadcast epilogue
  reached from L (bias add, activation, residual) or a BROADCAST/RESHAPE "side
  operand" not connected to L's inputs, e.g. the bias reshaped and broadcast to the
  output shape. A depthwise CONV's epilogue may also pool: a REDUCE_SUM over its two
  spatial axes, and the DIV and RESHAPE after it (squeeze-and-excitation's global
  average pool, which the native runtime sums while the epilogue's rows are in
  cache: Note [Pooled taps] in korch_rt.cc), and its input may be a MUL by a
  broadcast operand (squeeze-and-excitation's scale, folded into the weights or the
  input: Note [Scaled inputs]). A 2-D CONV's input may be a PAD (reflect, edge or
  zeros: the conv's own padding, Note [Reflected padding]);
* memory-bound kernels (elementwise, reduce, broadcast, layout; layout-only too) hold
  at most ``MAX_REDUCTIONS`` reductions: LayerNorm has 2 (mean, variance), softmax
  2 (max, sum), so 4 covers a norm fused with a softmax-like neighbour; more
  reduction stages in one loop nest leave the tiler's one-pass/two-pass templates
  and only inflate the candidate count.
All rules but connectivity are monotone (a superset of a violating set violates),
which lets enumeration prune with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from korch.identify.states import LocalDag, bits, execution_states, local_dag
from korch.ir.graph import Graph
from korch.ir.ops import GroupOp, Op
from korch.ir.subgraph import Kernel, canonical_hash

MAX_REDUCTIONS = 4

_EPILOGUE = GroupOp.ELEMENTWISE | GroupOp.BROADCAST
_SIDE = frozenset({Op.BROADCAST, Op.RESHAPE})


class _Rules:
    """Bitmask form of the ``generatable`` rules over one LocalDag."""

    def __init__(self, graph: Graph, dag: LocalDag):
        ops = [graph.nodes[g].op for g in dag.nodes]
        mask = lambda group: sum(1 << i for i, op in enumerate(ops) if op in group)
        self.opaque = mask(GroupOp.OPAQUE)
        self.linear = mask(GroupOp.LINEAR)
        self.reduce = mask(GroupOp.REDUCE)
        self.adj = [p | s for p, s in zip(dag.preds, dag.succs)]
        epilogue, side = mask(_EPILOGUE), mask(_SIDE)
        nodes = [graph.nodes[g] for g in dag.nodes]
        pool = sum(
            1 << i
            for i, n in enumerate(nodes)
            if (n.op is Op.REDUCE_SUM and tuple(n.attr("axes") or ()) == (2, 3) and len(n.shape) == 4)
            or (n.op is Op.RESHAPE and len(n.shape) == 2 and graph.nodes[n.inputs[0]].shape[2:] == (1, 1))
        )
        self.allowed_with: dict[int, int] = {}  # linear bit -> members allowed beside it
        if self.linear:
            desc, anc = dag.descendants(), dag.ancestors()
            local = {g: i for i, g in enumerate(dag.nodes)}
            for i in bits(self.linear):
                conv = ops[i] is Op.CONV and len(nodes[i].shape) == 4
                depthwise = (
                    conv and nodes[i].attr("group") == graph.nodes[nodes[i].inputs[0]].shape[1] == nodes[i].shape[1]
                )
                beside = epilogue | (pool if depthwise else 0)
                self.allowed_with[1 << i] = (
                    (desc[i] & beside)
                    | (side & ~desc[i] & ~anc[i])
                    | (_prologue(graph, nodes[i], local) if conv else 0)
                )

    def monotone_ok(self, d: int) -> bool:
        if d & self.opaque and d & (d - 1):
            return False
        lin = d & self.linear
        if lin:
            if lin & (lin - 1):
                return False
            return (d ^ lin) & ~self.allowed_with[lin] == 0
        return (d & self.reduce).bit_count() <= MAX_REDUCTIONS

    def connected(self, d: int) -> bool:
        adj = self.adj
        comp = d & -d
        todo = comp
        while todo:
            low = todo & -todo
            todo ^= low
            new = adj[low.bit_length() - 1] & d & ~comp
            comp |= new
            todo |= new
        return comp == d

    def ok(self, d: int) -> bool:
        return self.monotone_ok(d) and self.connected(d)


def _prologue(graph: Graph, conv, local: dict[int, int]) -> int:
    """The conv's input as a PAD (the conv's padding: Note [Reflected padding] in
    korch_rt.cc), or as a MUL, the BROADCAST/RESHAPE nodes before its operands, and
    before those the elementwise steps of one input that make a smaller operand (the
    scale's sigmoid), as bits of the local DAG (0 if its input is neither in it)."""
    mul = conv.inputs[0]
    nodes = graph.nodes
    if mul in local and nodes[mul].op is Op.PAD:
        return 1 << local[mul]
    if mul not in local or nodes[mul].op is not Op.MUL:
        return 0
    bits_ = 1 << local[mul]
    for s in nodes[mul].inputs:
        while s in local and nodes[s].op in _SIDE:
            bits_ |= 1 << local[s]
            s = nodes[s].inputs[0]
        while s in local and nodes[s].op in GroupOp.ELEMENTWISE and nodes[s].shape != nodes[mul].shape:
            rest = [i for i in nodes[s].inputs if not nodes[i].is_scalar_const]
            if len(rest) != 1:
                break
            bits_ |= 1 << local[s]
            s = rest[0]
    return bits_


def generatable(graph: Graph, kernel_nodes: Sequence[int], max_kernel_size: int | None = None) -> bool:
    """Whether a backend could emit the kernel (Note [Generatable kernels]).

    Precondition: ``kernel_nodes`` is a non-empty convex set of compute primitives.
    """
    if not kernel_nodes or (max_kernel_size is not None and len(set(kernel_nodes)) > max_kernel_size):
        return False
    dag = local_dag(graph, kernel_nodes)
    return _Rules(graph, dag).ok(dag.full)


def convex_sets(
    dag: LocalDag,
    states: Sequence[int],
    max_size: int | None = None,
    prune: Callable[[int], bool] | None = None,
    connected: bool = False,
) -> list[int]:
    """Every non-empty convex set of ``dag`` with at most ``max_size`` members, once each.

    ``states`` must be all execution states of ``dag``. ``prune(d)`` returning False
    must mean every superset of ``d`` is unwanted too (Note [Convex extensions]).
    With ``connected`` only weakly connected sets are returned.
    """
    preds, succs = dag.preds, dag.succs
    adj = [p | s for p, s in zip(preds, succs)]
    kmax = dag.n if max_size is None else max_size
    out: list[int] = []

    def grow(s1: int, d: int, size: int, ready: int, dead: int, uncovered: list[int], comps: list[int]) -> None:
        cand = ready & ~dead
        while cand:
            low = cand & -cand
            cand ^= low
            i = low.bit_length() - 1
            nd = d | low
            if prune is None or prune(nd):
                unc = [need for need in uncovered if not need & low]
                ncomps = comps
                if connected:  # weakly connected components of nd: i joins those it touches
                    a, merged, ncomps = adj[i], low, []
                    for c in comps:
                        if c & a:
                            merged |= c
                        else:
                            ncomps.append(c)
                    ncomps.append(merged)
                if not unc and (len(ncomps) == 1 or not connected):
                    out.append(nd)
                if size + 1 < kmax:
                    base = s1 | nd
                    nready = ready ^ low
                    for u in bits(succs[i]):
                        if preds[u] & ~base == 0:
                            nready |= 1 << u
                    grow(s1, nd, size + 1, nready, dead, unc, ncomps)
            # Exclude this primitive (and so its descendants) from the remaining branches.
            dead |= low | desc[i]
            if any(need & ~dead == 0 for need in uncovered):
                return

    desc = dag.descendants()
    for s1 in states:
        needs = [succs[m] for m in bits(s1) if succs[m] & s1 == 0]
        if any(need == 0 for need in needs):
            continue  # a maximal element without users: no D covers it
        grow(s1, 0, 0, dag.initial_ready(s1), 0, needs, [])
    return out


def candidates(
    graph: Graph,
    nodes: Sequence[int],
    max_kernel_size: int | None = None,
    *,
    filter: bool = True,
    states: Sequence[int] | None = None,
    users: list[list[int]] | None = None,
) -> list[Kernel]:
    """Candidate kernels of the partition ``nodes``, sorted by their node tuples.

    Precondition: ``nodes`` is a convex set of compute primitives (a partition) small
    enough to enumerate. Each convex subset with at most ``max_kernel_size`` members
    appears once; with ``filter`` only those ``generatable`` accepts. ``states`` (from
    ``execution_states``) and ``users`` (``graph.users()``) may be passed to save work.
    """
    dag = local_dag(graph, nodes)
    if states is None:
        states = execution_states(graph, dag.nodes)
    if users is None:
        users = graph.users()
    if filter:
        rules = _Rules(graph, dag)
        masks = convex_sets(dag, states, max_kernel_size, rules.monotone_ok, connected=True)
    else:
        masks = convex_sets(dag, states, max_kernel_size)
    kernels = _KernelMaker(graph, dag, users).many(masks)
    kernels.sort(key=lambda k: k.nodes)
    return kernels


class _KernelMaker:
    """``make_kernel`` for many subsets of one partition, from bitsets (same result).

    Per-byte lookup tables over the local index (members, producers, external reads of
    each of the 256 subsets of 8 consecutive primitives) replace per-member loops.
    """

    def __init__(self, graph: Graph, dag: LocalDag, users: list[list[int]]):
        local = set(dag.nodes)
        out_ids = set(graph.outputs.values())
        self.full = dag.full
        self.chunks = range(0, dag.n, 8)
        # primitives written to memory whatever the subset: graph outputs, users elsewhere
        self.escapes = sum(
            1 << i for i, g in enumerate(dag.nodes) if g in out_ids or any(u not in local for u in users[g])
        )
        ext = [
            frozenset(s for s in graph.nodes[g].inputs if s not in local and not graph.nodes[s].is_scalar_const)
            for g in dag.nodes
        ]
        self.ids: list[list[tuple[int, ...]]] = []  # [chunk][byte] -> global ids
        self.preds: list[list[int]] = []  # [chunk][byte] -> OR of local producer masks
        self.ext: list[list[frozenset[int]]] = []  # [chunk][byte] -> external inputs read
        for base in self.chunks:
            width = min(8, dag.n - base)
            ids, preds, exts = [()], [0], [frozenset()]
            for byte in range(1, 1 << width):
                low = (byte & -byte).bit_length() - 1
                rest = byte & (byte - 1)
                ids.append((dag.nodes[base + low], *ids[rest]))
                preds.append(dag.preds[base + low] | preds[rest])
                exts.append(ext[base + low] | exts[rest])
            self.ids.append(ids)
            self.preds.append(preds)
            self.ext.append(exts)

    def many(self, masks: Sequence[int]) -> list[Kernel]:
        chunks = list(enumerate(self.chunks))
        ids_t, preds_t, ext_t, escapes, full = self.ids, self.preds, self.ext, self.escapes, self.full
        out = []
        for d in masks:
            members: list[int] = []
            outputs: list[int] = []
            inputs: set[int] = set()
            read = 0
            used_outside = 0  # members read by local primitives outside d
            rest = full & ~d
            for k, base in chunks:
                byte = (d >> base) & 255
                if byte:
                    members.extend(ids_t[k][byte])
                    read |= preds_t[k][byte]
                    inputs |= ext_t[k][byte]
                cbyte = (rest >> base) & 255
                if cbyte:
                    used_outside |= preds_t[k][cbyte]
            read &= ~d
            written = d & (escapes | used_outside)
            for k, base in chunks:
                byte = (read >> base) & 255
                if byte:
                    inputs.update(ids_t[k][byte])
                byte = (written >> base) & 255
                if byte:
                    outputs.extend(ids_t[k][byte])
            # chunks and table entries ascend, and so do local indices' global ids
            out.append(Kernel(tuple(members), tuple(sorted(inputs)), tuple(outputs)))
        return out


def group_by_hash(graph: Graph, kernels: Sequence[Kernel]) -> dict[str, list[Kernel]]:
    """Kernels grouped by canonical hash: structurally equal kernels share one measurement."""
    groups: dict[str, list[Kernel]] = {}
    for k in kernels:
        groups.setdefault(canonical_hash(graph, k), []).append(k)
    return groups
