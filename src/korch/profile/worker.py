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
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection

import numpy as np

from korch.ir.graph import Graph


@dataclasses.dataclass
class Job:
    key: tuple  # (workload hash, backend) — opaque to the worker
    backend: str
    kgraph: Graph
    consts: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class JobResult:
    key: tuple
    status: str
    median_us: float | None
    times_us: tuple[float, ...]
    error: str


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[-1] if msg else ''}"[:500]


def _worker_main(conn: Connection, num_threads: int, timing: tuple[int, int, float]) -> None:
    from korch.kernels.base import get_backend
    from korch.profile.timing import check_outputs, median, random_inputs, time_kernel

    warmup, repeat, min_ms = timing
    while True:
        msg = conn.recv()
        if msg is None:
            return
        backend_name, items = msg
        backend = get_backend(backend_name)
        built = backend.build_many([(kg, consts) for _, kg, consts in items], num_threads)
        conn.send(("built", len(built)))
        for (key, kg, consts), ck in zip(items, built):
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
                times = time_kernel(ck, args, warmup, repeat, min_ms)
                conn.send(("result", JobResult(key, "ok", median(times), tuple(times), "")))
            except Exception as e:  # noqa: BLE001 - recorded as a failed measurement
                tb = traceback.format_exc(limit=1)
                conn.send(("result", JobResult(key, "failed", None, (), _one_line(e) + " | " + tb[-200:])))
        conn.send(("done", None))


class WorkerPool:
    """One measurement worker at a time (on 2 cores, parallel timing would lie)."""

    def __init__(self, num_threads: int, timing: tuple[int, int, float], timeout_s: float):
        self.num_threads = num_threads
        self.timing = timing
        self.timeout_s = timeout_s
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

    def _kill(self) -> None:
        if self._proc is not None:
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

    def _recv(self, timeout: float):
        assert self._conn is not None
        if not self._conn.poll(timeout):
            return ("timeout", None)
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            return ("crash", None)

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
            self._conn.send((batch[0].backend, [(j.key, j.kgraph, j.consts) for j in batch]))
            kind, _ = self._recv(self.timeout_s + 5.0 * len(batch))
            if kind != "built":
                self._kill()
                if len(batch) > 1:  # find the guilty kernel one at a time
                    queue[:0] = [[j] for j in batch]
                else:
                    on_result(
                        JobResult(
                            batch[0].key,
                            kind if kind in ("timeout", "crash") else "crash",
                            None,
                            (),
                            f"worker {kind} while building",
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
                    on_result(JobResult(guilty.key, kind, None, (), f"worker {kind} while measuring"))
                if remaining:
                    queue.insert(0, remaining)
                break
