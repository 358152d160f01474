"""The AVX2 tiles where the CPU has AVX-512 (Note [Wide tiles] in korch_gemm.h).

A CPU with AVX-512 builds the runtime's wide tiles, so the 6x16 AVX2 tile, which an
AVX2-only machine runs, would go untested there. This runs the native linear kernel
and pooling tests again in a subprocess whose compiler adds ``-mno-avx512f`` (a separate build
cache: the cache key holds what ``-march=native`` means to that compiler)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx512(), reason="no AVX-512 here: the tile under test is the one the runtime builds")
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_avx2_tiles_on_an_avx512_cpu(tmp_path):
    cxx = tmp_path / "g++-avx2"
    cxx.write_text(f'#!/bin/sh\nexec {shutil.which("g++")} "$@" -mno-avx512f\n')
    cxx.chmod(0o755)
    env = dict(os.environ, CXX=str(cxx), KORCH_NATIVE_CACHE=str(tmp_path / "cache"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            str(HERE / "test_native_linear.py"),
            str(HERE / "test_native_pool.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert list((tmp_path / "cache").glob("libkorch_rt-*.so")), "the runtime was not rebuilt with the wrapper"
