"""Fusing an executable's steps into native segments (Note [Native segment] in
``korch/kernels/native/segment.py``).

``fuse_native`` replaces every maximal run of consecutive steps that korch compiles
itself (TVM kernels built in this process, native linear kernels) with one step whose
kernel is a ``NativeSegment``. A run that fails to compile or link stays as it was,
recorded as skipped (Note [Skipped optimizations]): native code is an optimization.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import types
from collections.abc import Callable, Sequence

import numpy as np

from korch.diagnostics import guarded
from korch.executable import Step, plan_arena

_INTO = types.SimpleNamespace(run_into=True)  # plan_arena: a step writing given memory


def native_kind(step: Step) -> str | None:
    """ "tvm" or "linear" when the step can join a segment, else None."""
    from korch.kernels.native.rtkernel import RuntimeKernel
    from korch.kernels.tvm.backend import TvmKernel

    k = step.kernel
    if isinstance(k, TvmKernel) and k.prim_func is not None:
        return "tvm"
    if isinstance(k, RuntimeKernel):  # linear, TopK, pooling
        return "linear"  # a kernel of korch's runtime (korch_linear_create)
    return None


def _runs(steps: Sequence[Step]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, st in enumerate(steps):
        if native_kind(st) is not None:
            start = i if start is None else start
        elif start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(steps)))
    return runs


def fuse_native(
    steps: list[Step], keep: set[int], const_value: Callable[[int], np.ndarray | None], num_threads: int
) -> list[Step]:
    """``steps`` with each run of native-capable steps replaced by one segment step.
    ``keep``: nodes read after the last step (the model's outputs); ``const_value(node)``:
    a constant's value, or None for a tensor computed at run time."""
    out: list[Step] = []
    prev = 0
    for n, (a, b) in enumerate(_runs(steps)):
        out.extend(steps[prev:a])
        later = set(keep)
        for st in steps[b:]:
            later.update(st.inputs)
        seg = guarded(
            "native", f"segment {n} ({b - a} kernels)", build_segment, steps[a:b], later, const_value, num_threads, n
        )
        out.extend([seg] if seg is not None else steps[a:b])
        prev = b
    out.extend(steps[prev:])
    return out


def build_segment(
    members: Sequence[Step], later: set[int], const_value: Callable[[int], np.ndarray | None], num_threads: int, n: int
) -> Step:
    from korch.kernels.native.segment import NativeSegment, driver_source, new_build_dir, tvm_object
    from korch.kernels.native.toolchain import link_shared

    slots: list[tuple] = []  # (kind, index) | ("view", base slot, byte offset)
    slot_of: dict[int, int] = {}  # node -> slot
    consts: list[np.ndarray] = []
    in_nodes: list[int] = []
    in_specs: list[tuple[tuple[int, ...], str]] = []
    produced: dict[int, tuple[tuple[int, ...], str]] = {}  # node -> (shape, dtype) of its producer
    out_nodes: list[int] = []

    def const_slot(value: np.ndarray) -> int:
        consts.append(value)
        slots.append(("const", len(consts) - 1))
        return len(slots) - 1

    def read(node: int, spec: tuple[tuple[int, ...], str]) -> int:
        if node in slot_of:
            return slot_of[node]
        value = const_value(node)
        if value is not None:
            slot_of[node] = const_slot(np.ascontiguousarray(value, dtype=spec[1]).reshape(spec[0]))
        else:
            in_nodes.append(node)
            in_specs.append(spec)
            slots.append(("io-in", len(in_nodes) - 1))
            slot_of[node] = len(slots) - 1
        return slot_of[node]

    def write(node: int, spec: tuple[tuple[int, ...], str]) -> int:
        if node not in slot_of:
            produced[node] = spec
            slots.append(("node", node))
            slot_of[node] = len(slots) - 1
        return slot_of[node]

    # Note [Views in a segment]: node -> (the node whose slot holds it, byte offset)
    view, nops = _views(members, later)
    blocks: dict[int, tuple[tuple[int, ...], str]] = {}  # a concat's output: written through its views
    bases: dict[int, tuple[tuple[int, ...], str]] = {}  # a slice's or reshape's input
    for j in nops:
        st = members[j]
        if st.meta["view"][0] == "concat":
            blocks[st.outputs[0]] = _spec(st.kernel.outputs[0])
        else:
            bases[st.inputs[0]] = _spec(st.kernel.inputs[0])

    def root(node: int) -> tuple[int, int]:
        off = 0
        while node in view:
            node, o = view[node]
            off += o
        return node, off

    def slot(node: int, spec: tuple[tuple[int, ...], str], writes: bool) -> int:
        base, off = root(node)
        if base == node:
            return write(node, spec) if writes else read(node, spec)
        if node not in view_slot:
            # the block's slot: a concat's output is written (by its inputs' producers)
            b = write(base, blocks[base]) if base in blocks else read(base, bases[base])
            slots.append(("view", b, off))
            view_slot[node] = len(slots) - 1
        return view_slot[node]

    view_slot: dict[int, int] = {}  # a view node -> its slot
    drv_steps: list[tuple] = []
    funcs = {}
    tvm_reads: set[int] = set()  # nodes a TVM member reads: those must be ALIGN-byte aligned
    for j, st in enumerate(members):
        k = st.kernel
        if j in nops:
            drv_steps.append(("view",))
        elif native_kind(st) == "tvm":
            sym = f"korch_seg{n}_k{j}"
            funcs[sym] = k.prim_func
            tvm_reads.update(root(nd)[0] for nd in st.inputs)
            arg = [slot(node, _spec(sp), False) for node, sp in zip(st.inputs, k.inputs)]
            arg += [slot(node, _spec(sp), True) for node, sp in zip(st.outputs, k.outputs)]
            hid = [np.ascontiguousarray(h) for h in k._hidden_np]
            arg += [const_slot(h) for h in hid]
            # the DLTensors take the function's own shapes (Note [Coalesced axes])
            drv_steps.append(("tvm", sym, arg, k.call_specs() + [(h.shape, str(h.dtype)) for h in hid]))
        else:
            ins, outs = k.arg_specs()
            arg = [slot(node, sp, False) for node, sp in zip(st.inputs, ins)]
            arg += [slot(node, sp, True) for node, sp in zip(st.outputs, outs)]
            drv_steps.append(("linear", k.code.tolist(), arg))
    for node in produced:
        if node in later:
            out_nodes.append(node)
    # the intermediates: an arena, first fit over their lifetimes inside the segment
    inner = {nd: math.prod(sp[0]) * np.dtype(sp[1]).itemsize for nd, sp in produced.items() if nd not in later}
    # a view's reads and writes are its block's (Note [Views in a segment])
    fake = [
        types.SimpleNamespace(
            inputs=[root(nd)[0] for nd in st.inputs],
            outputs=[root(nd)[0] for nd in st.outputs] if j not in nops else [],
            kernel=_INTO,
        )
        for j, st in enumerate(members)
    ]
    offsets, arena_bytes = plan_arena(fake, inner, set())
    out_index = {nd: i for i, nd in enumerate(out_nodes)}
    final: list[tuple[str, int]] = []
    for kind, idx, *rest in slots:
        if kind == "io-in":
            final.append(("io", idx))
        elif kind == "node":
            final.append(("io", len(in_nodes) + out_index[idx]) if idx in out_index else ("arena", offsets[idx]))
        elif kind == "view":
            final.append(("view", idx, rest[0]))
        else:
            final.append((kind, idx))
    source = driver_source(drv_steps, final, arena_bytes)
    build = new_build_dir()
    objects = tvm_object(funcs, num_threads, build) if funcs else []
    lib = link_shared(source, objects, build / f"seg{n}.so")
    for obj in [*objects, build / "kernels.tar"]:
        obj.unlink(missing_ok=True)
    meta = {
        "inputs": [[list(s), d] for s, d in in_specs],
        "outputs": [[list(produced[nd][0]), produced[nd][1]] for nd in out_nodes],
        "members": [st.record() for st in members],
        "arena_bytes": int(arena_bytes),
        "views": [members[j].name for j in sorted(nops)],  # Note [Views in a segment]
        # Note [Unaligned segment inputs]: per input, whether a TVM member reads it
        "aligned_inputs": [nd in tvm_reads for nd in in_nodes],
    }
    kernel = NativeSegment(lib, meta, consts)
    kernel.set_threads(num_threads)
    costs = [st.cost_us for st in members]
    workload = hashlib.sha256("|".join(st.workload for st in members).encode()).hexdigest()[:16]
    return dataclasses.replace(
        members[0],
        name=f"seg{n}_{workload[:8]}",
        backend="native-segment",
        workload=workload,
        nodes=tuple(nd for st in members for nd in st.nodes),
        inputs=tuple(in_nodes),
        outputs=tuple(out_nodes),
        kernel=kernel,
        meta={},
        cost_us=sum(costs) if all(c is not None for c in costs) else None,  # type: ignore[misc]
    )


def _spec(s) -> tuple[tuple[int, ...], str]:
    return tuple(s.shape), str(s.dtype)


def _views(members: Sequence[Step], later: set[int]) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """The views of a segment (Note [Views in a segment]): node -> (node whose slot
    holds it, byte offset), and the members that run nothing. Concats first: a part
    that a slice or reshape makes is then written by that step's kernel into its block
    (a copy of the part, not of the whole concat)."""
    made: dict[int, int] = {}  # node -> the member writing it
    for j, st in enumerate(members):
        for nd in st.outputs:
            made.setdefault(nd, j)
    view: dict[int, tuple[int, int]] = {}
    nops: set[int] = set()
    copies: set[int] = set()  # slices and reshapes whose output is a concat's part
    kinds = [
        st.meta["view"][0] if "view" in st.meta and native_kind(st) == "tvm" and len(st.outputs) == 1 else None
        for st in members
    ]
    for j, st in enumerate(members):
        if kinds[j] != "concat":
            continue
        parts = st.meta["view"][1]
        if all(made.get(src, j) < j and src not in later and src not in view for src, _ in parts):
            view.update({src: (st.outputs[0], off) for src, off in parts})
            nops.add(j)
            copies.update(made[src] for src, _ in parts if kinds[made[src]] == "block")
    for j, st in enumerate(members):
        if kinds[j] == "block" and j not in copies and st.outputs[0] not in later and len(st.inputs) == 1:
            view[st.outputs[0]] = (st.inputs[0], st.meta["view"][1])
            nops.add(j)
    return view, nops
