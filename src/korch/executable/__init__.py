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
from korch.kernels.base import CompiledKernel

PLAN_VERSION = 1


def _aligned(a: np.ndarray, align: int = 64) -> np.ndarray:
    a = np.asarray(a)
    buf = np.empty(a.nbytes + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    out = buf[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


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
        self.consts = {k: _aligned(v) for k, v in consts.items()}
        self.steps = steps
        keep = {s.node for s in outputs.values()}
        sizes = {}
        if free_after is None:
            free_after, buffer_stats = plan_buffers(steps, keep, sizes)
        self.free_after = free_after
        self.buffer_stats = buffer_stats or {}
        self.cuda_graph = False  # Settings.cuda_graph; used by the device runner
        self._device_runner = None
        self.threads: int | None = None  # chosen at build time (Note [Runtime threads])

    def set_threads(self, num_threads: int) -> None:
        """Note [Runtime threads]
        ~~~~~~~~~~~~~~~~~~~~~~~~~
        Kernels are profiled one at a time, each with the whole machine; end to end, up
        to four thread pools (TVM, onnxruntime sessions, OpenBLAS, torch) take turns
        on the same cores, and a parallel kernel can wait for a pool's descheduled
        worker to wake. Whether N threads beat one for the *whole executable* is
        therefore measured after build (``korch.pipeline.step_threads``), and the
        choice is saved in plan.json; every kernel follows it through
        ``CompiledKernel.set_threads``."""
        n = max(1, int(num_threads))
        for st in self.steps:
            st.kernel.set_threads(n)  # type: ignore[union-attr]
        self.threads = n

    def check_inputs(self, feeds: Mapping[str, Any]) -> dict[int, np.ndarray]:
        env: dict[int, np.ndarray] = {}
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model takes {list(self.inputs)}")
        extra = [n for n in feeds if n not in self.inputs]
        if extra:
            raise InputError(f"unknown input(s) {extra}; the model takes {list(self.inputs)}")
        for name, spec in self.inputs.items():
            arr = np.asarray(feeds[name])
            if tuple(arr.shape) != spec.shape:
                raise InputError(f"input {name!r}: shape {list(arr.shape)}, expected {list(spec.shape)}")
            if str(arr.dtype) != spec.dtype:
                raise InputError(f"input {name!r}: dtype {arr.dtype}, expected {spec.dtype}")
            # one aligned copy here, not a staging copy in every generated kernel
            # that reads it (Note [TVM buffer alignment])
            ok = arr.flags.c_contiguous and arr.flags.writeable and arr.ctypes.data % 64 == 0
            env[spec.node] = arr if ok else _aligned(arr)
        return env

    def device_runner(self):
        """The runner keeping tensors on the device (Note [Device executable]), or None when
        no kernel is a device kernel (the cpu target)."""
        from korch.executable.device import DeviceRunner, is_device_kernel

        if self._device_runner is None and any(is_device_kernel(s.kernel) for s in self.steps):
            self._device_runner = DeviceRunner(self, self.cuda_graph)
        return self._device_runner

    def __call__(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        runner = self.device_runner()
        if runner is not None:
            return runner(feeds)
        env = self.check_inputs(feeds)
        env.update(self.consts)
        for step, free in zip(self.steps, self.free_after):
            outs = step.kernel([env[i] for i in step.inputs])  # type: ignore[misc]
            for nid, val in zip(step.outputs, outs):
                env[nid] = val
            for nid in free:
                env.pop(nid, None)
        return {name: env[spec.node] for name, spec in self.outputs.items()}

    # --- persistence -----------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        (d / "kernels").mkdir(parents=True, exist_ok=True)
        steps = []
        for st in self.steps:
            meta = st.kernel.save(d / "kernels", st.name)  # type: ignore[union-attr]
            steps.append(
                {
                    "name": st.name,
                    "backend": st.backend,
                    "workload": st.workload,
                    "nodes": list(st.nodes),
                    "inputs": list(st.inputs),
                    "outputs": list(st.outputs),
                    "meta": meta,
                }
            )
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

        from korch.kernels.base import get_backend

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
            steps.append(
                Step(
                    s["name"],
                    s["backend"],
                    s["workload"],
                    tuple(s["nodes"]),
                    tuple(s["inputs"]),
                    tuple(s["outputs"]),
                    kernel,
                    s["meta"],
                )
            )
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
