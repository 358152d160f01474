"""Targets as data: buffer levels, cores, pipes and their cost formulas.

Note [Target cost formulas]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
Every target is described the way GE's auto tiling describes Ascend (DESIGN.md, "Auto
tiling"), so one model and one set of solvers serve all three:

* buffer levels: GM plus local levels with a capacity, an allocation alignment and a
  reserve; only levels with ``role="local"`` constrain the tiling (on the CPU the L1
  is listed for information, the tile working set is kept in the per-core L2);
* a transfer pipe (``load`` = GM -> local, ``store`` = local -> GM) costs, per call
  moving S bytes, ``S / T + per_call`` time units where the per-core bandwidth is
  ``T = a + b / cores`` (more cores share the memory system), with a separate
  (a, b) below ``threshold`` bytes (small transfers), and a head (start-up) cost
  ``h_a * cores + h_b``, also piecewise;
* the vector pipe costs ``per_elem * n + per_call`` per API call on n elements of
  float32 (other dtypes scale ``per_elem`` by itemsize / 4, as fp16 Add does on A2),
  plus a head;
* kernel time = max over pipes of (pipe time + its head), widened by
  ``(1 - overlap) * (sum - max)`` where pipes overlap imperfectly (a CPU core issues
  loads and arithmetic from one instruction stream), plus the launch overhead:
  ``launch + per_arg * tensors`` per launch (the host call and its argument
  handling), and ``fork_join`` per launch that uses more than one core (waking the
  thread pool and joining it: on the CPU this is what makes a small kernel slower
  on two cores than on one).

Note [Parallel margin]
~~~~~~~~~~~~~~~~~~~~~~
A solution that uses several cores is kept only when the model predicts it at least
``parallel_margin`` faster than the same tiles on one core; otherwise the kernel runs
on one core. On the CPU the margin is 0.15: on this project's 2-core VM (
``benchmarks/tiling_integration.py grid --verbose``) fused row kernels of 20-50 us
ran 1.3-1.6x *slower* on two threads than on one, where the model, with calibrated
pipes and fork-join, predicted a 2-6% gain: two threads share one memory system, a
row loop with intermediates scales worse than the flat kernels the fork-join probe
runs, and TVM's pool does not spin (korch/__init__.py). The one grid kernel whose
split the model priced 36% faster (a GELU over 64K elements) ran 1.5x faster on two
threads and keeps them. Ascend and the GPU have no margin.

Time units are target-specific (cycles on Ascend, ns on CPU and GPU); ``unit_us``
converts. Ascend A2 numbers are GE's published ones; the ones GE does not publish
(MTE3 per-call cost, vector APIs other than Add) are marked as assumptions.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class BufferLevel:
    name: str
    capacity: int  # bytes
    alignment: int  # bytes; every allocation is rounded up to a multiple
    reserve: int = 0  # bytes kept back (stack, scalars, the compiler's own buffers)
    role: str = "local"  # "gm", "local" (constrains tiling) or "cache" (informational)

    @property
    def usable(self) -> int:
        return self.capacity - self.reserve


@dataclasses.dataclass(frozen=True)
class Bandwidth:
    """Per-core bytes per time unit when ``cores`` cores transfer at once: a + b/cores."""

    a: float
    b: float

    def per_core(self, cores: float) -> float:
        return self.a + self.b / cores


@dataclasses.dataclass(frozen=True)
class TransferPipe:
    name: str
    large: Bandwidth
    small: Bandwidth
    threshold: float  # bytes per call; below it ``small`` applies
    per_call: float
    head_large: tuple[float, float]  # (per core, constant)
    head_small: tuple[float, float]

    def call_cost(self, nbytes: float, cores: float) -> float:
        bw = self.large if nbytes >= self.threshold else self.small
        return nbytes / bw.per_core(cores) + self.per_call

    def head(self, nbytes: float, cores: float) -> float:
        h = self.head_large if nbytes >= self.threshold else self.head_small
        return h[0] * cores + h[1]


@dataclasses.dataclass(frozen=True)
class VecPipe:
    name: str
    apis: tuple[tuple[str, float, float], ...]  # (api, per element fp32, per call)
    head: float

    def coef(self, api: str, itemsize: int = 4) -> tuple[float, float]:
        table = {a: (pe, pc) for a, pe, pc in self.apis}
        pe, pc = table.get(api, table["default"])
        return pe * itemsize / 4.0, pc


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    cores: int
    levels: tuple[BufferLevel, ...]
    load: TransferPipe
    store: TransferPipe
    vec: VecPipe
    vector_bytes: int  # innermost tile alignment (a vector register / a UB block)
    unit_us: float  # microseconds per time unit
    launch: float  # time units per kernel launch
    overlap: float = 1.0  # 1: pipes overlap perfectly (time = bottleneck pipe)
    source: str = "defaults"  # "defaults", "published" or the calibration file
    per_arg: float = 0.0  # time units per tensor argument (input or output) per launch
    fork_join: float = 0.0  # time units per launch on more than one core
    parallel_margin: float = 0.0  # Note [Parallel margin]

    @property
    def local_levels(self) -> tuple[BufferLevel, ...]:
        return tuple(lv for lv in self.levels if lv.role == "local")

    def replace(self, **changes) -> Target:
        return dataclasses.replace(self, **changes)


# API names the vector pipe knows; describe.py maps primitives onto them.
VEC_APIS = (
    "default",
    "add",
    "mul",
    "div",
    "exp",
    "log",
    "sqrt",
    "tanh",
    "erf",
    "sigmoid",
    "reduce",
    "broadcast",
    "copy",
    "transpose",
    "cast",
    "compare",
    "select",
    "pad",
    "pad_reflect",
    "gather",
)


def _ascend_a2() -> Target:
    add = 0.0206  # fp32 Add, cycles per element (GE); others are assumptions scaled from it
    vec = VecPipe(
        "vec",
        apis=(
            ("default", add, 23.22),
            ("add", add, 23.22),
            ("mul", add, 23.22),
            ("compare", add, 23.22),
            ("select", add, 23.22),
            ("copy", add, 23.22),
            ("broadcast", add, 23.22),
            ("cast", add, 23.22),
            ("reduce", add * 1.5, 40.0),
            ("div", add * 2, 23.22),
            ("sqrt", add * 2, 23.22),
            ("exp", add * 3, 30.0),
            ("log", add * 3, 30.0),
            ("tanh", add * 4, 30.0),
            ("sigmoid", add * 4, 30.0),
            ("erf", add * 5, 30.0),
            ("transpose", add * 2, 40.0),
        ),
        head=37.37,
    )
    return Target(
        name="ascend-a2",
        cores=48,
        levels=(
            BufferLevel("gm", 64 << 30, 512, role="gm"),
            BufferLevel("ub", 196_352, 32),
        ),
        load=TransferPipe(
            "mte2",
            large=Bandwidth(9.9074, 15.896),
            small=Bandwidth(7.9052, 7.31),
            threshold=25_000,
            per_call=27.01,
            head_large=(32.72, 1575.0),
            head_small=(15.89, 882.0),
        ),
        store=TransferPipe(
            "mte3",
            large=Bandwidth(9.96, 3.79),
            small=Bandwidth(9.96, 3.79),
            threshold=0,
            per_call=27.01,  # assumption: GE publishes MTE2's only
            head_large=(0.0, 497.36),
            head_small=(0.0, 497.36),
        ),
        vec=vec,
        vector_bytes=32,
        unit_us=1.0 / 1800.0,  # 1.8 GHz AI core clock
        launch=0.0,  # GE's model has no launch term; the heads are the start-up
        source="published",
    )


def _cuda() -> Target:
    # H200-like datasheet values, in ns: HBM3e 4.8 TB/s = 4800 B/ns across 132 SMs.
    fp32 = 1.0 / 256.0  # 128 FP32 lanes x ~2 GHz per SM
    vec = VecPipe(
        "vec",
        apis=(
            ("default", fp32, 10.0),
            ("add", fp32, 10.0),
            ("mul", fp32, 10.0),
            ("div", fp32 * 4, 10.0),
            ("exp", fp32 * 4, 10.0),
            ("log", fp32 * 4, 10.0),
            ("sqrt", fp32 * 4, 10.0),
            ("tanh", fp32 * 4, 10.0),
            ("sigmoid", fp32 * 5, 10.0),
            ("erf", fp32 * 6, 10.0),
            ("reduce", fp32 * 2, 40.0),
            ("transpose", fp32 * 2, 20.0),
            ("copy", fp32, 10.0),
            ("broadcast", fp32, 10.0),
        ),
        head=200.0,
    )
    return Target(
        name="cuda",
        cores=132,
        levels=(
            BufferLevel("gm", 141 << 30, 128, role="gm"),
            BufferLevel("smem", 228 << 10, 128, reserve=1 << 10),
            BufferLevel("regs", 256 << 10, 4, role="cache"),
        ),
        load=TransferPipe(
            "load", Bandwidth(28.0, 100.0), Bandwidth(14.0, 50.0), 4096, 400.0, (0.0, 800.0), (0.0, 800.0)
        ),
        store=TransferPipe(
            "store", Bandwidth(28.0, 100.0), Bandwidth(14.0, 50.0), 4096, 200.0, (0.0, 400.0), (0.0, 400.0)
        ),
        vec=vec,
        vector_bytes=128,  # a warp-wide coalesced fp32 access
        unit_us=1e-3,
        launch=3000.0,
    )


def _cpu_defaults() -> Target:
    # ns per element and per call of generated kernels on this project's 2-core AVX-512
    # VM; ``calibrate`` replaces them with the machine's own
    vec = VecPipe(
        "vec",
        apis=(
            ("default", 0.09, 5.0),
            ("add", 0.09, 5.0),
            ("mul", 0.09, 5.0),
            ("div", 0.09, 5.0),
            ("sqrt", 0.09, 5.0),
            ("exp", 0.37, 5.0),
            ("log", 2.7, 5.0),
            ("tanh", 0.21, 5.0),
            ("sigmoid", 0.55, 5.0),
            ("erf", 0.24, 5.0),
            ("compare", 0.1, 5.0),
            ("select", 0.1, 5.0),
            ("reduce", 0.01, 5.0),
            ("transpose", 1.4, 5.0),
            ("pad", 0.31, 5.0),  # a spatial pad inlined into a copy, per input element
            ("pad_reflect", 0.44, 5.0),  # (measured on this VM later)
            ("gather", 0.22, 5.0),  # a nearest upsample's table gather, per output element
            ("copy", 0.01, 5.0),
            ("broadcast", 0.01, 5.0),
            ("cast", 0.01, 5.0),
        ),
        head=0.0,
    )
    return Target(
        name="cpu",
        cores=2,
        levels=(
            BufferLevel("dram", 16 << 30, 64, role="gm"),
            BufferLevel("l2", 1 << 20, 64, reserve=256 << 10),
            BufferLevel("l1", 48 << 10, 64, role="cache"),
        ),
        # generated kernels on this project's 2-core VM (Note [Calibration]):
        # one thread reads ~33 B/ns and two together no more; stores ~50 B/ns per core
        load=TransferPipe("load", Bandwidth(0.5, 32.0), Bandwidth(0.5, 32.0), 0, 0.0, (1500.0, 0.0), (1500.0, 0.0)),
        store=TransferPipe("store", Bandwidth(50.0, 0.0), Bandwidth(50.0, 0.0), 0, 0.0, (0.0, 0.0), (0.0, 0.0)),
        vec=vec,
        vector_bytes=64,  # 16 fp32 lanes
        unit_us=1e-3,
        overlap=0.5,
        # `python -m korch.tiling.calibrate` measures these on the machine at hand (this
        # VM: ~3.2 us per call and ~1.3 us per argument through TvmKernel,
        # ~13 us to wake and join the second thread with TVM_THREAD_POOL_SPIN_COUNT=0,
        # korch/__init__.py)
        launch=3200.0,
        per_arg=1300.0,
        fork_join=13000.0,
        parallel_margin=0.15,
    )


def calibration_path(target: str = "cpu") -> Path:
    base = Path(os.environ.get("KORCH_CACHE_DIR", str(Path.home() / ".cache" / "korch")))
    return base / f"calibration-{target}.json"


def target_from_dict(d: dict, base: Target) -> Target:
    """``base`` with the fields a calibration file stores replaced."""

    def pipe(p: dict, old: TransferPipe) -> TransferPipe:
        return TransferPipe(
            old.name,
            Bandwidth(*p["large"]),
            Bandwidth(*p.get("small", p["large"])),
            p.get("threshold", old.threshold),
            p["per_call"],
            tuple(p.get("head_large", old.head_large)),  # type: ignore[arg-type]
            tuple(p.get("head_small", old.head_small)),  # type: ignore[arg-type]
        )

    changes: dict = {}
    if "load" in d:
        changes["load"] = pipe(d["load"], base.load)
    if "store" in d:
        changes["store"] = pipe(d["store"], base.store)
    if "vec" in d:
        apis = dict((a, (pe, pc)) for a, pe, pc in base.vec.apis)
        apis.update({a: tuple(v) for a, v in d["vec"].items()})
        changes["vec"] = VecPipe(base.vec.name, tuple((a, pe, pc) for a, (pe, pc) in apis.items()), base.vec.head)
    if "levels" in d:
        levels = []
        for lv in base.levels:
            cap = d["levels"].get(lv.name)
            levels.append(dataclasses.replace(lv, capacity=int(cap)) if cap else lv)
        changes["levels"] = tuple(levels)
    for key in ("cores", "launch", "overlap", "per_arg", "fork_join"):
        if key in d:
            changes[key] = d[key]
    return dataclasses.replace(base, **changes)


def get_target(name: str, calibrated: bool = True) -> Target:
    """The named target; ``cpu``/``cuda`` take a per-machine calibration file if present."""
    if name in ("ascend-a2", "a2", "ascend"):
        return _ascend_a2()
    if name == "cuda":
        base = _cuda()
    elif name == "cpu":
        base = _cpu_defaults()
    else:
        raise KeyError(f"unknown tiling target {name!r} (cpu, cuda, ascend-a2)")
    path = calibration_path(name)
    if calibrated and path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return base
        return dataclasses.replace(target_from_dict(data, base), source=str(path))
    return base


TARGETS = ("cpu", "cuda", "ascend-a2")
