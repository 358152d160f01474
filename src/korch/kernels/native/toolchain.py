"""Compiling korch's native code: the runtime (``korch_rt.cc``, once per machine) and
each native segment (a generated driver linked with TVM's object code).

The compiler is the system's C++ compiler (``CXX``, else ``g++``, ``c++``, ``clang++``;
the README names ``g++``); BLAS is the ``scipy-openblas32`` wheel (headers and
``libscipy_openblas.so``), and the C ABI of TVM's kernels comes from ``apache-tvm-ffi``'s
headers. Results are cached under ``KORCH_NATIVE_CACHE`` (default
``~/.cache/korch/native``) by a hash of the sources, the flags and the compiler's
version, and written through a temporary file and ``os.replace``, so processes building
the same file at once (measurement workers) do not see a half-written one.

Note [Native flags]
~~~~~~~~~~~~~~~~~~~
``-O3 -march=native``: the code runs where it is built (the cache key holds the host
CPU's flags through the compiler's ``-march=native`` expansion). ``-pthread``: the
runtime's pool is its own (Note [One pool, awake for a segment] in korch_rt.cc), and
there is one per process because every segment links the one ``libkorch_rt.so``
(soname ``RUNTIME_SONAME``, loaded first by ``load_runtime``) instead of a copy of it.
``-Wl,-Bsymbolic`` binds a segment's references to what it defines itself, never to a
same-named symbol another library put in the process first (tvm-ffi's
``TVMFFIErrorSetRaisedFromCStrParts``, which the driver defines). ``-fno-math-errno`` lets loops over
``exp``/``tanh`` vectorize; no ``-ffast-math``, whose NaN and max/min rules differ from
onnxruntime's.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("korch_rt.h", "korch_gemm.h", "korch_rt.cc")
CXXFLAGS = ["-O3", "-march=native", "-pthread", "-fPIC", "-std=c++17", "-fno-math-errno"]
# the runtime's C ABI version (korch_rt.h): a segment saved by another korch binds to
# the runtime loaded now through this name, so a change to the ABI changes the name
RUNTIME_SONAME = "libkorch_rt.so.2"


class NativeBuildError(RuntimeError):
    """The native code did not compile or link; the message holds the compiler's output.
    An optimization that failed, not the user's error: the pipeline skips native code
    and records why (Note [Skipped optimizations])."""


def cache_dir() -> Path:
    d = Path(os.environ.get("KORCH_NATIVE_CACHE", str(Path.home() / ".cache" / "korch" / "native")))
    d.mkdir(parents=True, exist_ok=True)
    return d


@functools.cache
def compiler() -> str:
    for name in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++")):
        path = shutil.which(name)
        if path:
            return path
    raise NativeBuildError("no C++ compiler found (set CXX, or install g++: apt-get install g++)")


@functools.cache
def compiler_id() -> str:
    """The compiler's version line and what -march=native means here (part of cache keys)."""
    cxx = compiler()
    ver = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    march = subprocess.run(
        [cxx, "-march=native", "-Q", "--help=target"], capture_output=True, text=True
    ).stdout  # gcc only; clang prints nothing useful and the version line stands alone
    return "\n".join(ver) + hashlib.sha256(march.encode()).hexdigest()[:16]


@functools.cache
def blas() -> tuple[str, str, str]:
    """(include dir, lib dir, link name) of the scipy-openblas32 wheel."""
    try:
        import scipy_openblas32 as sob
    except ImportError as e:
        raise NativeBuildError("the native runtime needs scipy-openblas32 (pip install scipy-openblas32)") from e
    return sob.get_include_dir(), sob.get_lib_dir(), sob.get_library()


@functools.cache
def ffi_include() -> str:
    try:
        import tvm_ffi.libinfo as info
    except ImportError as e:
        raise NativeBuildError("native segments need apache-tvm-ffi's headers") from e
    return (
        str(info.find_include_path())
        if hasattr(info, "find_include_path")
        else str(Path(info.__file__).parent / "include")
    )


def include_flags() -> list[str]:
    inc, _, _ = blas()
    return [f"-I{HERE}", f"-I{inc}", f"-I{ffi_include()}"]


def link_flags() -> list[str]:
    _, lib, name = blas()
    return [f"-L{lib}", f"-l{name}", f"-Wl,-rpath,{lib}", "-lm", "-Wl,-Bsymbolic", "-Wl,--no-undefined"]


def run_compiler(args: list[str], what: str) -> None:
    proc = subprocess.run([compiler(), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-30:]
        raise NativeBuildError(f"{what}: {Path(compiler()).name} failed:\n" + "\n".join(tail))


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _publish(tmp: Path, dest: Path) -> Path:
    os.replace(tmp, dest)
    return dest


@functools.cache
def source_hash() -> str:
    """A hash of the runtime's sources (part of the native backend's version)."""
    return _key(b"".join((HERE / s).read_bytes() for s in SOURCES))


@functools.cache
def runtime_object() -> Path:
    """``korch_rt.o`` for this machine (compiled once, then cached)."""
    dest = cache_dir() / f"korch_rt-{_key(source_hash(), compiler_id(), *CXXFLAGS, *include_flags())}.o"
    if not dest.exists():
        fd, tmp = tempfile.mkstemp(suffix=".o", dir=dest.parent)
        os.close(fd)
        run_compiler([*CXXFLAGS, *include_flags(), "-c", str(HERE / "korch_rt.cc"), "-o", tmp], "korch_rt.cc")
        _publish(Path(tmp), dest)
    return dest


@functools.cache
def runtime_library() -> Path:
    """``libkorch_rt.so``: the runtime alone, for kernels called through ctypes."""
    obj = runtime_object()
    dest = obj.with_name(obj.stem.replace("korch_rt", "libkorch_rt") + ".so")
    if not dest.exists():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=dest.parent)
        os.close(fd)
        run_compiler(
            ["-shared", "-pthread", str(obj), "-o", tmp, f"-Wl,-soname,{RUNTIME_SONAME}", *link_flags()],
            "libkorch_rt.so",
        )
        _publish(Path(tmp), dest)
    return dest


@functools.cache
def load_runtime():
    """The runtime, loaded once with its symbols global, so that every segment's
    ``libkorch_rt.so`` dependency (by soname) is this one library and pool."""
    import ctypes

    return ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)


def link_shared(source: str, objects: list[Path], out: Path) -> Path:
    """Compile the generated C++ ``source`` and link it with ``objects`` and the runtime
    into the shared library ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="korch-native-") as tmp:
        src = Path(tmp) / "segment.cc"
        src.write_text(source)
        lib = Path(tmp) / "segment.so"
        run_compiler(
            [
                *CXXFLAGS,
                *include_flags(),
                "-shared",
                str(src),
                *map(str, objects),
                str(runtime_library()),
                "-o",
                str(lib),
                f"-Wl,-rpath,{runtime_library().parent}",
                *link_flags(),
            ],
            "native segment",
        )
        shutil.move(str(lib), out)
    return out


@functools.cache
def runtime() -> ctypes.CDLL:
    """The runtime with the signatures its native kernels (linear.py, topk.py) call."""
    lib = load_runtime()
    lib.korch_linear_create.restype = ctypes.c_void_p
    lib.korch_linear_create.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.korch_linear_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.korch_linear_free.argtypes = [ctypes.c_void_p]
    lib.korch_linear_post_steps.argtypes = [ctypes.c_void_p]
    lib.korch_linear_post_steps.restype = ctypes.c_int64
    lib.korch_last_error.restype = ctypes.c_char_p
    lib.korch_set_threads.argtypes = [ctypes.c_int]
    lib.korch_pool_hold.argtypes = [ctypes.c_int]
    return lib
