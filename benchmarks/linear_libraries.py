"""Linear-kernel libraries for issue 25's native executable: median time per op, in us.

Times fp32 MatMul / Conv shapes from BERT-base, ResNet-50 and MobileNetV2 on every
library that could carry the native executable's linear kernels, at 2 threads and 1
thread, against onnxruntime (MLAS) as the reference:

- ``ort``: onnxruntime, one-node model, default session options, IOBinding output.
- ``openvino``: OpenVINO CPU plugin, INFERENCE_PRECISION_HINT=f32, LATENCY hint.
- ``torch``: eager torch (oneDNN conv, MKL sgemm inside), ``out=`` where it exists.
- ``numpy``: np.matmul (OpenBLAS); conv as im2col + matmul (depthwise: einsum).
- ``onednn``: oneDNN 3.2 C++ primitives (``onednn-cpu-gomp`` wheel) loaded with ctypes,
  weights reordered once into the primitive's 'any' layout, activations plain
  (``onednn-nhwc``: channels-last activations); ``+add+relu`` cases use post-ops.
- ``mkl`` / ``mkl-packed``: cblas_sgemm, and cblas_sgemm_compute with B packed once.
- ``tvm``: TVM's default (unscheduled) llvm build of a te matmul, called through ffi.

Native timings are taken inside C++ (per-call steady_clock), so they carry no ctypes
cost; Python engines are timed per call with perf_counter_ns. Each (threads) setting
runs in its own process (thread pools and OMP/OpenBLAS/MKL env set before import).
Engines alternate in shuffled rounds, since the machine is shared; we report the
median over all calls and the p10/p90 of the per-round medians. Outputs are checked
against a float64 numpy reference: max|y - ref| / max|ref| <= 1e-4.

Native libraries are looked up in ``--lib-dir`` (default: the venv's prefix, where pip
puts wheel data files: ``lib/`` and ``include/``). To get them without touching the
venv, unpack the wheels, e.g.::

    pip download --no-deps -d /tmp/w onednn-cpu-gomp==2023.2.0 \\
        onednn-devel-cpu-gomp==2023.2.0 mkl==2026.2.1 mkl-include==2026.2.1
    for f in /tmp/w/*.whl; do unzip -q -o $f -d /tmp/x; done
    mkdir -p /tmp/korch-libs && cp -r /tmp/x/*.data/data/* /tmp/korch-libs/
    .venv/bin/python benchmarks/linear_libraries.py --lib-dir /tmp/korch-libs

A library that is missing is skipped with the reason in the table. A benchmark, not a
test; the markdown table goes to benchmarks/out/linear_libraries.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from linear_libraries_engines import ENGINE_MAKERS, Skip, dispatch_costs, make_data, versions

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "native"
TOL = 1e-4


@dataclass(frozen=True)
class Case:
    """One linear op. mm: (M, K, N). conv: (C, H, W, O, k, stride, pad, group), batch 1."""

    name: str
    kind: str
    dims: tuple
    fused: bool = False  # y = relu(op(x) + residual)


CASES = [
    Case("mm 4x4x4 (dispatch)", "mm", (4, 4, 4)),
    Case("BERT mm 128x768x768", "mm", (128, 768, 768)),
    Case("BERT mm 128x768x3072", "mm", (128, 768, 3072)),
    Case("FC mm 1x512x1000", "mm", (1, 512, 1000)),
    Case("conv3x3 64->64 56x56", "conv", (64, 56, 56, 64, 3, 1, 1, 1)),
    Case("conv1x1 256->64 56x56", "conv", (256, 56, 56, 64, 1, 1, 0, 1)),
    Case("dwconv3x3 96 56x56", "conv", (96, 56, 56, 96, 3, 1, 1, 96)),
    Case("conv1x1 16->96 112x112", "conv", (16, 112, 112, 96, 1, 1, 0, 1)),
    Case("BERT mm 128x768x768 +add+relu", "mm", (128, 768, 768), fused=True),
    Case("conv3x3 64->64 56x56 +add+relu", "conv", (64, 56, 56, 64, 3, 1, 1, 1), fused=True),
    Case("conv1x1 256->64 56x56 +add+relu", "conv", (256, 56, 56, 64, 1, 1, 0, 1), fused=True),
]
ENGINES = ["ort", "openvino", "torch", "numpy", "onednn", "onednn-nhwc", "mkl", "mkl-packed", "tvm"]


# ---------------------------------------------------------------- parent: build + table


def _native_flags(lib_dir: Path) -> dict[str, tuple[list[str], str]]:
    """Per native library: (g++ link arguments, reason it cannot be built or '')."""
    inc, lib = lib_dir / "include", lib_dir / "lib"
    out = {}
    if (inc / "oneapi/dnnl/dnnl.hpp").exists() and (lib / "libdnnl.so.3").exists():
        out["onednn"] = ([f"-I{inc}", f"-L{lib}", "-l:libdnnl.so.3", "-fopenmp", f"-Wl,-rpath,{lib}"], "")
    else:
        out["onednn"] = ([], f"no oneDNN headers/lib in {lib_dir} (onednn-cpu-gomp + onednn-devel-cpu-gomp)")
    mkl = ["libmkl_intel_lp64.so.2", "libmkl_gnu_thread.so.2", "libmkl_core.so.2"]
    for soname in ("3", "2"):
        names = [m.replace(".so.2", f".so.{soname}") for m in mkl]
        if (inc / "mkl_cblas.h").exists() and all((lib / n).exists() for n in names):
            link = [f"-l:{n}" for n in names] + ["-fopenmp", "-lpthread", "-lm", "-ldl"]
            out["mkl"] = ([f"-I{inc}", f"-L{lib}", *link, f"-Wl,-rpath,{lib}"], "")
            break
    else:
        out["mkl"] = ([], f"no MKL headers/lib in {lib_dir} (mkl + mkl-include)")
    out["dispatch"] = ([], "")
    try:
        import tvm_ffi.libinfo as li

        ffi_inc, ffi_lib = Path(li.find_include_path()), Path(li.find_libtvm_ffi()).parent
        dl = Path(li.find_dlpack_include_path())
        flags = [f"-I{ffi_inc}", f"-I{dl}", f"-L{ffi_lib}", "-ltvm_ffi", f"-Wl,-rpath,{ffi_lib}"]
        out["dispatch_tvm_ffi"] = (flags, "")
    except Exception as e:  # noqa: BLE001 - any failure means: skip
        out["dispatch_tvm_ffi"] = ([], f"tvm_ffi headers not found: {e}")
    return out


def build_native(lib_dir: Path, build_dir: Path) -> dict[str, str]:
    """Compile benchmarks/native/*.cc into build_dir; returns {name: '' or skip reason}."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    status = {}
    src_of = {
        "onednn": "linear_onednn",
        "mkl": "linear_mkl",
        "dispatch": "dispatch",
        "dispatch_tvm_ffi": "dispatch_tvm_ffi",
    }
    for name, (flags, reason) in _native_flags(lib_dir).items():
        if not cxx:
            status[name] = "no C++ compiler (g++ / $CXX)"
            continue
        if reason:
            status[name] = reason
            continue
        cmd = [
            cxx,
            "-O2",
            "-std=c++17",
            "-shared",
            "-fPIC",
            str(NATIVE / f"{src_of[name]}.cc"),
            "-o",
            str(build_dir / f"{name}.so"),
            *flags,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        status[name] = "" if r.returncode == 0 else f"compile failed: {r.stderr.strip()[-300:]}"
    return status


def _fmt(res: dict | None, ort: dict | None, key: str) -> str:
    if res is None:
        return "-"
    if "skip" in res:
        return "skip"
    cell = f"{res[key]:.1f}"
    if ort and key in ort:
        cell += f" ({ort[key] / res[key]:.2f}x)"
    if res.get("rounds") == 0:
        cell += " single call"
    if not res["ok"]:
        cell += f" WRONG {res['err']:.1e}"
    return cell


def table(results: dict, threads: list[int], key: str = "median_us") -> str:
    """Markdown: rows case x threads, columns engines; us (ORT time / engine time)."""
    head = "| case | thr | " + " | ".join(ENGINES) + " |"
    lines = [head, "|" + "---|" * (len(ENGINES) + 2)]
    for case in CASES:
        for t in threads:
            row = results[str(t)]["cases"].get(case.name)
            if row is None:
                continue
            cells = [_fmt(row.get(e), row.get("ort"), key) for e in ENGINES]
            lines.append(f"| {case.name} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread_table(results: dict, threads: list[int]) -> str:
    lines = [
        "| case | thr | engine | median us | p10 round | p90 round | rounds x calls |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in CASES:
        for t in threads:
            for e, r in results[str(t)]["cases"].get(case.name, {}).items():
                if "median_us" in r:
                    lines.append(
                        f"| {case.name} | {t} | {e} | {r['median_us']:.1f} | {r['p10_us']:.1f} "
                        f"| {r['p90_us']:.1f} | {r['rounds']}x{r['calls']} |"
                    )
    return "\n".join(lines)


def skips(results: dict) -> str:
    seen = {}
    for per_t in results.values():
        for case, row in per_t["cases"].items():
            for e, r in row.items():
                if "skip" in r:
                    seen.setdefault((e, r["skip"]), []).append(case)
    return "\n".join(f"- {e}: {why} ({len(set(cs))} cases)" for (e, why), cs in sorted(seen.items()))


def parent(args) -> None:
    build_dir = Path(tempfile.mkdtemp(prefix="korch-linlib-"))
    lib_dir = Path(args.lib_dir).resolve()
    native = build_native(lib_dir, build_dir)
    print("native builds:", {k: v or "ok" for k, v in native.items()}, flush=True)
    results = {}
    for t in args.threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t))
        # OpenBLAS's idle workers busy-wait ~2^28 cycles (~0.1 s) by default, stealing a
        # core from whichever engine is timed next; 2^4 makes them sleep at once.
        env["OPENBLAS_THREAD_TIMEOUT"] = "4"
        # MKL dlopens its per-ISA kernels (libmkl_avx2.so...) by name.
        env["LD_LIBRARY_PATH"] = f"{lib_dir / 'lib'}:{env.get('LD_LIBRARY_PATH', '')}"
        out = build_dir / f"t{t}.json"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--threads",
            str(t),
            "--rounds",
            str(args.rounds),
            "--build-dir",
            str(build_dir),
            "--native-status",
            json.dumps(native),
            "--json",
            str(out),
        ]
        if args.cases:
            cmd += ["--cases", args.cases]
        subprocess.run(cmd, env=env, check=True)
        results[str(t)] = json.loads(out.read_text())
    shutil.rmtree(build_dir, ignore_errors=True)
    md = render(results, args.threads)
    print(md)
    dest = HERE / "out" / "linear_libraries.md"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(md + "\n")
    print(f"\nwrote {dest}")


def render(results: dict, threads: list[int]) -> str:
    parts = [
        "## Linear-kernel libraries (fp32, batch 1)",
        "",
        "Median us per op; in brackets ORT time / engine time (>1: faster than onnxruntime).",
        "",
    ]
    parts.append(table(results, threads))
    parts += ["", "Same, p10 of the per-round medians (the least disturbed rounds; the machine is shared):", ""]
    parts.append(table(results, threads, "p10_us"))
    parts += ["", "Skipped:", skips(results), "", "Machine and load:"]
    for t in threads:
        r = results[str(t)]
        parts.append(f"- {t} thread(s): loadavg start {r['load_start']}, end {r['load_end']}; {r['versions']}")
        parts.append(f"  oneDNN impls: {r.get('onednn_impl', {})}")
    d = next((r["dispatch"] for r in results.values() if "dispatch" in r), {"(not run)": "needs --threads 1"})
    parts += ["", "Dispatch cost per call of a trivial kernel (ns):", ""]
    parts += [f"- {k}: {v}" for k, v in d.items()]
    parts += ["", "Spread across rounds:", "", spread_table(results, threads)]
    return "\n".join(parts)


# ---------------------------------------------------------------- child: one thread count


def child(args) -> None:
    import numpy as np

    load_start = [round(x, 2) for x in os.getloadavg()]
    native = json.loads(args.native_status)
    libs = {n: ctypes.CDLL(str(Path(args.build_dir) / f"{n}.so")) for n, why in native.items() if not why}
    cases = [c for c in CASES if not args.cases or any(s in c.name for s in args.cases.split(","))]
    rng = random.Random(0)
    out = {"cases": {}, "onednn_impl": {}}
    for case in cases:
        data = make_data(case)
        runs, row = {}, {}
        for e in ENGINES:
            try:
                runs[e] = ENGINE_MAKERS[e](case, data, args.threads, libs, native)
            except Skip as s:
                row[e] = {"skip": str(s)}
        samples = {e: [] for e in runs}
        calls = {}
        for e, run in runs.items():  # warm up, check, size the per-round block (~20 ms)
            y, t = run.warm()
            err = float(np.abs(y - data["ref"]).max() / np.abs(data["ref"]).max())
            row[e] = {"ok": err <= TOL, "err": err}
            calls[e] = max(1, min(300, int(0.02 / max(t, 1e-7))))
            if e.startswith("onednn"):
                out["onednn_impl"][f"{case.name} {e}"] = run.info
            if t > 0.5:  # e.g. oneDNN's reference kernels: the warm-up calls are the result
                row[e].update(median_us=t * 1e6, p10_us=t * 1e6, p90_us=t * 1e6, rounds=0, calls=1)
                runs[e].close()
        runs = {e: r for e, r in runs.items() if "median_us" not in row[e]}
        order = list(runs)
        for _ in range(args.rounds):
            rng.shuffle(order)
            for e in order:
                samples[e].append(runs[e].time(calls[e]))
                time.sleep(0.02)  # let spinning pool threads of the previous engine go idle
        for e in runs:
            flat = np.concatenate(samples[e]) / 1e3
            per_round = [float(np.median(s)) / 1e3 for s in samples[e]]
            row[e].update(
                median_us=float(np.median(flat)),
                p10_us=float(np.percentile(per_round, 10)),
                p90_us=float(np.percentile(per_round, 90)),
                rounds=args.rounds,
                calls=calls[e],
            )
        for run in runs.values():
            run.close()
        out["cases"][case.name] = row
        print(
            f"[{args.threads}t] {case.name}: "
            + ", ".join(f"{e} {r['median_us']:.1f}" for e, r in row.items() if "median_us" in r),
            flush=True,
        )
    if args.threads == 1:
        out["dispatch"] = dispatch_costs(libs, native)
    out["load_start"], out["load_end"] = load_start, [round(x, 2) for x in os.getloadavg()]
    out["versions"] = versions()
    Path(args.json).write_text(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib-dir", default=sys.prefix, help="folder with include/ and lib/ (default: venv)")
    p.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--cases", default="", help="comma-separated substrings of case names")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--build-dir", help=argparse.SUPPRESS)
    p.add_argument("--native-status", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.threads = args.threads[0]
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
