"""Native segments: consecutive generated (TVM) and native linear kernels of an
executable, compiled and linked into one shared library that runs them all in one call.

Note [Native segment]
~~~~~~~~~~~~~~~~~~~~~
The executable's Python loop costs 3-14 us a kernel, and TVM's own thread pool takes
turns with the BLAS pool on the same cores (issue 25). A segment removes both for a run
of kernels that korch compiles itself:

- the TVM kernels' scheduled PrimFuncs are compiled together into one object file
  (``tvm.compile`` then the object inside ``export_library``'s tar), and linked with a
  generated C++ driver and korch's runtime (``korch_rt.cc``); the kernels' parallel
  loops reach the runtime's OpenMP pool through their ``__TVMBackendParallelLaunch``
  pointer, which the driver sets, so TVM's runtime is not used (nor loaded) to run them;
- the native linear kernels are the runtime's (``linear.py``), on the same pool;
- every tensor is a slot: a segment input or output is a pointer passed per call,
  a constant (weights, a TVM kernel's hidden array) a pointer bound once at load, an
  intermediate an offset in the segment's own arena (first fit over lifetimes,
  ``korch.executable.plan_arena``); the DLTensors the TVM kernels take are built once.

One call from Python runs the segment (about 1-2 us of ctypes, plus 0.8 us an
argument); between its kernels there is a C++ call through a pointer (tens of ns, a
TVM kernel's argument checks included). ``korch_seg_profile`` turns on per-kernel
timing inside the segment (``korch explain``), off by default.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.kernels.base import Backend, CompiledKernel, aligned_copy, register
from korch.kernels.tvm.backend import buffer_address, output_layout, staged_arg

# what a segment step is, for the driver: ("tvm", symbol, arg slots, arg (shape, dtype)),
# ("linear", code, arg slots), ("view",) (Note [Views in a segment])
_DL_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}


# The function pointers a TVM-compiled object leaves for its runtime to fill (weak
# variables in the object), and the runtime functions a segment fills them with. An
# object asking for another is not linked (``check_hooks``).
# TVM's parallel barrier is not among them (Note [One pool, awake for a segment]).
TVM_HOOKS = {
    "__TVMBackendParallelLaunch": "korch_parallel_launch",
    "__TVMBackendAllocWorkspace": "korch_workspace_alloc",
    "__TVMBackendFreeWorkspace": "korch_workspace_free",
}


def check_hooks(objects: Sequence[Path]) -> None:
    """Raise when a TVM object needs a runtime hook a segment does not provide."""
    nm = shutil.which("nm")
    if nm is None:
        return  # no binutils: the hooks above are all TVM's CPU code asks for today
    import subprocess

    from korch.kernels.native.toolchain import NativeBuildError

    for obj in objects:
        listing = subprocess.run([nm, str(obj)], capture_output=True, text=True).stdout
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[-2] in ("V", "v", "B", "D") and parts[-1].startswith("__TVM"):
                if parts[-1] not in TVM_HOOKS:
                    raise NativeBuildError(f"TVM object {obj.name} needs runtime hook {parts[-1]}, not provided")


# korch_seg_profile keeps each kernel's time of the last this many calls (medians)
PROFILE_RUNS = 64

# a TVM kernel whose arguments total fewer bytes runs serially in a segment (a memory-
# bound pass over 192 KB takes ~20 us on one core here, about twice a pool wake-up)
SERIAL_BYTES = 192 * 1024


def dl_dtype(dtype: str | np.dtype) -> tuple[int, int]:
    dt = np.dtype(dtype)
    if dt.kind not in _DL_CODES:
        raise ValueError(f"native segment: dtype {dt} has no DLPack code here")
    return _DL_CODES[dt.kind], dt.itemsize * 8


def _c_array(name: str, values: Sequence[int], ctype: str = "int64_t") -> str:
    body = ", ".join(str(int(v)) for v in values) or "0"
    return f"static const {ctype} {name}[] = {{{body}}};\n"


# TVM-generated kernels report a failed argument check through this tvm-ffi call; in a
# segment it must land in korch's runtime. The driver defines it and links with
# -Bsymbolic, so tvm-ffi's own, when the process has it, is not the one bound.
_ERROR_SHIM = """extern "C" void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  std::string msg = kind ? kind : "Error";
  msg += ": ";
  for (int32_t i = 0; i < n; ++i)
    if (parts[i]) msg += parts[i];
  korch_set_error(msg.c_str());
}

// the pool's workers spin while the segment runs (Note [One pool, awake for a segment])
struct Hold {
  Hold() { korch_pool_hold(1); }
  ~Hold() { korch_pool_hold(0); }
};

"""


def driver_source(steps: Sequence[tuple], slots: Sequence[tuple[str, int]], arena_bytes: int) -> str:
    """The C++ driver. ``slots[s]`` is ("io", index) | ("const", index) | ("arena", offset)
    | ("view", slot, byte offset); a step ("view",) runs nothing."""
    out = [
        "// generated by korch/kernels/native/segment.py\n",
        "#include <cstdint>\n#include <ctime>\n#include <dlpack/dlpack.h>\n#include <tvm/ffi/c_api.h>\n",
        '#include <string>\n#include "korch_rt.h"\n\n',
        _ERROR_SHIM,
    ]
    out += [f'extern "C" __attribute__((weak)) void* {v};\n' for v in TVM_HOOKS]
    symbols = sorted({s[1] for s in steps if s[0] == "tvm"})
    for sym in symbols:
        out.append(f'extern "C" int32_t __tvm_ffi_{sym}(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);\n')
    n_dl = sum(len(s[2]) for s in steps if s[0] == "tvm")
    n_lin = sum(1 for s in steps if s[0] == "linear")
    out.append(f"static void* S[{max(1, len(slots))}];\nstatic char* ARENA = nullptr;\n")
    out.append(f"static DLTensor DT[{max(1, n_dl)}];\nstatic TVMFFIAny AA[{max(1, n_dl)}];\n")
    nst = max(1, len(steps))
    out.append(f"static void* LH[{max(1, n_lin)}];\nstatic int64_t PROF_NS[{PROFILE_RUNS} * {nst}];\n")
    out.append("static int PROF = 0;\nstatic int64_t PROF_RUN = 0;\n")
    init, run = [], []
    d = lin = 0
    for i, st in enumerate(steps):
        if st[0] == "view":  # Note [Views in a segment]: its readers read its block
            run.append(f"  // step {i}: a view\n")
        elif st[0] == "tvm":
            _, sym, arg_slots, specs = st
            sets = []
            for j, (slot, (shape, dtype)) in enumerate(zip(arg_slots, specs)):
                out.append(_c_array(f"SH{d + j}", shape))
                code, bits = dl_dtype(dtype)
                init.append(
                    f"  DT[{d + j}] = DLTensor{{nullptr, DLDevice{{kDLCPU, 0}}, {len(shape)}, "
                    f"DLDataType{{{code}, {bits}, 1}}, const_cast<int64_t*>(SH{d + j}), nullptr, 0}};\n"
                    f"  AA[{d + j}].type_index = kTVMFFIDLTensorPtr; AA[{d + j}].zero_padding = 0; "
                    f"AA[{d + j}].v_ptr = &DT[{d + j}];\n"
                )
                sets.append(f"DT[{d + j}].data = S[{slot}];")
            nbytes = sum(math.prod(sh) * np.dtype(dt).itemsize for sh, dt in specs)
            serial = int(nbytes < SERIAL_BYTES)  # Note [Serial small kernels] in korch_rt.cc
            run.append(
                f"  {{ // step {i}: {sym}, {nbytes} bytes\n    {' '.join(sets)}\n"
                f"    TVMFFIAny r; r.type_index = kTVMFFINone; r.zero_padding = 0; r.v_int64 = 0;\n"
                f"    korch_serial({serial});\n"
                f"    const int rc = __tvm_ffi_{sym}(nullptr, AA + {d}, {len(arg_slots)}, &r);\n"
                f"    korch_serial(0);\n    if (rc != 0) return {i + 1};\n  }}\n"
            )
            d += len(arg_slots)
        else:
            _, code, arg_slots = st
            out.append(_c_array(f"LC{lin}", code))
            init.append(f"  LH[{lin}] = korch_linear_create(LC{lin}, {len(code)});\n  if (!LH[{lin}]) return -1;\n")
            ptrs = ", ".join(f"S[{s}]" for s in arg_slots)
            run.append(
                f"  {{ // step {i}: linear\n    void* p[] = {{{ptrs}}};\n"
                f"    if (korch_linear_run(LH[{lin}], p) != 0) return {i + 1};\n  }}\n"
            )
            lin += 1
    io_sets, view_sets = [], []
    for s, (kind, idx, *off) in enumerate(slots):
        if kind == "view":  # a block of another slot (Note [Views in a segment])
            view_sets.append(f"  S[{s}] = (char*)S[{idx}] + {off[0]};\n")
        elif kind == "const":
            init.append(f"  S[{s}] = consts[{idx}];\n")
        elif kind == "arena":
            init.append(f"  S[{s}] = ARENA + {idx};\n")
        else:
            io_sets.append(f"  S[{s}] = io[{idx}];\n")
    out.append(
        "\nstatic inline int64_t now_ns() {\n  timespec t;\n  clock_gettime(CLOCK_MONOTONIC, &t);\n"
        "  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;\n}\n"
    )
    out.append('\nextern "C" int korch_seg_init(void* const* consts) {\n')
    out += [f"  if (&{v}) {v} = (void*)&{fn};\n" for v, fn in TVM_HOOKS.items()]
    out.append(f"  if (!ARENA) ARENA = (char*)korch_aligned_alloc({max(1, arena_bytes)});\n")
    out.append("  if (!ARENA) return -2;\n")
    out.extend(init)
    out.append("  return 0;\n}\n")
    out.append(f'\nextern "C" int korch_seg_steps() {{ return {len(steps)}; }}\n')
    out.append(
        'extern "C" void korch_seg_profile(int on) { PROF = on; PROF_RUN = 0; for (auto& t : PROF_NS) t = 0; }\n'
    )
    out.append('extern "C" const int64_t* korch_seg_profile_ns() { return PROF_NS; }\n')
    out.append('extern "C" int64_t korch_seg_profile_runs() { return PROF_RUN; }\n')
    out.append('\nextern "C" int korch_seg_run(void* const* io) {\n  Hold hold;\n')
    out.extend(io_sets)
    out.extend(view_sets)
    out.append("  int64_t t0 = PROF ? now_ns() : 0;\n")
    for i, r in enumerate(run):
        out.append(r)
        out.append(
            f"  if (PROF) {{ int64_t t1 = now_ns(); PROF_NS[(PROF_RUN % {PROFILE_RUNS}) * {nst} + {i}] = t1 - t0; "
            "t0 = t1; }\n"
        )
    out.append("  if (PROF) ++PROF_RUN;\n  return 0;\n}\n")
    return "".join(out)


def tvm_object(funcs: Mapping[str, Any], num_threads: int, folder: Path) -> list[Path]:
    """Compile the PrimFuncs (symbol -> func) into object files under ``folder``."""
    from korch.kernels.tvm.backend import host_target, import_tvm

    tvm = import_tvm()
    mod = tvm.IRModule({sym: f.with_attr("global_symbol", sym) for sym, f in funcs.items()})
    lib = tvm.compile(mod, target=host_target(num_threads))
    tar = folder / "kernels.tar"
    lib.export_library(str(tar))
    with tarfile.open(tar) as t:
        names = [m.name for m in t.getmembers() if m.name.endswith(".o")]
        t.extractall(folder, members=[t.getmember(n) for n in names], filter="data")
    objects = [folder / n for n in names]
    check_hooks(objects)
    return objects


class NativeSegment(CompiledKernel):
    """A loaded segment library. ``inputs``/``outputs``: specs of the per-call pointers."""

    backend = "native-segment"

    def __init__(self, lib_path: Path, meta: dict[str, Any], consts: Sequence[np.ndarray]):
        from korch.kernels.tvm.backend import _Spec

        self.lib_path = Path(lib_path)
        self.meta = meta
        self.inputs = [_Spec(tuple(s), d) for s, d in meta["inputs"]]
        self.outputs = [_Spec(tuple(s), d) for s, d in meta["outputs"]]
        self._in_dtypes = [np.dtype(s.dtype) for s in self.inputs]
        self._out_layout = output_layout([(s.shape, s.dtype) for s in self.outputs])
        self.consts = [aligned_copy(np.ascontiguousarray(c)) for c in consts]
        from korch.kernels.native.toolchain import load_runtime

        load_runtime()  # the one runtime the segment's libkorch_rt.so.N dependency names
        self._lib = ctypes.CDLL(str(self.lib_path))
        self._lib.korch_seg_run.argtypes = [ctypes.c_void_p]
        self._lib.korch_seg_init.argtypes = [ctypes.c_void_p]
        self._lib.korch_last_error.restype = ctypes.c_char_p
        self._lib.korch_set_threads.argtypes = [ctypes.c_int]
        self._lib.korch_seg_profile_ns.restype = ctypes.POINTER(ctypes.c_int64)
        self._lib.korch_seg_profile_runs.restype = ctypes.c_int64
        cptrs = (ctypes.c_void_p * max(1, len(self.consts)))(*[buffer_address(c) or None for c in self.consts])
        rc = self._lib.korch_seg_init(cptrs)
        if rc != 0:
            raise RuntimeError(f"native segment {self.lib_path.name}: init failed ({rc}): {self.error()}")
        self._io = (ctypes.c_void_p * max(1, len(self.inputs) + len(self.outputs)))()
        self._run = self._lib.korch_seg_run
        self._lock = threading.Lock()
        self.step_names: list[str] = [m["name"] for m in meta["members"]]

    def error(self) -> str:
        return self._lib.korch_last_error().decode(errors="replace")

    def set_threads(self, num_threads: int) -> None:
        self._lib.korch_set_threads(int(num_threads))

    def input_needs_alignment(self, i: int) -> bool:
        """Note [Unaligned segment inputs]: whether input ``i`` must be ALIGN-byte aligned
        (a TVM member reads it); korch's own kernels load their inputs unaligned."""
        flags = self.meta.get("aligned_inputs")
        return True if flags is None else bool(flags[i])

    def arg(self, i: int, x: np.ndarray) -> np.ndarray:
        """Input ``i`` as the segment takes it (C order, its dtype; ALIGN-byte aligned
        where a TVM member reads it)."""
        if self.input_needs_alignment(i):
            return staged_arg(x, self.inputs[i].shape, self._in_dtypes[i])
        return np.ascontiguousarray(x, dtype=self._in_dtypes[i]).reshape(self.inputs[i].shape)

    def run_into(self, args: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        io = self._io
        # one call at a time: the segment's arena and DLTensors are the library's statics
        with self._lock:
            i = 0
            for a in args:
                io[i] = buffer_address(a)
                i += 1
            for o in outs:
                io[i] = buffer_address(o)
                i += 1
            rc = self._run(io)
        if rc != 0:
            name = self.step_names[rc - 1] if 0 < rc <= len(self.step_names) else f"step {rc}"
            raise RuntimeError(f"native segment: kernel {name} failed: {self.error()}")

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        from korch.kernels.tvm.backend import carve_outputs

        args = [self.arg(i, x) for i, x in enumerate(inputs)]
        outs = carve_outputs(*self._out_layout)
        self.run_into(args, outs)
        return outs

    def profile(self, on: bool) -> None:
        self._lib.korch_seg_profile(int(on))

    def profile_runs_ns(self) -> np.ndarray:
        """The kernels' times (ns), one row per call since ``profile(True)`` (the last
        PROFILE_RUNS of them): runs x kernels, no rows before any call."""
        n, runs = len(self.step_names), min(int(self._lib.korch_seg_profile_runs()), PROFILE_RUNS)
        if runs == 0:
            return np.zeros((0, n))
        p = self._lib.korch_seg_profile_ns()
        return np.ctypeslib.as_array(p, shape=(PROFILE_RUNS * n,))[: runs * n].reshape(runs, n).astype(np.float64)

    def profile_ns(self) -> list[float]:
        """Each kernel's median time (ns) over the calls since ``profile(True)`` (the
        last PROFILE_RUNS of them); zeros before any call."""
        raw = self.profile_runs_ns()
        if len(raw) == 0:
            return [0.0] * len(self.step_names)
        return [float(v) for v in np.median(raw, axis=0)]

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        lib_name = f"{stem}.so"
        if (directory / lib_name).resolve() != self.lib_path.resolve():
            shutil.copyfile(self.lib_path, directory / lib_name)
        const_name = f"{stem}.consts.npz"
        np.savez(directory / const_name, *self.consts)
        return {**self.meta, "backend": self.backend, "library": lib_name, "consts": const_name}


class NativeSegmentBackend(Backend):
    """Loads saved segments; segments are made by ``build_segment``, never profiled."""

    name = "native-segment"
    kinds = frozenset()

    def supports(self, kgraph) -> bool:
        return False

    def build(self, kgraph, consts, num_threads):  # pragma: no cover - segments are not candidates
        raise NotImplementedError("native segments are built from an executable's steps (build_segment)")

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> NativeSegment:
        directory = Path(directory)
        with np.load(directory / meta["consts"]) as z:
            consts = [z[f"arr_{i}"] for i in range(len(z.files))]
        seg = NativeSegment(directory / meta["library"], meta, consts)
        seg.set_threads(num_threads)
        return seg

    def version(self) -> str:
        return "native-segment-1"


register(NativeSegmentBackend())


_BUILD_DIRS: list[Path] = []


def new_build_dir() -> Path:
    """A folder for one segment's objects and library, removed when the process exits
    (a saved executable holds its own copy of the library: ``NativeSegment.save``)."""
    if not _BUILD_DIRS:
        atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _BUILD_DIRS])
    d = Path(tempfile.mkdtemp(prefix="korch-seg-"))
    _BUILD_DIRS.append(d)
    return d
