"""Distributed measurement on TVM's RPC tracker and servers (docs/distributed.md).

Note [Distributed measurement]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``korch optimize ... --tracker HOST:PORT --key KEY`` times TVM kernels on the RPC
servers registered with the tracker under KEY, the mechanism TVM's own tuners use.

* Building stays here, in the isolated measurement worker (``WorkerPool.export``):
  each batch of kernels is compiled as one module and exported as a shared library.
  Crashes, hangs and runaway memory while building are isolated exactly as for local
  measurement.
* One thread per server session pulls kernels from a queue: it uploads the library
  (once per session), allocates random inputs *on the remote device*, runs the kernel
  once, downloads the outputs and checks them against the reference interpreter here,
  then times it with ``time_evaluator`` (``min_repeat_ms`` plays the role of the local
  ``min_repeat_ms``). Results go back to the calling thread, which alone writes the
  database (an sqlite3 connection belongs to one thread), each committed at once.
* A server that dies mid-run (its connection breaks): the job in flight goes back on
  the queue for another server, and that server's thread ends. A job that has broken
  ``MAX_ATTEMPTS`` servers is itself the problem and is recorded as "crash". A job
  running longer than the kernel time limit is recorded as "timeout" and its thread
  is abandoned (a blocking RPC call cannot be interrupted). If every server is gone
  while jobs remain, those jobs stay unmeasured (nothing is recorded for them) and
  the run stops with a KorchError: rerunning resumes with what was measured.
* Only TVM kernels go to the servers. Library kernels (onnxruntime, numpy, torch) and
  opaque operators run in those libraries' Python bindings, which an RPC server does
  not have: it loads and runs TVM modules only. They are measured locally, so on a
  heterogeneous cluster korch should run on a machine like the servers.

Each measurement records where it ran: ``host`` = ``"rpc:HOST:PORT"``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import queue
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

from korch.errors import KorchError
from korch.profile.worker import ExportedKernel, Job, JobResult, WorkerPool

log = logging.getLogger("korch")

MAX_ATTEMPTS = 2
CONNECT_TIMEOUT_S = 30.0


def parse_tracker(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise KorchError(f"bad --tracker {text!r}: expected HOST:PORT")
    return host, int(port)


def check_options(tracker: str, key: str) -> None:
    """Fail fast (before any work) on malformed ``--tracker``/``--key``."""
    parse_tracker(tracker)
    if not key:
        raise KorchError("--tracker needs --key (the device key the RPC servers registered with)")


def server_count(tracker: tuple[str, int], key: str) -> int:
    """How many RPC servers the tracker lists under ``key``."""
    from tvm import rpc

    try:
        summary = rpc.connect_tracker(*tracker).summary()
    except Exception as e:  # noqa: BLE001 - reported as one line
        raise KorchError(f"cannot reach the RPC tracker at {tracker[0]}:{tracker[1]}: {e}") from None
    return sum(1 for s in summary.get("server_info", []) if s.get("key", "").split(":", 1)[-1] == key)


def request_session(tracker: tuple[str, int], key: str, timeout_s: float = CONNECT_TIMEOUT_S):
    """A session on a free server with ``key``, and that server's "HOST:PORT".

    ``TrackerSession.request`` does the same but keeps the server's address to itself;
    we speak its two-message protocol (tvm.rpc.base) to learn where each job ran.
    """
    from tvm import rpc
    from tvm.rpc import base

    sock = socket.create_connection(tracker, timeout=timeout_s)
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
            raise KorchError(f"{tracker[0]}:{tracker[1]} is not a TVM RPC tracker")
        base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", 1])
        value = base.recvjson(sock)
    finally:
        sock.close()
    if value[0] != base.TrackerCode.SUCCESS:
        raise RuntimeError(f"tracker refused the request: {value}")
    url, port, matchkey = value[1]
    return rpc.connect(url, port, matchkey), f"{url}:{port}"


@dataclasses.dataclass
class _Item:
    job: Job
    kernel: ExportedKernel
    attempts: int = 0


class _ServerThread(threading.Thread):
    def __init__(self, sess, where: str, jobs: queue.Queue, out: queue.Queue, timing: tuple[int, int, float]):
        super().__init__(daemon=True, name=f"korch-rpc-{where}")
        self.sess, self.where, self.jobs, self.out, self.timing = sess, where, jobs, out, timing
        self.current: tuple[_Item, float] | None = None
        self.abandoned = False
        self.dead = False
        self.modules: dict[str, object] = {}

    def run(self) -> None:
        while not self.abandoned:
            item = self.jobs.get()
            if item is None:
                return
            self.current = (item, time.monotonic())
            try:
                result = self._measure(item)
            except Exception as e:  # noqa: BLE001 - the server or the connection failed
                if self.abandoned:
                    return
                if self._alive():
                    result = JobResult(item.job.key, "failed", None, (), f"rpc: {_one_line(e)}", f"rpc:{self.where}")
                else:
                    log.warning("RPC server %s is gone (%s); its job goes to another server", self.where, _one_line(e))
                    self.dead = True
                    self.current = None
                    self.out.put(("lost", item))
                    return
            if self.abandoned:
                return
            self.current = None
            self.out.put(("result", result))

    def _alive(self) -> bool:
        """One round trip (a 1-element remote tensor) succeeds."""
        import tvm

        try:
            tvm.runtime.empty((1,), "float32", self.sess.cpu()).numpy()
            return True
        except Exception:  # noqa: BLE001
            return False

    def _measure(self, item: _Item) -> JobResult:
        import numpy as np
        import tvm

        from korch.profile.timing import check_outputs, median, random_inputs

        job, k = item.job, item.kernel
        mod = self.modules.get(k.library)
        if mod is None:
            name = os.path.basename(k.library)
            self.sess.upload(k.library, name)
            mod = self.modules[k.library] = self.sess.load_module(name)
        dev = self.sess.cpu()
        args = random_inputs(job.kgraph, job.consts)
        ins = [
            tvm.runtime.tensor(np.ascontiguousarray(np.asarray(a, dtype=dt).reshape(shape)), dev)
            for a, (shape, dt) in zip(args, k.inputs)
        ]
        outs = [tvm.runtime.empty(shape, dt, dev) for shape, dt in k.outputs]
        hidden = [tvm.runtime.tensor(np.ascontiguousarray(h), dev) for h in k.hidden]
        mod[k.symbol](*ins, *outs, *hidden)
        host = f"rpc:{self.where}"
        shapes = [job.kgraph.nodes[n].shape for n in job.kgraph.outputs.values()]
        err = check_outputs(job.kgraph, args, [o.numpy().reshape(s) for o, s in zip(outs, shapes)])
        if err:
            return JobResult(job.key, "wrong", None, (), err, host)
        _warmup, repeat, min_ms = self.timing
        # time_evaluator takes whole milliseconds per repeat
        f = mod.time_evaluator(k.symbol, dev, number=1, repeat=max(1, repeat), min_repeat_ms=max(1, math.ceil(min_ms)))
        times = tuple(float(t) * 1e6 for t in f(*ins, *outs, *hidden).results)
        return JobResult(job.key, "ok", median(list(times)), times, "", host)


def _one_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]


class RpcMeasurer:
    """Measures TVM jobs on the tracker's servers; see Note [Distributed measurement]."""

    def __init__(self, tracker: str, key: str, pool: WorkerPool, timing: tuple[int, int, float], timeout_s: float):
        if not key:
            raise KorchError("--tracker needs --key (the device key the RPC servers registered with)")
        self.tracker = parse_tracker(tracker)
        self.key = key
        self.pool = pool
        self.timing = timing
        self.timeout_s = timeout_s
        self.servers_used: set[str] = set()

    def _connect(self, n: int) -> list[tuple[object, str]]:
        sessions = []
        for _ in range(n):
            try:
                sessions.append(request_session(self.tracker, self.key))
            except Exception as e:  # noqa: BLE001 - fewer servers than listed (one just died)
                log.warning("RPC session request failed: %s", _one_line(e))
                break
        return sessions

    def run(self, jobs: Sequence[Job], on_result: Callable[[JobResult], None]) -> None:
        """Measure every job (all TVM); ``on_result`` is called in this thread only."""
        if not jobs:
            return
        n = server_count(self.tracker, self.key)
        if n == 0:
            raise KorchError(f"no RPC server with key {self.key!r} at tracker {self.tracker[0]}:{self.tracker[1]}")
        work: queue.Queue = queue.Queue()
        out: queue.Queue = queue.Queue()
        threads = [_ServerThread(s, w, work, out, self.timing) for s, w in self._connect(n)]
        if not threads:
            raise KorchError(f"could not open a session on any RPC server with key {self.key!r}")
        for t in threads:
            t.start()
        self.servers_used |= {t.where for t in threads}
        outstanding = 0

        def drain(block: bool) -> None:
            nonlocal outstanding
            while True:
                try:
                    kind, payload = out.get(timeout=0.2) if block else out.get_nowait()
                except queue.Empty:
                    break
                block = False
                if kind == "result":
                    outstanding -= 1
                    on_result(payload)
                else:  # "lost": the server died under this job; another server retries it
                    payload.attempts += 1
                    if payload.attempts >= MAX_ATTEMPTS:
                        outstanding -= 1
                        msg = f"RPC servers died {payload.attempts} times while measuring it"
                        on_result(JobResult(payload.job.key, "crash", None, (), msg, "rpc"))
                    else:
                        work.put(payload)
            now = time.monotonic()
            for t in threads:
                cur = t.current
                if cur is not None and not t.abandoned and now - cur[1] > self.timeout_s:
                    t.abandoned = True
                    outstanding -= 1
                    msg = f"no answer from RPC server {t.where} within {self.timeout_s:.0f} s"
                    on_result(JobResult(cur[0].job.key, "timeout", None, (), msg, f"rpc:{t.where}"))

        with tempfile.TemporaryDirectory(prefix="korch-rpc-") as tmp:
            try:
                for job, built in self.pool.export(list(jobs), tmp):
                    if isinstance(built, JobResult):
                        on_result(built)
                    else:
                        work.put(_Item(job, built))
                        outstanding += 1
                    drain(block=False)
                while outstanding > 0:
                    drain(block=True)
                    if outstanding > 0 and all(t.dead or t.abandoned for t in threads):
                        drain(block=False)  # a last "lost" message goes back on the queue
                        raise KorchError(
                            f"every RPC server with key {self.key!r} was lost; {outstanding} kernel(s) are "
                            "unmeasured (rerun to measure them; finished measurements are kept)"
                        )
            finally:
                for _ in threads:
                    work.put(None)
                for t in threads:
                    if not t.abandoned:
                        t.join(timeout=5)


__all__ = ["RpcMeasurer", "parse_tracker", "request_session", "server_count"]
