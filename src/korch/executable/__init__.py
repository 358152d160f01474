"""The executable: chosen kernels in order, buffers planned, saved to and loaded from a folder.

Layout of an output folder::

    plan.json      inputs, outputs, steps (backend, workload, node ids read/written), buffer plan
    consts.npz     named constants read by kernels (node id -> array)
    kernels/       one artefact per step (shared library, .onnx, .npy), written by its backend
    report.json    written by the pipeline
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.errors import InputError, KorchError
from korch.kernels.base import ALIGN, CompiledKernel, aligned_copy, aligned_empty, buffer_address

PLAN_VERSION = 1


@dataclasses.dataclass
class Step:
    name: str
    backend: str
    workload: str
    nodes: tuple[int, ...]  # primitives this kernel computes (for explain / redundancy)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    kernel: CompiledKernel | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the kernel's cost measured alone (the BLP's cost for it), us; None when unknown
    # (a baseline plan's single kernel): korch explain sets it beside the time in place
    cost_us: float | None = None

    def record(self) -> dict[str, Any]:
        """The step in plan.json (without its kernel's files or ``meta``)."""
        return {
            "name": self.name,
            "backend": self.backend,
            "workload": self.workload,
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "cost_us": self.cost_us,
        }

    @staticmethod
    def from_record(r: Mapping[str, Any], kernel: CompiledKernel | None = None, meta: dict | None = None) -> Step:
        return Step(
            r["name"],
            r["backend"],
            r["workload"],
            tuple(r["nodes"]),
            tuple(r["inputs"]),
            tuple(r["outputs"]),
            kernel,
            meta if meta is not None else {},
            r.get("cost_us"),
        )


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    node: int
    shape: tuple[int, ...]
    dtype: str


def plan_buffers(steps: Sequence[Step], keep: set[int], sizes: Mapping[int, int]) -> tuple[list[list[int]], dict]:
    """Liveness: after which step each intermediate is released, and a first-fit slot plan.

    Returns (free_after per step, stats) where stats gives the peak bytes with reuse
    and the total bytes without reuse.
    """
    last_use: dict[int, int] = {}
    produced: dict[int, int] = {}
    for i, st in enumerate(steps):
        for n in st.inputs:
            last_use[n] = i
        for n in st.outputs:
            produced.setdefault(n, i)
            last_use.setdefault(n, i)
    free_after: list[list[int]] = [[] for _ in steps]
    for n, i in last_use.items():
        if n in produced and n not in keep:
            free_after[i].append(n)
    # first-fit slot assignment over lifetimes [produced, last_use]
    slots: list[tuple[int, int]] = []  # (size, free_from_step)
    assign: dict[int, int] = {}
    for n, start in sorted(produced.items(), key=lambda kv: kv[1]):
        end = last_use[n] if n not in keep else len(steps)
        size = sizes.get(n, 0)
        for s, (ssize, free_from) in enumerate(slots):
            if free_from <= start and ssize >= size:
                slots[s] = (ssize, end + 1)
                assign[n] = s
                break
        else:
            slots.append((size, end + 1))
            assign[n] = len(slots) - 1
    stats = {
        "buffers": len(produced),
        "slots": len(slots),
        "bytes_with_reuse": int(sum(s for s, _ in slots)),
        "bytes_without_reuse": int(sum(sizes.get(n, 0) for n in produced)),
    }
    return free_after, stats


# Note [Static memory plan]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# A kernel that can write into given memory (``run_into``: the generated TVM kernels)
# gets its outputs from one arena allocated once per executable and thread, instead of
# fresh arrays on every call: no allocation, no page faults on first touch (a
# Segformer executable otherwise maps ~700 MB per call), no argument checks. Offsets
# come from a first-fit plan over tensor lifetimes [producing step, last reading step];
# a step whose backend may return views of its inputs (numpy reshapes) extends its
# inputs' lifetimes to its outputs' (reverse pass), so a view never outlives its slot.
# Model outputs are never planned (a later call would overwrite them); inputs of a
# planned step that come from an unplanned one are checked as before (``arg``).
ARENA_ALIGN = ALIGN


def _slot_bytes(nbytes: int) -> int:
    """A tensor's slot in the arena: its bytes (at least one) rounded up to ARENA_ALIGN."""
    return -(-max(1, nbytes) // ARENA_ALIGN) * ARENA_ALIGN


# Note [Unaligned segment inputs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Only generated (TVM) code assumes ALIGN-byte aligned buffers; korch's own kernels in a
# native segment (MatMul/Conv, pooling, TopK) load their inputs unaligned. A segment
# records which of its inputs a TVM member reads (meta "aligned_inputs"), and a graph
# input that no such kernel reads is passed as it is, not copied into the arena on every
# call: a CNN's image read only by its stem conv (600 KB) cost efficientnet_b0's calls
# about 100 us (Note [Input staging]). An executable saved before this records nothing
# and stages every input, as before.
#
# Note [Input staging]
# ~~~~~~~~~~~~~~~~~~~~
# A graph input that a generated kernel reads must be ALIGN-byte aligned, and numpy's
# arrays are 16-byte aligned, so check_inputs copies most inputs on every call. The copy
# goes into a slot of the thread's arena (after the planned tensors), not a fresh
# allocation: on the opaque example (a 32 KB input) the call took 17 us in check_inputs
# with aligned_copy, ~2 us with the copy into its slot. An output that is the input
# itself is a view of the arena and copied out like the arena's others.


def plan_arena(steps: Sequence[Step], planned: Mapping[int, int], keep: set[int]) -> tuple[dict[int, int], int]:
    """Byte offsets of the ``planned`` nodes (node -> bytes) in one arena, and its size."""
    produced: dict[int, int] = {}
    end: dict[int, int] = {}
    for i, st in enumerate(steps):
        for n in st.outputs:
            produced.setdefault(n, i)
            end.setdefault(n, i)
        for n in st.inputs:
            end[n] = i
    for n in keep:
        end[n] = len(steps)
    for st in reversed(steps):
        if getattr(st.kernel, "run_into", None) is None:  # may return views of its inputs
            last = max((end.get(o, 0) for o in st.outputs), default=0)
            for n in st.inputs:
                end[n] = max(end.get(n, 0), last)
    live: list[tuple[int, int, int]] = []  # (offset, size, end step)
    offsets: dict[int, int] = {}
    total = 0
    for n in sorted(planned, key=lambda n: (produced[n], n)):
        start, size = produced[n], _slot_bytes(planned[n])
        live = [blk for blk in live if blk[2] >= start]
        off = 0
        for o, sz, _ in sorted(live):
            if off + size <= o:
                break
            off = max(off, o + sz)
        offsets[n] = off
        live.append((off, size, end[n]))
        total = max(total, off + size)
    return offsets, total


# Note [Holding the pool through a call]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A native segment holds korch's pool for its own run (Note [One pool, awake for a
# segment] in korch_rt.cc). The executable holds it a little longer: from before its
# input checks when the first step is a segment (the workers' wake-up, ~80 us on the
# VM, overlaps them), and through a step of another library between two segments when
# that step is short (measured cost under HOLD_THROUGH_US), so the next segment finds
# its workers awake. Around a longer step from another library the pool is let go:
# that step's own pool needs both cores, and a spinning worker took one of them
# (yolo_block, onnxruntime convolutions of 80-140 us between segments: 0.82 -> 0.88 ms
# held through). Measured, korch alone, three processes each: opaque (a 44 us TopK
# between two segments) 0.166-0.197 -> 0.121-0.141 ms; the others within the spread.
# KORCH_HOLD_CALL=0 turns it off.
HOLD_THROUGH_US = 60.0


def held_steps(steps: Sequence[Step]) -> list[bool]:
    """Per step, whether the call holds korch's pool during it (Note [Holding the pool
    through a call]); all False without native segments or with KORCH_HOLD_CALL=0."""
    import os

    seg = [s.backend == "native-segment" for s in steps]
    if os.environ.get("KORCH_HOLD_CALL", "1") != "1" or not any(seg):
        return [False] * len(steps)
    return [
        seg[i] or (s.cost_us is not None and s.cost_us < HOLD_THROUGH_US and any(seg[:i]) and any(seg[i + 1 :]))
        for i, s in enumerate(steps)
    ]


class Executable:
    """Runs the orchestrated kernels. Call with ``{input name: array}``; returns outputs by name."""

    def __init__(
        self,
        inputs: dict[str, TensorSpec],
        outputs: dict[str, TensorSpec],
        consts: dict[int, np.ndarray],
        steps: list[Step],
        free_after: list[list[int]] | None = None,
        buffer_stats: dict | None = None,
    ):
        self.inputs = inputs
        self.outputs = outputs
        # Constants live in writable, 64-byte-aligned memory so every backend takes them
        # without a per-call copy (DLPack refuses read-only arrays, TVM wants alignment).
        self.consts = {k: aligned_copy(v) for k, v in consts.items()}
        self.steps = steps
        keep = {s.node for s in outputs.values()}
        sizes = {}
        if free_after is None:
            free_after, buffer_stats = plan_buffers(steps, keep, sizes)
        self.free_after = free_after
        self.buffer_stats = buffer_stats or {}
        self._plan_memory(keep)
        self.cuda_graph = False  # Settings.cuda_graph; used by the device runner
        self._device_runner = None
        from korch.executable.device import is_device_kernel

        self._on_device = any(is_device_kernel(s.kernel) for s in steps)  # Note [Call overhead]
        self.threads: int | None = None  # chosen at build time (Note [Runtime threads])
        self._hold, self._held_first, self._hold_steps = None, False, [0] * len(steps)
        held = held_steps(steps)
        if any(held):
            from korch.kernels.native.toolchain import load_runtime

            self._hold, self._held_first = load_runtime().korch_pool_hold, held[0]
            # per step: 1 take the hold before it, -1 drop it before it, 0 nothing
            self._hold_steps = [int(h) - int(prev) for h, prev in zip(held, [held[0], *held[:-1]])]

    def _plan_memory(self, keep: set[int]) -> None:
        """Note [Static memory plan]."""
        import threading

        # per step: None (the kernel's own call) or (whether each input is known to be
        # aligned, (shape, dtype, planned) per output)
        self._fast: list[tuple[tuple[bool, ...], tuple[tuple[tuple[int, ...], np.dtype, bool], ...]] | None] = []
        self._arena_specs: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
        graph_inputs = {s.node for s in self.inputs.values()}

        def fast(st: Step) -> bool:
            specs = getattr(st.kernel, "outputs", None)
            return (
                getattr(st.kernel, "run_into", None) is not None and specs is not None and len(specs) == len(st.outputs)
            )

        def needs_alignment(st: Step, j: int) -> bool:  # Note [Unaligned segment inputs]
            f = getattr(st.kernel, "input_needs_alignment", None)
            return True if f is None else bool(f(j))

        # graph inputs a fast-path kernel reads and needs aligned: those check_inputs aligns
        self._align_inputs = {
            i
            for st in self.steps
            if fast(st)
            for j, i in enumerate(st.inputs)
            if i in graph_inputs and needs_alignment(st, j)
        }
        aligned = self._align_inputs | set(self.consts)
        for st in self.steps:
            if not fast(st):
                self._fast.append(None)
                continue
            specs = st.kernel.outputs
            outs = tuple((tuple(sp.shape), np.dtype(sp.dtype), n not in keep) for n, sp in zip(st.outputs, specs))
            self._arena_specs.update((n, (shape, dt)) for n, (shape, dt, planned) in zip(st.outputs, outs) if planned)
            safe = tuple(
                i in aligned or (i in graph_inputs and not needs_alignment(st, j)) for j, i in enumerate(st.inputs)
            )
            self._fast.append((safe, outs))
            aligned.update(st.outputs)  # arena slots and fresh outputs alike
        self._input_checks = [
            (name, spec, np.dtype(spec.dtype), spec.node in self._align_inputs) for name, spec in self.inputs.items()
        ]
        sizes = {n: int(np.prod(shape, dtype=np.int64)) * dt.itemsize for n, (shape, dt) in self._arena_specs.items()}
        self._arena_offsets, self._arena_bytes = plan_arena(self.steps, sizes, keep)
        self.buffer_stats = {**self.buffer_stats, "arena_bytes": self._arena_bytes, "arena_tensors": len(sizes)}
        # Note [Input staging]: after the arena, one slot per graph input check_inputs aligns
        self._stage_offsets: dict[int, int] = {}
        end = self._arena_bytes
        for s in self.inputs.values():
            if s.node in self._align_inputs:
                self._stage_offsets[s.node] = end
                self._arena_specs.setdefault(s.node, (tuple(s.shape), np.dtype(s.dtype)))
                end += _slot_bytes(int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.dtype).itemsize)
        self._buf_bytes = end
        self._local = threading.local()

    def _arena(self) -> dict[int, np.ndarray]:
        """This thread's arena views by node (staging slots included), allocated on first use."""
        views = getattr(self._local, "views", None)
        if views is None:
            buf = aligned_empty((self._buf_bytes,), np.uint8)
            views = {}
            for n, off in [*self._arena_offsets.items(), *self._stage_offsets.items()]:
                shape, dt = self._arena_specs[n]
                views[n] = np.ndarray(shape, dt, buf, off)
            self._local.views, self._local.buf = views, buf
        return views

    def kernel_steps(self) -> list[Step]:
        """Every kernel in run order, a native segment's kernels in its place (without
        their compiled kernel: the segment runs them; Note [Native segment])."""
        out: list[Step] = []
        for st in self.steps:
            members = getattr(st.kernel, "meta", {}).get("members") if st.backend == "native-segment" else None
            if not members:
                out.append(st)
                continue
            out += [Step.from_record(m, meta={"segment": st.name}) for m in members]
        return out

    def set_threads(self, num_threads: int) -> None:
        """Note [Runtime threads]
        ~~~~~~~~~~~~~~~~~~~~~~~~~
        Kernels are profiled one at a time, each with the whole machine; end to end, up
        to four thread pools (TVM, onnxruntime sessions, OpenBLAS, torch) take turns
        on the same cores, and a parallel kernel can wait for a pool's descheduled
        worker to wake. Whether N threads beat one for the *whole executable* is
        therefore measured after build (``korch.pipeline.step_threads``), and the
        choice is saved in plan.json; every kernel follows it through
        ``CompiledKernel.set_threads``. One thread is kept only when it wins by every
        measure (``korch.selection.beats``); an executable whose call takes over
        ``THREADS_CHECK_MAX_MS``, or that is native segments only (one pool), keeps
        all threads untimed."""
        n = max(1, int(num_threads))
        for st in self.steps:
            st.kernel.set_threads(n)  # type: ignore[union-attr]
        self.threads = n

    def check_inputs(self, feeds: Mapping[str, Any]) -> dict[int, np.ndarray]:
        if len(feeds) != len(self.inputs) or not all(n in feeds for n in self.inputs):
            missing = [n for n in self.inputs if n not in feeds]
            if missing:
                raise InputError(f"missing input(s) {missing}; the model takes {list(self.inputs)}")
            extra = [n for n in feeds if n not in self.inputs]
            raise InputError(f"unknown input(s) {extra}; the model takes {list(self.inputs)}")
        env: dict[int, np.ndarray] = {}
        # per input: name, spec, numpy dtype, whether a generated kernel reads it (Note
        # [Call overhead])
        for name, spec, dtype, align in self._input_checks:
            arr = feeds[name]
            if type(arr) is not np.ndarray:
                arr = np.asarray(arr)
            if arr.shape != spec.shape:
                raise InputError(f"input {name!r}: shape {list(arr.shape)}, expected {list(spec.shape)}")
            if arr.dtype != dtype:
                raise InputError(f"input {name!r}: dtype {arr.dtype}, expected {spec.dtype}")
            # one aligned copy here, not a staging copy in every generated kernel
            # that reads it (Note [TVM buffer alignment]); an input only library
            # kernels read is passed as it is (numpy's arrays are 16-byte aligned, so
            # the copy was made on every call: 50 MB per call for segformer_b16)
            if not align:
                env[spec.node] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
                continue
            ok = arr.flags.c_contiguous and arr.flags.writeable and buffer_address(arr) % ALIGN == 0
            if ok:
                env[spec.node] = arr
            else:  # Note [Input staging]
                stage = self._arena()[spec.node]
                np.copyto(stage, arr)
                env[spec.node] = stage
        return env

    def device_runner(self):
        """The runner keeping tensors on the device (Note [Device executable]), or None when
        no kernel is a device kernel (the cpu target)."""
        if self._device_runner is None and self._on_device:
            from korch.executable.device import DeviceRunner

            self._device_runner = DeviceRunner(self, self.cuda_graph)
        return self._device_runner

    # Note [Call overhead]
    # ~~~~~~~~~~~~~~~~~~~~
    # When the executable is one onnxruntime session (the plan check often keeps one),
    # everything here is overhead on top of the session's own run, and on a small model
    # it shows: the attention example's session runs in 75-100 us, and the call took
    # 10-13 us more (input checks comparing dtype names, a device-kernel scan and an
    # import per call, an arena overlap test per output). The checks now compare
    # precomputed numpy dtypes, the device scan happens at construction, and an
    # executable without an arena skips the overlap test: 3 us
    # (benchmarks/call_overhead.py).
    def __call__(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        runner = self.device_runner()
        if runner is not None:
            return runner(feeds)
        hold = self._hold
        if hold is None:
            return self._run(feeds, [False])
        held = [self._held_first]  # whether this call holds the pool now
        if held[0]:
            hold(1)
        try:
            return self._run(feeds, held)
        finally:
            if held[0]:
                hold(0)

    def _run(self, feeds: Mapping[str, Any], held: list[bool]) -> dict[str, np.ndarray]:
        env = self.check_inputs(feeds)
        env.update(self.consts)
        arena = self._arena()
        hold = self._hold
        for step, free, fast, change in zip(self.steps, self.free_after, self._fast, self._hold_steps):
            k = step.kernel
            if change:  # Note [Holding the pool through a call]
                held[0] = change > 0
                hold(int(held[0]))
            if fast is None:
                outs = k([env[i] for i in step.inputs])  # type: ignore[misc]
            else:  # Note [Static memory plan]
                safe, out_specs = fast
                args = []
                for j, (i, ok) in enumerate(zip(step.inputs, safe)):
                    a = env[i]
                    if not ok:
                        a = k.arg(j, a)  # type: ignore[union-attr]
                    elif a.shape != k.inputs[j].shape:  # type: ignore[union-attr]
                        a = a.reshape(k.inputs[j].shape)  # type: ignore[union-attr]
                    args.append(a)
                outs = [
                    arena[n] if planned else aligned_empty(shape, dt)
                    for n, (shape, dt, planned) in zip(step.outputs, out_specs)
                ]
                k.run_into(args, outs)  # type: ignore[union-attr]
            for nid, val in zip(step.outputs, outs):
                env[nid] = val
            for nid in free:
                env.pop(nid, None)
        if not self._buf_bytes:  # no arena: nothing an output could be a view of
            return {name: env[spec.node] for name, spec in self.outputs.items()}
        buf = self._local.buf
        # an output that is a view of the arena (a reshape of a planned tensor) is copied:
        # the next call would overwrite it
        return {
            name: (v.copy() if np.may_share_memory(v, buf) else v)
            for name, v in ((name, env[spec.node]) for name, spec in self.outputs.items())
        }

    # --- persistence -----------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        (d / "kernels").mkdir(parents=True, exist_ok=True)
        steps = []
        for st in self.steps:
            meta = st.kernel.save(d / "kernels", st.name)  # type: ignore[union-attr]
            steps.append({**st.record(), "meta": meta})
        plan = {
            "version": PLAN_VERSION,
            "inputs": {k: dataclasses.asdict(v) for k, v in self.inputs.items()},
            "outputs": {k: dataclasses.asdict(v) for k, v in self.outputs.items()},
            "steps": steps,
            "free_after": self.free_after,
            "buffer_stats": self.buffer_stats,
            "cuda_graph": self.cuda_graph,
            "threads": self.threads,
        }
        (d / "plan.json").write_text(json.dumps(plan, indent=1))
        np.savez(d / "consts.npz", **{str(k): v for k, v in self.consts.items()})

    @classmethod
    def load(cls, directory: str | Path, num_threads: int | None = None) -> Executable:
        import os

        from korch.kernels.registry import get_backend

        d = Path(directory)
        if not (d / "plan.json").exists():
            raise KorchError(f"{d} is not a korch output folder (no plan.json); run `korch optimize` first")
        plan = json.loads((d / "plan.json").read_text())
        if plan.get("version") != PLAN_VERSION:
            raise KorchError(f"{d}: plan version {plan.get('version')} is not {PLAN_VERSION}; re-optimize")
        threads = num_threads or plan.get("threads") or os.cpu_count() or 1
        with np.load(d / "consts.npz") as z:
            consts = {int(k): z[k] for k in z.files}
        steps = []
        for s in plan["steps"]:
            kernel = get_backend(s["backend"]).load(s["meta"], d / "kernels", threads)
            steps.append(Step.from_record(s, kernel, s["meta"]))
        spec = lambda v: TensorSpec(v["node"], tuple(v["shape"]), v["dtype"])  # noqa: E731
        exe = cls(
            {k: spec(v) for k, v in plan["inputs"].items()},
            {k: spec(v) for k, v in plan["outputs"].items()},
            consts,
            steps,
            plan["free_after"],
            plan.get("buffer_stats"),
        )
        exe.cuda_graph = bool(plan.get("cuda_graph", False))
        exe.set_threads(threads)
        return exe
