"""Profiling: measure each candidate kernel once per (target, backend, config, versions)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.profile.db import Measurement, ResultsDB
from korch.profile.worker import Job, JobResult, WorkerPool

# 2: inputs 64-byte aligned when timing (random_inputs), so generated kernels are
# timed without a staging copy; measurements of version 1 are not reused
# 3: integer inputs an opaque operator reads as positions are drawn within the axis
# they index (Note [Index operands] in korch.ir.opaque), so those kernels measure
# where version 2 recorded a failure that a database would keep
KORCH_MEASURE_VERSION = "3"


@dataclasses.dataclass
class Workload:
    """A canonical kernel to measure, with the backends that can run it."""

    hash: str
    kind: str
    kgraph: Graph
    consts: dict[str, np.ndarray]
    backends: tuple[str, ...]
    config: str = "default"  # the DB's config key (tvm: korch.kernels.tvm.tiling.config_key)
    tile_config: Any = None  # passed to the tvm backend's build (None: its default rule)


@dataclasses.dataclass
class ProfileStats:
    requested: int = 0
    cached: int = 0
    measured: int = 0
    failed: int = 0
    seconds: float = 0.0


def versions_of(backend_name: str) -> str:
    from korch.kernels.registry import get_backend

    return f"korch-measure {KORCH_MEASURE_VERSION}; {backend_name} {get_backend(backend_name).version()}"


def profile(
    workloads: Sequence[Workload],
    db: ResultsDB,
    target: str,
    settings,
    progress: bool = True,
    pool: WorkerPool | None = None,
) -> tuple[dict[tuple[str, str], Measurement], ProfileStats]:
    """Look up or measure every (workload, backend) pair; returns all measurements.
    ``pool``: a worker pool to reuse (left open); by default one is started and closed."""
    from korch.ir.text import print_graph

    t0 = time.perf_counter()
    stats = ProfileStats()
    results: dict[tuple[str, str], Measurement] = {}
    jobs: list[Job] = []
    meta: dict[tuple[str, str], tuple[str, str]] = {}
    versions = {b: versions_of(b) for w in workloads for b in w.backends}
    for w in workloads:
        for b in w.backends:
            stats.requested += 1
            key = (w.hash, b)
            m = db.lookup(w.hash, target, b, w.config, versions[b])
            if m is not None:
                results[key] = m
                stats.cached += 1
                continue
            db.add_workload(w.hash, w.kind, len(w.kgraph.compute_ids()), print_graph(w.kgraph))
            meta[key] = (w.config, versions[b])
            jobs.append(Job(key, b, w.kgraph, w.consts, w.tile_config if b == "tvm" else None))
    if jobs:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(jobs), desc="profile", unit="kernel", dynamic_ncols=True)

        def on_result(r: JobResult) -> None:
            config, ver = meta[r.key]
            m = Measurement(r.key[0], target, r.key[1], config, ver, r.status, r.median_us, r.times_us, r.error, r.host)
            m = db.record(m)  # committed at once: nothing measured is lost; the row that stands
            results[r.key] = m
            stats.measured += 1
            stats.failed += not m.ok
            if bar is not None:
                bar.update(1)

        own = pool is None
        if pool is None:
            pool = WorkerPool(
                settings.num_threads,
                (settings.warmup, settings.repeat, settings.min_repeat_ms),
                settings.kernel_timeout_s,
            )
        if pool.memory_mb is None:
            pool.memory_mb = settings.kernel_memory_mb
        try:
            tracker = settings.tracker
            if tracker:  # TVM kernels on RPC servers, the rest here (Note [Distributed measurement])
                from korch.profile.rpc import RpcMeasurer

                remote = [j for j in jobs if j.backend == "tvm"]
                pool.run([j for j in jobs if j.backend != "tvm"], on_result)
                timing = (settings.warmup, settings.repeat, settings.min_repeat_ms)
                RpcMeasurer(tracker, settings.rpc_key, pool, timing, settings.kernel_timeout_s).run(remote, on_result)
            else:
                pool.run(jobs, on_result)
        finally:
            if own:
                pool.close()
            if bar is not None:
                bar.close()
    stats.seconds = time.perf_counter() - t0
    return results, stats
