"""One typed settings object, overridable from the CLI and patched in tests."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


def _default_db() -> str:
    return os.environ.get("KORCH_DB", str(Path.home() / ".cache" / "korch" / "results.db"))


@dataclasses.dataclass(frozen=True)
class Settings:
    target: str = "cpu"
    db_path: str = dataclasses.field(default_factory=_default_db)
    # partitioning: the most execution states one partition may have
    max_states: int = 400
    # kernel identification: the most primitives in one candidate kernel
    max_kernel_size: int = 24
    # profiling
    warmup: int = 3
    repeat: int = 15
    min_repeat_ms: float = 2.0
    kernel_timeout_s: float = 60.0
    # orchestration
    blp_time_limit_s: float = 60.0
    # threads used by every backend (and the onnxruntime baseline)
    num_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    debug: bool = False
    progress: bool = True

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)
