"""Isolated measurement: kernels are built and timed in a worker process.

Note [Measurement isolation]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A generated kernel can segfault, abort, hang or compute garbage. The parent sends a
batch of jobs (one backend, so TVM compiles the batch as one module) to a worker
process and waits on a pipe with a time limit. Each job's result is committed to the
database the moment it arrives. If the worker dies or goes silent, the job in flight
is recorded as "crash" or "timeout", the worker is restarted, and the rest of the
batch is retried; a build phase that dies is retried one job at a time so that the
guilty kernel is found. Results computed before the failure are never lost.

Memory: while it waits, the parent samples the worker's resident memory (psutil, the
worker every ``MEMORY_POLL_S``, its children every ``CHILD_SCAN_S``) and kills it once it exceeds
``Settings.kernel_memory_mb``; the job in flight is recorded as "oom". We do not set
RLIMIT_AS in the worker: it limits *address space*, and a worker that has imported
TVM and onnxruntime already reserves 1.1 GB of it while only 415 MB is resident
(LLVM, thread stacks and allocator arenas reserve far more than they touch), so a
limit tight enough to matter fails kernels that fit, and a runaway allocation under
it surfaces as a MemoryError, a C++ abort or an LLVM "out of memory" report instead
of one clear status. Resident memory is what exhausts a machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from korch.ir.graph import Graph


@dataclasses.dataclass
class Job:
    key: tuple  # (workload hash, backend) — opaque to the worker
    backend: str
    kgraph: Graph
    consts: dict[str, np.ndarray]
    config: Any = None  # the backend's tile config (tvm: a TileConfig), None: its default


@dataclasses.dataclass(frozen=True)
class JobResult:
    key: tuple
    status: str
    median_us: float | None
    times_us: tuple[float, ...]
    error: str
    host: str = ""  # where it was measured ("" here; "rpc:HOST:PORT", korch.profile.rpc)


@dataclasses.dataclass(frozen=True)
class ExportedKernel:
    """A TVM kernel built here and exported as a shared library, for an RPC server
    (korch.profile.rpc): call ``symbol(*inputs, *outputs, *hidden)``."""

    library: str  # path of the exported .so (one per built batch)
    symbol: str
    # (shape, dtype) in kernel-input order, as the function takes them: coalesced shapes
    # where it was generated over coalesced axes (Note [Coalesced axes])
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]
    hidden: tuple[np.ndarray, ...]  # constant arrays the kernel takes after its outputs


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[-1] if msg else ''}"[:500]


def _worker_main(conn: Connection, num_threads: int, timing: tuple[int, int, float]) -> None:
    from korch.kernels.registry import all_backends, get_backend
    from korch.profile.timing import check_outputs, median, random_inputs, time_kernel

    all_backends()  # import every backend (and its library) before the first timed job
    try:
        import tvm  # noqa: F401  (seconds of import that must not count against a job's time limit)
    except ImportError:
        pass
    conn.send(("ready", os.getpid()))
    warmup, repeat, min_ms = timing
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg[0] == "export":  # build and export for RPC servers (korch.profile.rpc)
            conn.send(("exported", _export(get_backend(msg[1]), msg[2], msg[3], num_threads)))
            continue
        backend_name, items = msg
        backend = get_backend(backend_name)
        configs = [it[3] for it in items]
        kw = {"tile_configs": configs} if any(c is not None for c in configs) else {}
        built = backend.build_many([(it[1], it[2]) for it in items], num_threads, **kw)
        conn.send(("built", len(built)))
        for (key, kg, consts, _), ck in zip(items, built):
            conn.send(("start", key))
            if isinstance(ck, Exception):
                conn.send(("result", JobResult(key, "failed", None, (), "build: " + _one_line(ck))))
                continue
            try:
                args = random_inputs(kg, consts)
                err = check_outputs(kg, args, ck(args))
                if err:
                    conn.send(("result", JobResult(key, "wrong", None, (), err)))
                    continue
                if getattr(ck, "device_kernel", False):  # cuda target: CUDA events, tensors on the device
                    from korch.profile.device_timing import time_device_kernel

                    times = time_device_kernel(ck, args, warmup, repeat, min_ms)
                else:
                    with getattr(ck, "timed", contextlib.nullcontext)():
                        times = time_kernel(ck, args, warmup, repeat, min_ms)
                conn.send(("result", JobResult(key, "ok", median(times), tuple(times), "")))
            except Exception as e:  # noqa: BLE001 - recorded as a failed measurement
                tb = traceback.format_exc(limit=1)
                conn.send(("result", JobResult(key, "failed", None, (), _one_line(e) + " | " + tb[-200:])))
        conn.send(("done", None))


MEMORY_POLL_S = 0.1
CHILD_SCAN_S = 2.0
STARTUP_TIMEOUT_S = 600.0


def _failure_message(kind: str, phase: str, memory_mb: float | None) -> str:
    if kind == "oom":
        return f"worker exceeded the memory limit ({memory_mb:.0f} MiB resident) while {phase}; killed"
    return f"worker {kind} while {phase}"


def _export(backend, items, directory: str, num_threads: int) -> list[tuple[str, object]]:
    """Build ``items`` (as ``_worker_main`` gets them) and export each distinct library;
    ``[("built", ExportedKernel) | ("failed", message)]`` in order. TVM kernels only."""
    import uuid

    configs = [it[3] for it in items]
    kw = {"tile_configs": configs} if any(c is not None for c in configs) else {}
    built = backend.build_many([(it[1], it[2]) for it in items], num_threads, **kw)
    libs: dict[int, str] = {}
    out: list[tuple[str, object]] = []
    for ck in built:
        if isinstance(ck, Exception):
            out.append(("failed", "build: " + _one_line(ck)))
            continue
        try:
            if id(ck.lib) not in libs:
                path = os.path.join(directory, f"korch_{uuid.uuid4().hex[:12]}.so")
                ck.lib.export_library(path)
                libs[id(ck.lib)] = path
            specs = ck.call_specs()  # the function's own shapes (Note [Coalesced axes])
            n_in = len(ck.inputs)
            out.append(
                (
                    "built",
                    ExportedKernel(
                        libs[id(ck.lib)], ck.symbol, tuple(specs[:n_in]), tuple(specs[n_in:]), tuple(ck._hidden_np)
                    ),
                )
            )
        except Exception as e:  # noqa: BLE001 - a failed export is a recorded result
            out.append(("failed", "export: " + _one_line(e)))
    return out


class WorkerPool:
    """One measurement worker at a time (on 2 cores, parallel timing would lie)."""

    def __init__(
        self, num_threads: int, timing: tuple[int, int, float], timeout_s: float, memory_mb: float | None = None
    ):
        self.num_threads = num_threads
        self.timing = timing
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb  # resident-memory limit of the worker (None: unlimited)
        self.peak_rss_mb = 0.0  # the largest worker RSS seen (for reports)
        self._ps = None  # psutil.Process of the worker, its children, when they were listed
        self._ps_children: list = []
        self._ps_scan = 0.0
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        os.environ.setdefault("TVM_NUM_THREADS", str(self.num_threads))
        self._proc = ctx.Process(target=_worker_main, args=(child, self.num_threads, self.timing), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        # Importing TVM and onnxruntime takes seconds (minutes on a loaded machine); it
        # must not count against the first job's time limit, or a restarted worker
        # times out again and again.
        kind, _ = self._recv(STARTUP_TIMEOUT_S)
        if kind != "ready":
            self._kill()
            raise RuntimeError(f"the measurement worker did not start ({kind})")

    def _kill(self) -> None:
        if self._proc is not None and self._proc.pid is not None:  # None: start() failed
            self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
                self._proc.join(5)  # type: ignore[union-attr]
            except (OSError, BrokenPipeError):
                pass
        self._kill()

    def _rss_mb(self) -> float:
        """Resident memory of the worker and its children, in MiB (0 if it is gone).

        Reading one process's RSS is cheap (/proc/PID/statm); listing children scans
        every process on the machine (30 ms on a busy one), so the children (a linker
        that ``export_library`` runs, say) are looked up only every ``CHILD_SCAN_S``.
        """
        import psutil

        pid = self._proc.pid  # type: ignore[union-attr]
        now = time.monotonic()
        try:
            if self._ps is None or self._ps.pid != pid:
                self._ps, self._ps_children, self._ps_scan = psutil.Process(pid), [], 0.0
            if now - self._ps_scan > CHILD_SCAN_S:
                self._ps_children, self._ps_scan = self._ps.children(recursive=True), now
            total = self._ps.memory_info().rss
        except psutil.Error:
            return 0.0
        for q in self._ps_children:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                pass
        return total / 2**20

    def _recv(self, timeout: float):
        assert self._conn is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return ("timeout", None)
            if self._conn.poll(min(left, MEMORY_POLL_S) if self.memory_mb else left):
                break
            if self.memory_mb:
                rss = self._rss_mb()
                self.peak_rss_mb = max(self.peak_rss_mb, rss)
                if rss > self.memory_mb:
                    return ("oom", None)
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            return ("crash", None)

    def export(self, jobs: Sequence[Job], directory: str, batch_size: int = 16):
        """Build and export TVM ``jobs`` in the worker, batch by batch; yields
        ``(job, ExportedKernel | JobResult)`` as each batch finishes (a JobResult is the
        job's final, failed result). Crashes, hangs and runaway memory while building
        are isolated as in ``run``: the batch is retried one kernel at a time."""
        queue = [list(jobs[i : i + batch_size]) for i in range(0, len(jobs), batch_size)]
        while queue:
            batch = queue.pop(0)
            if self._proc is None or not self._proc.is_alive():
                self._start()
            assert self._conn is not None
            items = [(j.key, j.kgraph, j.consts, j.config) for j in batch]
            self._conn.send(("export", batch[0].backend, items, directory))
            kind, payload = self._recv(self.timeout_s + 5.0 * len(batch))
            if kind != "exported":
                self._kill()
                if len(batch) > 1:
                    queue[:0] = [[j] for j in batch]
                else:
                    status = kind if kind in ("timeout", "crash", "oom") else "crash"
                    yield (
                        batch[0],
                        JobResult(batch[0].key, status, None, (), _failure_message(status, "building", self.memory_mb)),
                    )
                continue
            for j, (st, val) in zip(batch, payload):
                yield j, (val if st == "built" else JobResult(j.key, "failed", None, (), str(val)))

    def run(self, jobs: Sequence[Job], on_result: Callable[[JobResult], None], batch_size: int = 16) -> None:
        """Measure every job, calling ``on_result`` once per job as soon as it is known."""
        by_backend: dict[str, list[Job]] = {}
        for j in jobs:
            by_backend.setdefault(j.backend, []).append(j)
        queue: list[list[Job]] = []
        for items in by_backend.values():
            queue.extend(items[i : i + batch_size] for i in range(0, len(items), batch_size))
        while queue:
            batch = queue.pop(0)
            if self._proc is None or not self._proc.is_alive():
                self._start()
            assert self._conn is not None
            self._conn.send((batch[0].backend, [(j.key, j.kgraph, j.consts, j.config) for j in batch]))
            kind, _ = self._recv(self.timeout_s + 5.0 * len(batch))
            if kind != "built":
                self._kill()
                if len(batch) > 1:  # find the guilty kernel one at a time
                    queue[:0] = [[j] for j in batch]
                else:
                    on_result(
                        JobResult(
                            batch[0].key,
                            kind if kind in ("timeout", "crash", "oom") else "crash",
                            None,
                            (),
                            _failure_message(kind, "building", self.memory_mb),
                        )
                    )
                continue
            remaining = list(batch)
            while True:
                kind, payload = self._recv(self.timeout_s)
                if kind == "start":
                    continue
                if kind == "result":
                    remaining = [j for j in remaining if j.key != payload.key]
                    on_result(payload)
                    continue
                if kind == "done":
                    break
                # the worker died or hung on the first remaining job (results come in order)
                self._kill()
                if remaining:
                    guilty = remaining.pop(0)
                    on_result(
                        JobResult(guilty.key, kind, None, (), _failure_message(kind, "measuring", self.memory_mb))
                    )
                if remaining:
                    queue.insert(0, remaining)
                break
