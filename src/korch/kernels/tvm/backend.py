"""The TVM backend: memory-bound candidate kernels -> one scheduled TensorIR function each,
compiled by LLVM for the host CPU.

Pipeline per kernel: ``tvm_lower.lower`` (TE -> PrimFunc), ``tvm_schedule.schedule`` with a
``TileConfig`` (default: ``tvm_tiling.default_tile_config``), ``tvm.compile``.
``build_many`` puts many kernels in one IRModule and compiles it once: LLVM's fixed
cost per ``tvm.compile`` call dominates small kernels.

Note [TVM buffer alignment]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
TVM assumes every buffer argument is 64-byte aligned and emits aligned vector loads,
so a misaligned numpy array crashes the process. ``TvmKernel.__call__`` copies a
misaligned (or non-contiguous, or wrongly typed) input into an aligned staging array
it owns; callers that care about that copy allocate inputs with ``korch.kernels.base.aligned_empty``.
Outputs are fresh aligned arrays on every call, never overwritten by a later call.

Threads: TVM's runtime pool reads ``TVM_NUM_THREADS`` when it starts; this module sets
it (if unset) from the first ``num_threads`` it is given, and later calls reconfigure
the pool when the count changes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp
from korch.kernels.base import ALIGN, Backend, CompiledKernel, aligned_copy, buffer_address, register
from korch.kernels.tvm.tiling import TileConfig, default_tile_config

_state: dict[str, Any] = {"threads": None}


def import_tvm():
    # Note [No spinning thread pools]: kernels of several libraries alternate on 2 cores;
    # a pool that spins after its call steals the core the next library needs (measured:
    # an MLP block took 44 ms with TVM's default spin, 0.56 ms without).
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    if "TVM_NUM_THREADS" not in os.environ and _state["threads"] is not None:
        os.environ["TVM_NUM_THREADS"] = str(_state["threads"])
    import tvm

    return tvm


def set_tvm_threads(num_threads: int) -> None:
    num_threads = max(1, int(num_threads))
    if _state["threads"] is None:
        _state["threads"] = num_threads
        os.environ.setdefault("TVM_NUM_THREADS", str(num_threads))
        return
    if _state["threads"] != num_threads:
        tvm = import_tvm()
        tvm.get_global_func("runtime.config_threadpool")(1, num_threads)
        _state["threads"] = num_threads


def _from_dlpack(a: np.ndarray):
    import tvm_ffi

    # no alignment check here (its failure raises, which costs ~60 us); callers check
    return tvm_ffi.from_dlpack(a, require_alignment=0, require_contiguous=True)


_HOST: dict[int, Any] = {}

# Bumped when the generated code changes, so that kernels measured before are measured
# again (their version is part of a measurement's key). 2: Note [Coalesced axes]; 3: Note
# [Ragged rows] (schedule.py).
GENERATOR_REVISION = 3


def host_target(num_threads: int):
    """The LLVM target of this machine's CPU (``mcpu`` detected by LLVM)."""
    if num_threads not in _HOST:
        tvm = import_tvm()
        from tvm.target import codegen

        cpu = codegen.llvm_get_system_cpu()
        _HOST[num_threads] = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": int(num_threads)})
    return _HOST[num_threads]


def vector_bytes() -> int:
    """SIMD register width of the host in bytes (64 AVX-512, 32 AVX2, else 16)."""
    if "vb" not in _state:
        from tvm.target import codegen

        feats = {str(f) for f in codegen.llvm_get_cpu_features(host_target(1))}
        _state["vb"] = 64 if "avx512f" in feats else 32 if "avx" in feats else 16
    return _state["vb"]


def output_layout(specs: Sequence[tuple[Sequence[int], Any]]) -> tuple[tuple, int]:
    """Outputs ``(shape, dtype)`` laid out in one allocation, each ALIGN-byte aligned:
    ((shape, dtype, byte offset, bytes) per output, total bytes), for ``carve_outputs``."""
    out, total = [], 0
    for shape, dtype in specs:
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        out.append((tuple(shape), dt, total, nbytes))
        total += -(-max(1, nbytes) // ALIGN) * ALIGN
    return tuple(out), total


def carve_outputs(layout: tuple, total: int) -> list[np.ndarray]:
    """Arrays for ``output_layout``'s outputs, carved out of one aligned allocation
    (one ``np.empty`` a call, where ``aligned_empty`` per output cost ~5 us)."""
    buf = np.empty(total + ALIGN, dtype=np.uint8)
    base = (-buffer_address(buf)) % ALIGN
    return [buf[base + off : base + off + nb].view(dt).reshape(sh) for sh, dt, off, nb in layout]


def staged_arg(x: np.ndarray, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """``x`` as generated code takes it (``shape``, dtype ``dt``): the array itself when
    it already is C-ordered, ALIGN-byte aligned, writable and of that dtype, else an
    aligned staging copy (Note [TVM buffer alignment])."""
    a = x if type(x) is np.ndarray else np.asarray(x)
    if a.shape != shape:
        a = a.reshape(shape)
    if (
        a.dtype != dt
        or not a.flags.c_contiguous
        or not a.flags.writeable  # DLPack refuses read-only arrays
        or buffer_address(a) % ALIGN
    ):
        a = aligned_copy(np.asarray(a, dtype=dt, order="C"))
    return a


@dataclasses.dataclass(frozen=True)
class _Spec:
    shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass
class Prepared:
    """A kernel lowered and scheduled, ready to compile (exposed for tests and tiling)."""

    func: Any  # tirx.PrimFunc
    inputs: list[_Spec]
    outputs: list[_Spec]
    hidden: list[np.ndarray]
    config: TileConfig
    report: Any  # tvm_schedule.ScheduleReport
    # the generated function's shapes of the inputs then outputs, when they are the
    # coalesced ones (Note [Coalesced axes]); None: the interface shapes
    call_shapes: list[tuple[int, ...]] | None = None


def prepare(kgraph: Graph, num_threads: int, config: TileConfig | None = None, coalesce_axes: bool = True) -> Prepared:
    """Lower and schedule ``kgraph`` (an extracted memory-bound kernel); ``coalesce_axes``
    False keeps its axes as they are (Note [Coalesced axes]; for benchmarks)."""
    from korch.kernels.tvm.coalesce import coalesce
    from korch.kernels.tvm.lower import lower
    from korch.kernels.tvm.schedule import schedule

    if config is None:
        config = default_tile_config(kgraph, num_threads, vector_bytes())
    co = coalesce(kgraph, config.parallel_axes, config.inner_tile, config.vector_width) if coalesce_axes else None
    g, cfg = (
        (kgraph, config)
        if co is None
        else (co.graph, dataclasses.replace(config, parallel_axes=co.parallel_axes, inner_tile=co.inner_tile))
    )
    lw = lower(g)
    func, report = schedule(lw.func, g, cfg, lw.block_of, lw.copies)
    ins = [_Spec(kgraph.nodes[kgraph.inputs[n]].shape, kgraph.nodes[kgraph.inputs[n]].dtype) for n in lw.input_names]
    outs = [
        _Spec(kgraph.nodes[kgraph.outputs[n]].shape, kgraph.nodes[kgraph.outputs[n]].dtype) for n in lw.output_names
    ]
    call = None
    if co is not None:
        call = [g.nodes[g.inputs[n]].shape for n in lw.input_names] + [
            g.nodes[g.outputs[n]].shape for n in lw.output_names
        ]
    return Prepared(func, ins, outs, [aligned_copy(h) for h in lw.hidden], config, report, call)


# (id(library), folder) -> (library, file name) of libraries already exported by save()
_EXPORTED: dict[tuple[int, str], tuple[Any, str]] = {}


class TvmKernel(CompiledKernel):
    backend = "tvm"

    def __init__(
        self,
        lib: Any,
        symbol: str,
        inputs: list[_Spec],
        outputs: list[_Spec],
        hidden: list[np.ndarray],
        meta: dict,
        call_shapes: Sequence[Sequence[int]] | None = None,
    ):
        self.lib = lib
        self.symbol = symbol
        self.func = lib[symbol]
        self.inputs = inputs
        self.outputs = outputs
        self.hidden = hidden
        self.meta = meta
        self._in_dtypes = [np.dtype(s.dtype) for s in inputs]
        self._out_layout = output_layout([(s.shape, s.dtype) for s in outputs])
        self.hidden = [_from_dlpack(h) for h in hidden]
        self._hidden_np = hidden
        self.prim_func: Any = None  # the scheduled PrimFunc when built in this process
        # Note [Coalesced axes]: the function's shapes, inputs then outputs (None: as above)
        self.call_shapes = [tuple(s) for s in call_shapes] if call_shapes is not None else None
        self._in_call = [s.shape for s in inputs] if call_shapes is None else self.call_shapes[: len(inputs)]
        self._out_call = None if call_shapes is None else self.call_shapes[len(inputs) :]

    def call_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of the function's inputs then outputs, as it is called."""
        shapes = self.call_shapes or [s.shape for s in (*self.inputs, *self.outputs)]
        return [(tuple(sh), str(s.dtype)) for sh, s in zip(shapes, (*self.inputs, *self.outputs))]

    def arg(self, i: int, x: np.ndarray) -> np.ndarray:
        """Input ``i`` as the generated code takes it: the array itself when it already
        is C-ordered, ALIGN-byte aligned, writable and of the right dtype, else an
        aligned staging copy (Note [TVM buffer alignment])."""
        return staged_arg(x, self._in_call[i], self._in_dtypes[i])

    def run_into(self, args: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """Run on ``args`` (as ``arg`` returns them) writing ``outs`` (aligned, C order,
        the output specs' shapes and dtypes): the executable's planned path, no checks."""
        if self._out_call is not None:  # the executable's arrays have the interface's shapes
            args = [a.reshape(s) for a, s in zip(args, self._in_call)]
            outs = [o.reshape(s) for o, s in zip(outs, self._out_call)]
        self.func(*args, *outs, *self.hidden)

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        # Note [Kernel call overhead]: numpy arrays go to the TVM function as they are
        # (tvm_ffi takes them through __dlpack__, ~0.6 us an argument); what the
        # generated code assumes (C order, ALIGN-byte data, writable for DLPack) is
        # checked with flag reads and ``buffer_address``. Converting each array to a tvm
        # Tensor first, as before, cost ~10 us more per call on a 3-argument kernel.
        # The executable skips both the checks and the output allocation where its
        # memory plan allows (Note [Static memory plan] in korch/executable).
        args = [self.arg(i, x) for i, x in enumerate(inputs)]
        outs = carve_outputs(*self._out_layout)
        self.run_into(args, outs)
        return outs

    def set_threads(self, num_threads: int) -> None:
        set_tvm_threads(num_threads)  # TVM's pool is per process

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # Kernels built together by build_many share one library: export it once per
        # folder, not once per kernel (each export links the whole library).
        key = (id(self.lib), str(directory.resolve()))
        hit = _EXPORTED.get(key)
        if hit is not None and hit[0] is self.lib and (directory / hit[1]).exists():
            lib_name = hit[1]
        else:
            lib_name = f"{stem}.so"
            self.lib.export_library(str(directory / lib_name))
            if len(_EXPORTED) > 256:
                _EXPORTED.clear()
            _EXPORTED[key] = (self.lib, lib_name)
        hidden_names = []
        for i, h in enumerate(self._hidden_np):
            name = f"{stem}.hidden{i}.npy"
            np.save(directory / name, h)
            hidden_names.append(name)
        return {
            "backend": "tvm",
            "library": lib_name,
            "symbol": self.symbol,
            "inputs": [[list(s.shape), s.dtype] for s in self.inputs],
            "outputs": [[list(s.shape), s.dtype] for s in self.outputs],
            "hidden": hidden_names,
            "call_shapes": self.call_shapes,
            "tile_config": json.loads(json.dumps(dataclasses.asdict(self.meta["config"])))
            if "config" in self.meta
            else None,
            "tvm_version": TvmBackend().version(),
        }


def _kernel(lib, symbol: str, prep: Prepared, build_s: float) -> TvmKernel:
    k = TvmKernel(
        lib,
        symbol,
        prep.inputs,
        prep.outputs,
        prep.hidden,
        {"config": prep.config, "report": prep.report, "build_s": build_s},
        prep.call_shapes,
    )
    k.prim_func = prep.func  # for a native segment (Note [Native segment]); not saved
    return k


class TvmBackend(Backend):
    name = "tvm"
    kinds = frozenset({"memory"})

    def supports(self, kgraph: Graph) -> bool:
        from korch.kernels.tvm.lower import unsupported_reason

        if any(n.op not in GroupOp.MEMORY_BOUND and n.op not in GroupOp.SOURCE for n in kgraph.nodes):
            return False
        return unsupported_reason(kgraph) is None

    def build(
        self,
        kgraph: Graph,
        consts: dict[str, np.ndarray],
        num_threads: int,
        tile_config: TileConfig | None = None,
    ) -> TvmKernel:
        """Compile one kernel. ``consts`` are not baked in: constant inputs (``in{i}_c``)
        are passed at call time like any input."""
        set_tvm_threads(num_threads)
        tvm = import_tvm()
        t0 = time.perf_counter()
        prep = prepare(kgraph, num_threads, tile_config)
        symbol = "korch_kernel"
        mod = tvm.IRModule({symbol: prep.func.with_attr("global_symbol", symbol)})
        lib = tvm.compile(mod, target=host_target(num_threads))
        return _kernel(lib, symbol, prep, time.perf_counter() - t0)

    def build_many(
        self,
        items: Sequence[tuple[Graph, dict[str, np.ndarray]]],
        num_threads: int,
        tile_configs: Sequence[TileConfig | None] | None = None,
    ) -> list[CompiledKernel | Exception]:
        """Compile all kernels in one IRModule (one LLVM invocation). A kernel that fails
        to lower is returned as its exception; if the joint compile fails, each kernel
        is compiled alone so that only the bad ones fail."""
        set_tvm_threads(num_threads)
        tvm = import_tvm()
        t0 = time.perf_counter()
        preps: list[Prepared | Exception] = []
        for i, (kgraph, _) in enumerate(items):
            cfg = tile_configs[i] if tile_configs is not None else None
            try:
                preps.append(prepare(kgraph, num_threads, cfg))
            except Exception as e:  # noqa: BLE001 - a failed build is a recorded result
                preps.append(e)
        funcs = {
            f"korch_k{i}": p.func.with_attr("global_symbol", f"korch_k{i}")
            for i, p in enumerate(preps)
            if isinstance(p, Prepared)
        }
        if not funcs:
            return list(preps)  # type: ignore[arg-type]
        try:
            lib = tvm.compile(tvm.IRModule(funcs), target=host_target(num_threads))
        except Exception:  # noqa: BLE001 - isolate the kernel that breaks the joint build
            return [p if isinstance(p, Exception) else self._build_prepared(p, num_threads) for p in preps]
        per = (time.perf_counter() - t0) / max(1, len(funcs))
        return [p if isinstance(p, Exception) else _kernel(lib, f"korch_k{i}", p, per) for i, p in enumerate(preps)]

    def _build_prepared(self, prep: Prepared, num_threads: int) -> CompiledKernel | Exception:
        tvm = import_tvm()
        try:
            mod = tvm.IRModule({"korch_kernel": prep.func.with_attr("global_symbol", "korch_kernel")})
            lib = tvm.compile(mod, target=host_target(num_threads))
        except Exception as e:  # noqa: BLE001
            return e
        return _kernel(lib, "korch_kernel", prep, 0.0)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> TvmKernel:
        set_tvm_threads(num_threads)
        tvm = import_tvm()
        directory = Path(directory)
        lib = tvm.runtime.load_module(str(directory / meta["library"]))
        ins = [_Spec(tuple(s), d) for s, d in meta["inputs"]]
        outs = [_Spec(tuple(s), d) for s, d in meta["outputs"]]
        hidden = [aligned_copy(np.load(directory / h)) for h in meta["hidden"]]
        return TvmKernel(lib, meta["symbol"], ins, outs, hidden, {}, meta.get("call_shapes"))

    def version(self) -> str:
        import tvm

        return f"tvm-{tvm.__version__}; generator {GENERATOR_REVISION}"


register(TvmBackend())
