"""One typed settings object, overridable from the CLI and patched in tests."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


def _default_db() -> str:
    return os.environ.get("KORCH_DB", str(Path.home() / ".cache" / "korch" / "results.db"))


def _default_kernel_memory_mb() -> float:
    """Half the machine's memory, at least 4 GiB: a batch-16 Segformer's decoder
    kernels need more than 4 GiB resident to be measured (every candidate writing its
    1 GB concat was killed at a 4 GiB limit, so none could run), and the limit is
    there to keep a runaway kernel from exhausting the machine, not to fail big ones."""
    try:
        import psutil

        return max(4096.0, psutil.virtual_memory().total / 2**21)
    except Exception:  # noqa: BLE001 - no psutil reading: the old fixed limit
        return 4096.0


@dataclasses.dataclass(frozen=True)
class Settings:
    target: str = "cpu"  # "cpu" (tvm, onnxruntime, numpy, torch) or "cuda" (triton, torch_cuda, onnxruntime)
    # cuda target: replay the executable as one captured CUDA graph where every kernel runs
    # on the device and the replay is not slower than the step loop (Note [CUDA graph
    # choice] in korch.executable.device); False: always the step loop
    cuda_graph: bool = True
    # cpu target: run consecutive generated and native linear kernels as one native
    # segment each (Note [Native segment] in korch.kernels.native.segment); needs a C++
    # compiler, and is skipped (recorded) without one
    native: bool = True
    db_path: str = dataclasses.field(default_factory=_default_db)
    # rewrites (korch.rewrite, Note [Rewrite search]): on by default; the search's time
    # counts in every optimize, so its limit stays a few seconds per model
    rewrite: bool = True
    rewrite_budget: int = 100
    # stop after this many search steps without a better graph (deterministic, unlike
    # the time limit, which is a safety net: Note [Rewrite search])
    rewrite_patience: int = 10
    rewrite_time_limit_s: float = 5.0
    # partitioning: the most execution states one partition may have
    max_states: int = 400
    # kernel identification: the most primitives in one candidate kernel
    max_kernel_size: int = 24
    # whole-library candidates (Note [Library regions]): each partition and its halves,
    # quarters ... as one onnxruntime kernel, to this many levels; 0 turns them off
    library_regions: int = 3
    # end-to-end plan check (Note [End-to-end plan check] in plans.py): the BLP again
    # with region costs times each factor, every distinct plan built and timed; () is off
    region_bias: tuple[float, ...] = (0.7, 0.4)
    # ... and the whole graph as one onnxruntime kernel among the plans, kept unless a
    # composed plan beats it (Note [Keeping a plan over the baseline]); False races the
    # composed plans only (benchmarks/tiling_integration.py guided --plan-check composed)
    whole_plans: bool = True
    # ... and, with whole_plans, the model and korch's graph as one OpenVINO kernel each
    # (Note [OpenVINO as a library]), kept only if faster than onnxruntime's by every measure
    openvino_plans: bool = True
    # ... and the BLP again on the costs its plan's kernels show in place, this many times
    in_place_rounds: int = 2
    # profiling
    warmup: int = 3
    repeat: int = 15
    min_repeat_ms: float = 2.0
    kernel_timeout_s: float = 60.0
    # resident-memory limit of a measurement worker (Note [Measurement isolation])
    kernel_memory_mb: float = dataclasses.field(default_factory=_default_kernel_memory_mb)
    # distributed measurement (docs/distributed.md): TVM kernels timed on RPC servers
    # obtained from this tracker ("host:port") under this key; "" measures locally
    tracker: str = ""
    rpc_key: str = ""
    # model-guided profiling (Note [Model-guided profiling]): measure what the BLP on
    # predicted costs picks and its near rivals, not every candidate
    guided_profiling: bool = True
    guided_rival_factor: float = 1.5
    guided_rivals: int = 0
    guided_optimism: float = 1.0
    # a partition whose optimistic plan is within this share of its measured-only plan
    # measures nothing more (Note [Guided tolerance])
    guided_tolerance: float = 0.03
    # after this many seconds of profiling the guided rounds turn pessimistic (Note
    # [Model-guided profiling]) and converge on what is measured; 0: no budget
    profile_budget_s: float = 240.0
    # once this share of the candidates is measured the guided rounds turn pessimistic
    # too (Note [Measurement share budget]); 0: no budget
    guided_share_budget: float = 0.15
    # a measured kernel within this share of displacing the plan's choice is measured
    # once more, and so is what it would displace; each keeps the faster of its two
    # medians (Note [Confirming near ties]); 0: off
    confirm_margin: float = 0.25
    # end to end, time the executable with num_threads and with 1 thread and keep the
    # faster (Note [Runtime threads]); cpu target only
    choose_threads: bool = True
    guided_linear: bool = True  # linear kernels guided by a roofline estimate, not all measured
    # tile configs of generated kernels: "model" (the tiling model's) or "rule"; "model" by
    # measurement (benchmarks/RESULTS.md, Auto tiling: 24 kernels of four test models on a
    # quiet machine, the model's configs within 90% of the grid's best on 18, the rule's on 9)
    tile_configs: str = "model"
    # orchestration
    blp_time_limit_s: float = 60.0
    # threads used by every backend (and the onnxruntime baseline)
    num_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    progress: bool = True

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)
