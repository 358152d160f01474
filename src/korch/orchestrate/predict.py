"""The tiling model's predictions of generated kernels, for model-guided profiling
(Note [Model-guided profiling] in guided.py): each kernel's tile config and predicted
latency, in parallel processes for large models (Note [Parallel prediction])."""

from __future__ import annotations

import math
from typing import Any

from korch.ir.graph import Graph


def _tile_and_predict(kgraph: Graph, settings, vector_bytes: int) -> tuple[Any, float | None]:
    """(tile config, predicted latency in us or None) of a generated kernel."""
    from korch.kernels.tvm.tiling import default_tile_config, model_tile_config

    try:
        cfg, sol = model_tile_config(kgraph, settings.num_threads, vector_bytes, "cpu")
    except Exception:  # noqa: BLE001 - a kernel the model cannot handle: rule config, measured
        return default_tile_config(kgraph, settings.num_threads, vector_bytes), None
    pred = sol.time_us if sol is not None and math.isfinite(sol.time_us) else None
    if settings.tile_configs != "model" or sol is None:
        cfg = default_tile_config(kgraph, settings.num_threads, vector_bytes)
        if pred is not None and not cfg.parallel and sol.cores > 1:
            # predict the kernel that is built: the rule runs it on one thread
            one = model_tile_config(kgraph, 1, vector_bytes, "cpu")[1]
            pred = one.time_us if one is not None and math.isfinite(one.time_us) else pred
    return cfg, pred


# Note [Parallel prediction]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# Predicting is pure Python, one kernel at a time (about 10 ms each), and nothing
# else runs while it does: segformer_b16's 11,000 generated kernels took 151 s of a
# 634 s optimize on 2 cores. Past ``PARALLEL_PREDICTION_MIN`` kernels they are
# predicted in chunks by spawned processes, one per thread korch was given; the
# results are the same values in the same order (the prediction is a function of
# the kernel and the settings). A process costs a few seconds to start (it imports
# korch), hence the threshold; a pool that cannot start falls back to this process.
PARALLEL_PREDICTION_MIN = 1500
_PREDICTION_CHUNK = 128


def _tile_or_skip(kgraph: Graph, settings, vb: int) -> tuple[Any, float | None]:
    """``_tile_and_predict``, or (a ``Skipped``, None) when no tile config can be made
    (Note [Skipped optimizations]; a value, not a record: this may run in a spawned
    process, and the pipeline's process records it)."""
    from korch.diagnostics import Skipped
    from korch.errors import KorchError

    try:
        return _tile_and_predict(kgraph, settings, vb)
    except KorchError:
        raise
    except Exception as e:  # noqa: BLE001
        return Skipped("tiling", "", type(e).__name__, str(e).strip()[:500]), None


def _predict_chunk(args) -> list[tuple[Any, float | None]]:
    kgraphs, settings, vb = args
    return [_tile_or_skip(g, settings, vb) for g in kgraphs]


def predict_all(kgraphs: list[Graph], settings, vb: int, workers: int | None = None) -> list[tuple[Any, float | None]]:
    """``_tile_and_predict`` of every kernel, in order (Note [Parallel prediction])."""
    import logging

    n = max(1, int(settings.num_threads if workers is None else workers))
    if n == 1 or (workers is None and len(kgraphs) < PARALLEL_PREDICTION_MIN):
        return _predict_chunk((kgraphs, settings, vb))
    import concurrent.futures
    import multiprocessing

    chunks = [(kgraphs[i : i + _PREDICTION_CHUNK], settings, vb) for i in range(0, len(kgraphs), _PREDICTION_CHUNK)]
    try:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx) as pool:
            return [r for part in pool.map(_predict_chunk, chunks) for r in part]
    except Exception as e:  # noqa: BLE001 - a pool that cannot start or breaks: predict here
        logging.getLogger("korch").info("parallel prediction failed (%s); predicting in this process", e)
        return _predict_chunk((kgraphs, settings, vb))
