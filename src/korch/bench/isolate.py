"""Each engine of ``korch bench`` in a process of its own.

Note [Engines in their own processes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``korch bench`` used to hold korch's executable, the onnxruntime peer and the PyTorch
peers in one process and interleave them (Note [Timing in blocks]). On this 2-core
VM the engines disturbed each other by more than the differences being measured: an
executable that is one onnxruntime session of the model, node for node the peer's
graph, timed 2-7% slower than the peer on five suite models, while the two sessions
alone in a process timed equal (benchmarks/RESULTS.md in git history). Thread
pools, allocator arenas and spinning threads of every engine shared one process.

So each engine now lives in a spawned process of its own (``EngineProcess``): it
builds its engine from a small spec (an output folder, a model path), checks in, and
then runs blocks of calls on request, timing each call itself; only the times
travel back, so the pipe's round trip is not in any sample.

Separate processes alone were not enough. onnxruntime's default session keeps its
threads spinning after a call returns, and on two cores the engine timed next
competed with them: yolo_b1, engines in processes, rounds of korch, onnxruntime and a
second identical onnxruntime session: 3.9 / 2.9 / 6.3 ms, the one timed right after the
first session slowed 2x. So an engine answers a block only once its process is quiet
(``compare.quiesce``: a 10 ms window in which all its threads used under a tenth of a core),
and the next engine starts on an idle machine, as each would run for a user. Its first
calls after the idle wait are slower (yolo_b1, blocks of three: 4.8 / 3.6 / 3.3 ms for
three engines that time 2.9-3.0 ms each in blocks of ten or thirty), so ``korch bench``
sizes blocks to about 100 ms of calls (3 to 30 calls, the first dropped). The parent still
interleaves the engines round by round, one at a time, so a phase of the machine's
drift reaches all of them alike, and starts several fresh sets of engine processes
one after another, reporting the median over processes (Note [Medians over processes],
``korch.profile.e2e.over_processes``). ``korch bench --in-process`` keeps the old way.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from korch.errors import KorchError
from korch.profile.e2e import quiesce

START_TIMEOUT_S = 900.0  # torch.compile of a batch-16 model, on a loaded machine
CALL_TIMEOUT_S = 600.0


def _build(kind: str, spec: str, feeds: dict, out_names: list[str], threads: int):
    """(run, info) for one engine; ``run()`` returns the outputs by name."""
    info: dict[str, Any] = {}
    if kind == "korch":
        from korch.api import load

        compiled = load(spec)  # with the thread count korch chose (Note [Runtime threads])
        return (lambda: compiled(feeds)), info
    if kind == "ort":
        from korch.profile.e2e import ort_session

        sess = ort_session(Path(spec).read_bytes(), threads)
        return (lambda: dict(zip(out_names, sess.run(None, feeds)))), info
    if kind == "ov":
        from korch.bench.peers import openvino_runner

        return openvino_runner(spec, feeds, out_names, threads)
    if kind in ("eager", "compile"):
        import torch

        from korch.bench.peers import torch_module, torch_runner

        torch.set_num_threads(threads)
        built = torch_module(Path(spec))
        if built is None:
            raise KorchError("no torch sidecar or torch not installed")
        module, in_names = built
        if kind == "compile":
            t0 = time.perf_counter()
            run = torch_runner(torch.compile(module), in_names, feeds, out_names)
            run()
            info["compile_seconds"] = round(time.perf_counter() - t0, 1)
            return run, info
        return torch_runner(module, in_names, feeds, out_names), info
    raise KorchError(f"unknown engine {kind!r}")


def _engine_main(conn, kind: str, spec: str, feeds: dict, out_names: list[str], threads: int) -> None:
    try:
        run, info = _build(kind, spec, feeds, out_names, threads)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
        return
    conn.send(("ready", info))
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:
            return
        try:
            if cmd == "outputs":
                conn.send(("ok", {k: np.asarray(v) for k, v in run().items()}))
            elif cmd == "block":
                times = []
                for _ in range(int(arg)):
                    t0 = time.perf_counter()
                    run()
                    times.append((time.perf_counter() - t0) * 1e3)
                quiesce()
                conn.send(("ok", times))
            else:  # "close"
                conn.send(("ok", None))
                return
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", f"{type(e).__name__}: {e}"))


class EngineProcess:
    """One engine in a spawned process: ``outputs()`` and ``block(n)`` (ms of n calls,
    which ``compare.time_alternating`` uses). Raises KorchError, with the child's
    message, when the engine cannot be built or a call fails."""

    def __init__(self, kind: str, spec: str | Path, feeds: dict, out_names: list[str], threads: int):
        self.kind = kind
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_engine_main, args=(child, kind, str(spec), feeds, list(out_names), threads), daemon=True
        )
        self._proc.start()
        child.close()
        self.info: dict = self._recv(START_TIMEOUT_S, "start")

    def _recv(self, timeout: float, what: str):
        if not self._conn.poll(timeout):
            self.close()
            raise KorchError(f"{self.kind} engine: no answer to {what} within {timeout:.0f} s")
        try:
            status, payload = self._conn.recv()
        except EOFError:
            code = self._proc.exitcode
            self.close()
            raise KorchError(f"{self.kind} engine process died during {what} (exit code {code})") from None
        if status == "error":
            self.close()
            raise KorchError(f"{self.kind} engine failed during {what}: {payload}")
        return payload

    def _ask(self, cmd: str, arg=None):
        self._conn.send((cmd, arg))
        return self._recv(CALL_TIMEOUT_S, cmd)

    def outputs(self) -> dict[str, np.ndarray]:
        return self._ask("outputs")

    def block(self, n: int) -> list[float]:
        return self._ask("block", n)

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.is_alive():
                self._conn.send(("close", None))
                self._proc.join(10)
        except (BrokenPipeError, OSError):
            pass
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._proc = None
