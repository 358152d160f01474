"""``korch bench``: korch against the engines a user would otherwise pick, side by side.

For each model: optimize it (or load the executable already in its output folder),
then time korch and the peers, each in a process of its own (Note [Engines in their
own processes], ``isolate.py``; ``--in-process``: all in this one), interleaved round
by round after a warm-up (``compare.time_alternating``), each engine in ``processes``
fresh processes one set after another, the median over processes reported (Note
[Medians over processes]), and check every output against onnxruntime.

Peers:
- ``ort``: onnxruntime, default CPU session, all graph optimizations, the same thread
  count, on the model file as given;
- ``ov``: OpenVINO's CPU plugin on the model file as given, always at fp32
  (``peers.openvino_runner``: on CPUs with AMX it otherwise runs bf16), one stream,
  the same thread count; skipped when openvino is not importable;
- ``eager`` and ``compile``: PyTorch eager and ``torch.compile``, only where the model
  came from torch, i.e. a sidecar ``MODEL.torch.json`` (written by
  ``benchmarks/export_suite.py``) names a script and a builder that rebuild the module
  with the same weights; skipped when torch is not importable;
- ``tvm``: TVM's untuned Relax build of the frontend-folded model (llvm target). It is
  20-400x slower than the others, so it runs outside the interleaved loop with a capped
  number of runs.

Timing on a small shared machine is fragile: the load average is recorded before and
after each model, and the spread (p10/p90) is reported with every median.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.bench.peers import openvino_runner, sidecar_path, torch_module, torch_runner, tvm_runner
from korch.config import Settings
from korch.errors import KorchError
from korch.profile.e2e import max_rel_error, ort_session, over_processes, time_alternating

log = logging.getLogger("korch")

ALL_PEERS = ("ort", "ov", "eager", "compile", "tvm")
PEER_LABELS = {
    "ort": "onnxruntime",
    "ov": "OpenVINO fp32",
    "eager": "torch eager",
    "compile": "torch.compile",
    "tvm": "TVM (untuned)",
}


# --- inputs ----------------------------------------------------------------------------------
def bench_feeds(inputs: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal floats; integers in {0, 1} (valid token ids, masks and indices alike)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, spec in inputs.items():
        dt = np.dtype(spec.dtype)
        if dt == np.bool_:
            feeds[name] = rng.random(spec.shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            feeds[name] = (rng.random(spec.shape) < 0.9).astype(dt)
        else:
            feeds[name] = rng.standard_normal(spec.shape).astype(dt)
    return feeds


def _spread(samples: Sequence[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median_ms": statistics.median(s),
        "p10_ms": s[len(s) // 10],
        "p90_ms": s[(9 * len(s)) // 10],
        "runs": len(s),
    }


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _optimize_job(model: str, out_dir: str, settings: Settings) -> float | None:
    from korch.api import optimize

    compiled = optimize(model, output_dir=out_dir, settings=settings, measure=False)
    return compiled.report.get("optimize_seconds")


def _korch_executable(model: Path, out_dir: Path, settings: Settings, reoptimize: bool, in_child: bool = False):
    """(the loaded executable, optimize seconds, how it was had). ``in_child``: optimize
    in a process of its own, so that the memory the optimization held (its plan
    checks' sessions and arenas) is not this process's while the engines run:
    segformer_b16's bench ran out of 24 GB with it (korch's executable 7-11 GB, three
    peers, and this process after the optimization)."""
    from korch.api import load, optimize

    t0 = time.perf_counter()
    if reoptimize or not (out_dir / "plan.json").exists():
        log.info("optimizing %s -> %s", model, out_dir)
        if in_child:
            import concurrent.futures
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
                opt_s = pool.submit(_optimize_job, str(model), str(out_dir), settings).result()
            opt_s = opt_s if opt_s is not None else time.perf_counter() - t0
        else:
            compiled = optimize(str(model), output_dir=out_dir, settings=settings, measure=False)
            opt_s = compiled.report.get("optimize_seconds", time.perf_counter() - t0)
        loaded_from = "optimized now"
    else:
        loaded_from = "loaded"
        opt_s = None
    compiled = load(out_dir, settings.num_threads)
    if opt_s is None:
        opt_s = compiled.report.get("optimize_seconds")
    return compiled, opt_s, loaded_from


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def _in_process_engines(model: Path, compiled, feeds, settings: Settings, peers, row: dict):
    """(fns, errors, skipped, want, out_names): every engine in this process."""
    sess = ort_session(model.read_bytes(), settings.num_threads)
    out_names = [o.name for o in sess.get_outputs()]
    want = dict(zip(out_names, sess.run(None, feeds)))
    fns: dict[str, Callable[[], object]] = {"korch": lambda: compiled(feeds)}
    errors = {"korch": max_rel_error(compiled(feeds), want)}
    skipped: dict[str, str] = {}
    if "ort" in peers:
        fns["ort"] = lambda: sess.run(None, feeds)
        errors["ort"] = 0.0
    if "ov" in peers:
        try:
            fns["ov"], info = openvino_runner(model, feeds, out_names, settings.num_threads)
            errors["ov"] = max_rel_error(fns["ov"](), want)  # type: ignore[arg-type]
            row["openvino"] = info
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            fns.pop("ov", None)
            skipped["ov"] = _why(e)
    if "eager" in peers or "compile" in peers:
        try:
            built = torch_module(model)
        except Exception as e:  # noqa: BLE001 - a peer that cannot be rebuilt is reported, not fatal
            built = None
            why = f"torch module not rebuilt: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            log.warning("%s: %s", model.name, why)
        else:
            why = "no torch sidecar or torch not installed"
        if built is None:
            skipped["eager"] = skipped["compile"] = why
        else:
            import torch

            torch.set_num_threads(settings.num_threads)
            module, in_names = built
            if "eager" in peers:
                fns["eager"] = torch_runner(module, in_names, feeds, out_names)
                errors["eager"] = max_rel_error(fns["eager"](), want)  # type: ignore[arg-type]
            if "compile" in peers:
                t0 = time.perf_counter()
                try:
                    fns["compile"] = torch_runner(torch.compile(module), in_names, feeds, out_names)
                    errors["compile"] = max_rel_error(fns["compile"](), want)  # type: ignore[arg-type]
                    row["compile_seconds"] = round(time.perf_counter() - t0, 1)
                except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                    fns.pop("compile", None)
                    skipped["compile"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return fns, errors, skipped, want, out_names


def _isolated_engines(model: Path, out_dir: Path, feeds, settings: Settings, peers, row: dict, engines: list):
    """As ``_in_process_engines``, each engine in a process of its own (Note [Engines in
    their own processes]); the started engines are appended to ``engines``."""
    import onnx

    from korch.bench.isolate import EngineProcess

    threads = settings.num_threads
    out_names = [o.name for o in onnx.load(str(model), load_external_data=False).graph.output]

    def start(kind: str, spec) -> EngineProcess:
        e = EngineProcess(kind, spec, feeds, out_names, threads)
        engines.append(e)
        return e

    ref = start("ort", model)
    want = ref.outputs()
    fns: dict[str, Callable[[], object]] = {"korch": start("korch", out_dir)}
    errors = {"korch": max_rel_error(fns["korch"].outputs(), want)}  # type: ignore[attr-defined]
    skipped: dict[str, str] = {}
    if "ort" in peers:
        fns["ort"] = ref
        errors["ort"] = 0.0
    else:
        ref.close()
    if "ov" in peers and importlib.util.find_spec("openvino") is None:
        skipped["ov"] = "openvino not installed"
    elif "ov" in peers:
        try:
            e = start("ov", model)
            errors["ov"] = max_rel_error(e.outputs(), want)
            fns["ov"] = e
            row["openvino"] = e.info
        except KorchError as err:  # a peer that fails is reported, not fatal
            skipped["ov"] = str(err).splitlines()[0][:160]
    for kind in ("eager", "compile"):
        if kind not in peers:
            continue
        if importlib.util.find_spec("torch") is None or not sidecar_path(model).exists():
            skipped[kind] = "no torch sidecar or torch not installed"
            continue
        if kind == "compile" and "eager" in skipped:
            skipped[kind] = skipped["eager"]  # the same module would fail to rebuild again
            continue
        try:
            e = start(kind, model)
            errors[kind] = max_rel_error(e.outputs(), want)
        except KorchError as err:  # a peer that fails is reported, not fatal
            skipped[kind] = str(err).splitlines()[0][:160]
            continue
        fns[kind] = e
        if "compile_seconds" in e.info:
            row["compile_seconds"] = e.info["compile_seconds"]
    return fns, errors, skipped, want, out_names


def bench_model(
    model: str | Path,
    out_dir: str | Path,
    settings: Settings,
    peers: Sequence[str] = ALL_PEERS,
    rounds: int = 20,
    tvm_runs: int = 3,
    reoptimize: bool = False,
    isolate: bool = True,
    processes: int = 3,
) -> dict[str, Any]:
    """Time korch and ``peers`` on one model (optimizing it first unless ``out_dir`` has
    an executable). ``isolate``: each engine in a process of its own, ``processes`` sets
    of them one after another, ``rounds`` shared among the sets (Note [Medians over
    processes]); otherwise every engine in this process, once. A peer that fails is
    listed in ``skipped``; korch failing raises."""
    model = Path(model)
    if not model.exists():
        raise KorchError(f"{model}: no such file")
    out_dir = Path(out_dir)
    row: dict[str, Any] = {"model": model.stem, "path": str(model), "threads": settings.num_threads}
    compiled, opt_s, how = _korch_executable(model, out_dir, settings, reoptimize, in_child=isolate)
    row["optimize_seconds"] = opt_s
    row["korch_from"] = how
    row["kernels"] = len(compiled.executable.steps)
    feeds = bench_feeds(compiled.executable.inputs)
    sets = max(1, int(processes)) if isolate else 1
    row["isolated"] = isolate
    row["processes"] = sets
    row["load_before"] = _loadavg()
    timings: list[dict] = []
    errors: dict[str, float] = {}
    skipped: dict[str, str] = {}
    live = list(peers)
    if isolate:
        del compiled  # its copies run in processes of their own
    for p in range(sets):
        engines: list = []
        try:
            if isolate:
                fns, errs, skip, want, out_names = _isolated_engines(
                    model, out_dir, feeds, settings, live, row, engines
                )
            else:
                fns, errs, skip, want, out_names = _in_process_engines(model, compiled, feeds, settings, live, row)
            if p == 0:  # a peer that failed once is not started again
                skipped = skip
                live = [k for k in live if k not in skipped]
            for k, v in errs.items():  # the worst over processes
                errors[k] = max(errors.get(k, 0.0), v)
            names = list(fns)  # each set starts with another engine
            fns = {k: fns[k] for k in names[p % len(names) :] + names[: p % len(names)]}
            timings.append(
                time_alternating(fns, rounds=max(2, -(-rounds // sets)), block=None, max_seconds=60.0 / sets)
            )
        finally:
            for e in engines:
                e.close()
    timing = over_processes(timings)
    row["block"] = timing["korch"]["block"]
    if "tvm" in peers:
        try:
            t0 = time.perf_counter()
            run = tvm_runner(model, feeds, out_names, settings.num_threads)
            errors["tvm"] = max_rel_error(run(), want)  # type: ignore[arg-type]
            row["tvm_build_seconds"] = round(time.perf_counter() - t0, 1)
            samples = []
            for _ in range(max(1, tvm_runs)):
                t1 = time.perf_counter()
                run()
                samples.append((time.perf_counter() - t1) * 1e3)
                if sum(samples) > 30_000:
                    break
            timing["tvm"] = _spread(samples)
        except Exception as e:  # noqa: BLE001
            skipped["tvm"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    row["load_after"] = _loadavg()
    row["timing"] = {
        k: {kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in v.items()} for k, v in timing.items()
    }
    row["ms"] = {k: round(v["median_ms"], 4) for k, v in timing.items()}
    row["rel_err"] = errors
    row["max_rel_err_korch"] = errors["korch"]
    row["skipped"] = skipped
    peer_ms = {k: v for k, v in row["ms"].items() if k != "korch"}
    if peer_ms:
        best = min(peer_ms, key=peer_ms.get)
        row["best_peer"] = best
        row["speedup_vs_best"] = round(peer_ms[best] / row["ms"]["korch"], 3)
    row["speedup_vs"] = {k: round(v / row["ms"]["korch"], 3) for k, v in peer_ms.items()}
    return row


# --- report ----------------------------------------------------------------------------------
def format_table(rows: Sequence[dict]) -> str:
    head = [
        "model",
        "korch ms",
        "ort ms",
        "ov ms",
        "eager ms",
        "compile ms",
        "tvm ms",
        "vs best",
        "max rel err",
        "opt s",
        "load",
    ]

    def ms(r, k):
        t = r.get("timing", {}).get(k)
        if not t:
            return "-"
        f = lambda x: f"{x:.0f}" if x >= 100 else f"{x:.3g}"  # noqa: E731
        return f"{f(t['median_ms'])} ({f(t['p10_ms'])}-{f(t['p90_ms'])})" if k != "tvm" else f(t["median_ms"])

    lines = []
    for r in rows:
        sp = r.get("speedup_vs_best")
        best = PEER_LABELS.get(r.get("best_peer", ""), "").split(" ")[0].replace("onnxruntime", "ort")
        opt = r.get("optimize_seconds")
        lines.append(
            [
                r["model"],
                ms(r, "korch"),
                ms(r, "ort"),
                ms(r, "ov"),
                ms(r, "eager"),
                ms(r, "compile"),
                ms(r, "tvm"),
                f"{sp:.2f}x ({best})" if sp else "-",
                f"{r['max_rel_err_korch']:.1e}",
                f"{opt:.0f}" if isinstance(opt, (int, float)) else "-",
                "/".join(f"{x:.1f}" for x in (r.get("load_before") or [0])[:1] + (r.get("load_after") or [0])[:1]),
            ]
        )
    widths = [max(len(h), *(len(str(x[i])) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt(x) for x in lines]
    return "\n".join(out)


def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def plot_speedups(rows: Sequence[dict], path: str | Path) -> bool:
    """Bar chart of korch's speedup over each peer per model (log scale). False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot")
        return False
    peers = [p for p in ALL_PEERS if any(p in r.get("speedup_vs", {}) for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows) + 2), 4.2), dpi=110)
    width = 0.8 / max(1, len(peers))
    x = np.arange(len(rows))
    colors = {"ort": "#1f77b4", "ov": "#8c564b", "eager": "#ff7f0e", "compile": "#2ca02c", "tvm": "#9467bd"}
    for i, p in enumerate(peers):
        vals = [r.get("speedup_vs", {}).get(p, np.nan) for r in rows]
        bars = ax.bar(
            x + (i - (len(peers) - 1) / 2) * width, vals, width, label=f"vs {PEER_LABELS[p]}", color=colors[p]
        )
        for b, v in zip(bars, vals):
            if np.isfinite(v):
                ax.annotate(f"{v:.2g}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ax.yaxis.set_major_formatter(FormatStrFormatter("%gx"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(x, [r["model"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel("korch speedup (peer ms / korch ms)")
    gm = geomean([r.get("speedup_vs_best", 0) for r in rows])
    ax.set_title(
        f"korch vs peers, end to end, {rows[0]['threads'] if rows else '?'} threads (geomean vs best {gm:.2f}x)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def run_bench(
    models: Sequence[str | Path],
    out_root: str | Path,
    settings: Settings,
    peers: Sequence[str] = ALL_PEERS,
    rounds: int = 20,
    tvm_runs: int = 3,
    reoptimize: bool = False,
    json_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    echo: Callable[[str], None] = print,
    isolate: bool = True,
    processes: int = 3,
) -> list[dict]:
    rows = []
    for m in models:
        m = Path(m)
        row = bench_model(m, Path(out_root) / m.stem, settings, peers, rounds, tvm_runs, reoptimize, isolate, processes)
        rows.append(row)
        echo(
            f"{m.stem}: korch {row['ms']['korch']:.3f} ms, "
            + ", ".join(f"{k} {v:.3f}" for k, v in row["ms"].items() if k != "korch")
        )
        if json_path:  # write as we go: a long suite keeps what it measured
            _write_json(rows, json_path)
    echo(format_table(rows))
    if len(rows) > 1:
        echo(f"geometric-mean speedup over the best peer: {geomean([r.get('speedup_vs_best', 0) for r in rows]):.3f}x")
    if json_path:
        _write_json(rows, json_path)
        echo(f"wrote {json_path}")
    if plot_path and rows and plot_speedups(rows, plot_path):
        echo(f"wrote {plot_path}")
    return rows


def _write_json(rows, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"rows": rows}, indent=1, default=str))
