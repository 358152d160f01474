"""Auto tiling in the pipeline: tile-config quality, prediction quality, guided profiling.

    python benchmarks/tiling_integration.py grid   [--models mlp,attention] [--per-model 6]
    python benchmarks/tiling_integration.py guided [--models mlp,attention,candy_block,opaque]

``grid``: for a sample of memory-bound candidate kernels of the test models, the
kernel time of the tiling model's TileConfig and of the rule's (``default_tile_config``)
against the best of a measured grid of tile configs (parallel prefix x inner tile x
vector width x threads on/off; both chosen configs are in the grid). All configs of a
kernel are built in one module and timed round-robin (medians), so machine load hits
them alike.

``guided``: per model, optimize with model-guided and with exhaustive profiling (fresh
databases, order alternated between models); prints candidates enumerated, measured,
rounds, total optimize time, the Spearman rank correlation of predicted vs measured
latency over every generated kernel the exhaustive run measured (each with the tile
config the model chose, paired with that kernel's own time), and the
end-to-end latency of both executables, each in a process of its own, timed alternately in blocks (medians, and
``guided_over_exhaustive_rel``: the ratio round by round, drift cancelled),
and the test-retest Spearman of the measurements themselves over the generated kernels
both runs measured (the ceiling for any prediction's rank correlation). The share
measured is of candidate kernels (``candidates_measured_share``: candidates whose cost
came from a measurement); ``measurements`` counts (kernel, library) pairs, three for a
linear kernel. The executables compared are the BLP's plans: the end-to-end plan check
(which may replace either by one onnxruntime session) and the runtime thread choice are
off unless ``--plan-check``, so the comparison is of what each profiling chose;
``--plan-check composed`` races the plans korch composes (the BLP's, region-biased,
near ties, fewer kernels, in place) end to end but leaves out the whole-graph onnxruntime plans.
Each executable runs in ``--procs`` processes (``process_spread``: how far one
executable's processes timed apart; ``process_rel``: each one's round-relative time),
and the exhaustive plan runs a second time as a control in the same rounds
(``control_over_exhaustive_rel``: a plan against itself, what the timing resolves).
Each run measures its kernels afresh, so both plans are also costed on the same
measurements: ``objective_on_exhaustive_costs`` (the exhaustive run's) and
``objective_on_guided_costs`` (the guided run's, the exhaustive run's where it
measured nothing); a kernel measured 35 us in one run and 52 us in the other moves
the first by 12% on a 0.2 ms plan.

Both print os.getloadavg() (2 cores, shared with other engineers' tests): read the
numbers with it. The last line is one JSON object. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _spearman(a, b) -> float:
    def ranks(x):
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        # average ties
        xs = np.asarray(x)[order]
        i = 0
        while i < len(xs):
            j = i
            while j + 1 < len(xs) and xs[j + 1] == xs[i]:
                j += 1
            r[order[i : j + 1]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else float("nan")


# --- grid ------------------------------------------------------------------------------------
def grid_configs(g, num_threads: int, vb: int, extra=()) -> list:
    import dataclasses

    from korch.kernels.tvm.tiling import _closest_inner_tile, _itemsize, _stored_and_pmax, default_tile_config

    base = default_tile_config(g, num_threads, vb)
    node = g.nodes[base.anchor]
    rank = len(node.shape)
    stored, p_max = _stored_and_pmax(g, base.anchor, base.inline)
    lanes = max(1, vb // max(1, _itemsize(node.dtype)))
    ps = [rank] if not stored else list(range(0, p_max + 1))
    out = list(extra)
    for p in ps:
        inners = [0]
        if p == rank and rank > 0:
            inners = sorted({_closest_inner_tile(node.size, lanes, node.size / n) for n in (2, 4, 16, 64, 256)} - {0})
            inners = inners or [0]
        for inner in inners:
            for vec in sorted({lanes, max(1, lanes // 2), max(1, lanes // 4)}):
                for par in (True, False):
                    out.append(
                        dataclasses.replace(
                            base,
                            parallel_axes=p,
                            inner_tile=inner,
                            vector_width=vec,
                            parallel=par,
                            compute_at=tuple(sorted(stored)) if p > 0 else (),
                        )
                    )
    return list(dict.fromkeys(out))


def _cfg_str(cfg) -> str:
    """A tile config in a few characters: parallel axes, inner tile, vector width, threads."""
    return f"p{cfg.parallel_axes}/i{cfg.inner_tile}/v{cfg.vector_width}/{'par' if cfg.parallel else 'ser'}"


def _sol_str(sol) -> str:
    if sol is None:
        return "-"
    return f"{sol.template} tiles {dict(zip(sol.axes, sol.tiles))} cores {sol.cores} pred {sol.time_us:.1f}us"


def _memory_kernels(name: str):
    from korch import models
    from korch.fission import fission
    from korch.frontend import load_model
    from korch.identify import candidates
    from korch.ir.subgraph import canonical_hash, extract, kernel_class
    from korch.partition import partition

    g = fission(load_model(models.build(name)))  # shapes inferred, as the pipeline loads it
    seen = {}
    for part in partition(g, 400):
        for k in candidates(g, part, 24):
            if kernel_class(g, k) == "memory":
                seen.setdefault(canonical_hash(g, k), (g, k))
    return [(h, extract(g, k), g, k) for h, (g, k) in sorted(seen.items())]


def cmd_grid(args) -> dict:
    from korch.ir.subgraph import kernel_consts
    from korch.kernels.tvm.backend import TvmBackend, vector_bytes
    from korch.kernels.tvm.tiling import default_tile_config, model_tile_config
    from korch.profile.timing import check_outputs, random_inputs, time_kernel

    be = TvmBackend()
    vb = vector_bytes()
    rows = []
    rng = random.Random(0)
    for name in args.models.split(","):
        ks = _memory_kernels(name)
        # the larger kernels matter (they dominate the model's time): sample among the
        # upper half by size, plus a few small ones
        ks.sort(key=lambda x: sum(n.size for n in x[1].nodes))
        pick = rng.sample(ks[len(ks) // 2 :], min(args.per_model - 2, len(ks) // 2)) + rng.sample(
            ks[: len(ks) // 2], min(2, len(ks) // 2)
        )
        for h, kg, g, k in pick:
            if not be.supports(kg):
                continue
            consts = kernel_consts(g, k)
            mcfg, sol = model_tile_config(kg, args.threads, vb)
            rcfg = default_tile_config(kg, args.threads, vb)
            cfgs = grid_configs(kg, args.threads, vb, extra=(mcfg, rcfg))
            built = be.build_many([(kg, consts)] * len(cfgs), args.threads, tile_configs=cfgs)
            inputs = random_inputs(kg, consts)
            ok = [
                i
                for i, b in enumerate(built)
                if not isinstance(b, Exception) and not check_outputs(kg, inputs, b(inputs))
            ]
            if 0 not in ok or 1 not in ok:
                rows.append({"model": name, "kernel": h[:10], "error": "chosen config failed"})
                print(f"{name:16s} {h[:10]} ERROR: {'model' if 0 not in ok else 'rule'} config failed", flush=True)
                continue
            samples: dict[int, list[float]] = {i: [] for i in ok}
            for _ in range(args.rounds):
                for i in ok:
                    samples[i].extend(time_kernel(built[i], inputs, 1, 3, 0.3))
            med = {i: statistics.median(v) for i, v in samples.items()}
            best = min(med.values())
            ibest = min(med, key=med.get)
            rows.append(
                {
                    "model": name,
                    "kernel": h[:10],
                    "primitives": len(kg.compute_ids()),
                    "grid": len(ok),
                    "best_us": round(best, 2),
                    "model_us": round(med[0], 2),
                    "rule_us": round(med[1], 2),
                    "predicted_us": round(sol.time_us, 2) if sol else None,
                    "model_vs_best": round(best / med[0], 3),
                    "rule_vs_best": round(best / med[1], 3),
                    "shape": list(kg.nodes[mcfg.anchor].shape),
                    "best_config": _cfg_str(cfgs[ibest]),
                    "model_config": _cfg_str(mcfg),
                    "rule_config": _cfg_str(rcfg),
                    "solution": _sol_str(sol),
                }
            )
            r = rows[-1]
            print(
                f"{name:16s} {h[:10]} prims {r['primitives']:2d} grid {r['grid']:3d} best {best:9.2f} us"
                f"  model {med[0]:9.2f} ({r['model_vs_best']:.2f})  rule {med[1]:9.2f} ({r['rule_vs_best']:.2f})"
                f"  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            print(
                f"    shape {r['shape']}  best {r['best_config']}  model {r['model_config']}"
                f"  rule {r['rule_config']}  solution {r['solution']}",
                flush=True,
            )
            if args.verbose:
                print("    " + "  ".join(f"{_cfg_str(cfgs[i])} {med[i]:.1f}" for i in sorted(med, key=med.get)))
    good = [r for r in rows if "error" not in r]
    summary = {
        "kernels": len(good),
        "model_ge_90pct_of_best": sum(r["model_vs_best"] >= 0.9 for r in good),
        "rule_ge_90pct_of_best": sum(r["rule_vs_best"] >= 0.9 for r in good),
        "model_median_vs_best": statistics.median(r["model_vs_best"] for r in good) if good else None,
        "rule_median_vs_best": statistics.median(r["rule_vs_best"] for r in good) if good else None,
        "model_faster_than_rule": sum(r["model_us"] < r["rule_us"] for r in good),
        "geomean_model_over_rule": math.exp(statistics.mean(math.log(r["model_us"] / r["rule_us"]) for r in good))
        if good
        else None,
        "errors": len(rows) - len(good),
        "loadavg": os.getloadavg(),
    }
    return summary


# --- guided ----------------------------------------------------------------------------------
def _time_exes(dirs: list[Path], rounds: int, procs: int = 3) -> tuple[list[float], list[float], list[list[float]]]:
    """Medians of the executables, each in ``procs`` processes of its own (Note [Engines
    in their own processes]), all timed alternately in blocks of about 100 ms (Note
    [Timing in blocks]); each one's round-by-round time relative to the last one's
    (``rel``: drift of the machine between rounds cancels), an executable's the median
    over its processes; and every process's round-relative time, per executable.

    Several processes per executable: one executable in two processes timed up to 1.19x
    apart (mlp, eighth session: where a process's buffers land and which core its pools
    get stay for its life), while three processes each of two of mlp's and yolo_block's
    plans spread 1.7-3.5% (Dec 2 2026). One process of three can still be off by 13%
    (opaque, the same day), so the median over processes, not their mean. The same
    directory may be given twice: the control (a plan against itself)."""
    import korch
    from korch.bench.isolate import EngineProcess
    from korch.profile.e2e import time_alternating

    rng = np.random.default_rng(0)
    inputs = korch.load(dirs[0]).executable.inputs
    feeds = {n: rng.standard_normal(s.shape).astype(s.dtype) for n, s in inputs.items()}
    fns = {}
    try:
        for p in range(procs):
            for i, d in enumerate(dirs):
                fns[f"{i}.{p}"] = EngineProcess("korch", d, feeds, [], 2)
        per_call = statistics.median(fns["0.0"].block(5))
        block = max(3, min(30, math.ceil(100.0 / max(per_call, 1e-3))))
        t = time_alternating(fns, rounds=rounds, block=block, max_seconds=30.0 * procs)
    finally:
        for e in fns.values():
            e.close()
    keys = [[f"{i}.{p}" for p in range(procs)] for i in range(len(dirs))]
    medians = [statistics.median(t[k]["median_ms"] for k in ks) for ks in keys]
    rels = [[t[k]["rel"] for k in ks] for ks in keys]
    return medians, [statistics.median(r) / statistics.median(rels[-1]) for r in rels], rels


def _plan_key(plan: dict) -> tuple:
    """What makes two saved plans the same executable: kernels, backends, threads."""
    return (tuple((st["workload"], st["backend"]) for st in plan["steps"]), plan.get("threads"))


def _tvm_measured(db: Path) -> dict[tuple[str, str], float]:
    """(workload, tile config key) -> median us of every generated kernel measured ok."""
    import sqlite3

    q = "select workload, config, median_us from measurements where backend='tvm' and status='ok'"
    return {(w, cfg): us for w, cfg, us in sqlite3.connect(db).execute(q)}


def _both_measured(db_a: Path, db_b: Path) -> list[tuple[float, float]]:
    """(time in a, time in b) of every generated kernel measured ok in both databases."""
    # first measurements only: a "#2" row is a near tie's second one (Note [Confirming near ties])
    a, b = ({w: us for (w, cfg), us in _tvm_measured(db).items() if not cfg.endswith("#2")} for db in (db_a, db_b))
    return [(a[w], b[w]) for w in sorted(set(a) & set(b))]


def _plan_check_settings(mode: str) -> dict:
    """Settings for ``--plan-check``: "off", the BLP's plans; "composed", the plan check
    racing korch's composed plans only (no whole-graph onnxruntime plans, which both
    runs keep on most test models); "full", korch's own pipeline. The runtime thread
    choice is korch's own only in "full"."""
    if mode == "off":
        return {"region_bias": (), "choose_threads": False}
    if mode == "composed":
        return {"whole_plans": False, "choose_threads": False}
    return {}


def cmd_guided(args) -> dict:
    from korch.config import Settings
    from korch.ir.subgraph import extract
    from korch.kernels.tvm.backend import vector_bytes
    from korch.kernels.tvm.tiling import config_key
    from korch.models import build
    from korch.orchestrate.predict import _tile_and_predict
    from korch.pipeline import run_pipeline, save_outputs

    out: dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="korch-guided-"))
    all_pred, all_meas = [], []
    retest: list[tuple[float, float]] = []
    for mi, name in enumerate(args.models.split(",")):
        res = {}
        modes = ["guided", "exhaustive"] if mi % 2 == 0 else ["exhaustive", "guided"]
        for mode in modes:
            s = Settings(
                db_path=str(tmp / f"{name}-{mode}.db"),
                progress=False,
                num_threads=args.threads,
                # --noise-floor: the "guided" slot profiles exhaustively too, so the
                # columns show what re-measuring alone changes
                guided_profiling=mode == "guided" and not args.noise_floor,
                tile_configs=args.tile_configs,
                **({} if args.optimism is None else {"guided_optimism": args.optimism}),
                **({} if args.tolerance is None else {"guided_tolerance": args.tolerance}),
                **({} if args.share is None else {"guided_share_budget": args.share}),
                **_plan_check_settings(args.plan_check),
            )
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            ctx = run_pipeline(build(name), s, measure=False)
            secs = time.perf_counter() - t0
            save_outputs(ctx, tmp / f"{name}-{mode}")
            r = ctx.report
            res[mode] = {
                "candidates": r["candidates"],
                "measurements": r["candidates_measured"],
                "predicted_only": r.get("candidates_predicted"),
                "candidates_measured": r["candidates"] - (r.get("candidates_predicted") or 0),
                "rounds": r.get("profiling_rounds"),
                "confirmed": r.get("measurements_confirmed"),  # Note [Confirming near ties]
                "share_round": r.get("profiling_share_round"),
                "prediction_s": r.get("prediction_seconds"),
                "optimize_s": round(secs, 1),
                "profile_s": r["stage_seconds"].get("profile"),
                "sum_of_kernel_costs_us": r["predicted_latency_us"],
                "plan_kept": (r.get("plan_check") or {}).get("kept"),
                "plans_raced": sorted((r.get("plan_check") or {}).get("ms", {})),
                "loadavg": round(load0, 2),
            }
            if mode == "exhaustive":
                # the prediction against the generated kernel's own measurement (the
                # tile config it predicted), not the candidate's cost, which is the
                # best backend's: a kernel onnxruntime runs faster would rank by
                # onnxruntime's time
                vb = vector_bytes()
                tvm_us = _tvm_measured(Path(s.db_path))
                pairs = []
                for c in ctx.candidates:
                    if "tvm" in c.backends:
                        cfg, p = _tile_and_predict(extract(ctx.graph, c.kernel), s, vb)
                        m = tvm_us.get((c.hash, config_key(cfg)))
                        if p is not None and m is not None:
                            pairs.append((p, m))
                res["spearman"] = round(_spearman([p for p, _ in pairs], [m for _, m in pairs]), 3) if pairs else None
                res["spearman_n"] = len(pairs)
                all_pred += [p for p, _ in pairs]
                all_meas += [m for _, m in pairs]
            res[mode]["chosen"] = [c.hash for c in ctx.chosen]
            if mode == "exhaustive":
                costs = {c.hash: c.cost_us for c in ctx.candidates}
            else:
                costs_g = {c.hash: c.cost_us for c in ctx.candidates if math.isfinite(c.cost_us)}
            print(name, mode, {k: v for k, v in res[mode].items() if k != "chosen"}, flush=True)
        # the measurements' own reliability: generated kernels both runs measured
        twice = _both_measured(tmp / f"{name}-guided.db", tmp / f"{name}-exhaustive.db")
        if len(twice) > 2:
            res["retest_spearman"] = round(_spearman([a for a, _ in twice], [b for _, b in twice]), 3)
            res["retest_n"] = len(twice)
            retest += twice
        # the same kernels on the same backends (and threads): one plan, whatever the
        # end-to-end timing of two copies of it says (Note [Engines in their own processes])
        plans = [json.loads((tmp / f"{name}-{m}" / "plan.json").read_text()) for m in ("guided", "exhaustive")]
        res["same_plan"] = len({json.dumps(_plan_key(p)) for p in plans}) == 1
        # the control: the exhaustive plan against itself, in processes of its own, in
        # the same rounds (identical executables once timed 0.885 apart in a run, 1.00
        # right after: the resolution of this comparison at that moment)
        ex = tmp / f"{name}-exhaustive"
        labels = ("guided", "control", "exhaustive")
        lat, rel, per_proc = _time_exes([tmp / f"{name}-guided", ex, ex], args.rounds, args.procs)
        res["latency_ms"] = {m: round(x, 4) for m, x in zip(labels, lat)}
        res["guided_over_exhaustive"] = round(lat[0] / lat[2], 4)
        res["guided_over_exhaustive_rel"] = round(rel[0], 4)  # round by round, drift cancelled
        res["control_over_exhaustive_rel"] = round(rel[1], 4)
        # one executable over its processes: the timing's own resolution
        res["process_rel"] = {m: [round(x, 3) for x in r] for m, r in zip(labels, per_proc)}
        res["process_spread"] = round(max(max(r) / min(r) for r in per_proc), 4)
        # both plans on the exhaustive run's measurements: the guided plan's loss with
        # no re-measurement noise (each run measures its kernels afresh)
        chosen = {m: res[m].pop("chosen") for m in ("guided", "exhaustive")}
        on_ex = [sum(costs.get(h, math.inf) for h in chosen[m]) for m in ("guided", "exhaustive")]
        res["objective_on_exhaustive_costs"] = round(on_ex[0] / on_ex[1], 4)
        # and on the guided run's own measurements (the exhaustive run's where the
        # guided run measured nothing): the loss without the other run's noise
        on_g = [sum(costs_g.get(h, costs.get(h, math.inf)) for h in chosen[m]) for m in ("guided", "exhaustive")]
        res["objective_on_guided_costs"] = round(on_g[0] / on_g[1], 4)
        res["candidates_measured_share"] = round(
            res["guided"]["candidates_measured"] / max(1, res["guided"]["candidates"]), 3
        )
        res["measurements_per_candidate"] = round(
            res["guided"]["measurements"] / max(1, res["guided"]["candidates"]), 3
        )
        print(name, {k: v for k, v in res.items() if k not in modes}, "load", os.getloadavg(), flush=True)
        out[name] = res
    out["spearman_all"] = round(_spearman(all_pred, all_meas), 3) if all_pred else None
    out["spearman_all_n"] = len(all_pred)
    if retest:
        out["retest_spearman_all"] = round(_spearman([a for a, _ in retest], [b for _, b in retest]), 3)
        out["retest_n"] = len(retest)
    out["loadavg"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["grid", "guided"])
    p.add_argument("--models", default=None)
    p.add_argument("--per-model", type=int, default=6)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tile-configs", default="model", choices=["model", "rule"])
    p.add_argument("--verbose", action="store_true", help="grid: print every config's time")
    p.add_argument(
        "--plan-check",
        nargs="?",
        const="full",
        default="off",
        choices=["off", "full", "composed"],
        help="guided: the end-to-end plan check: off (BLP plans), full (korch's), composed (no whole-graph plans)",
    )
    p.add_argument("--procs", type=int, default=3, help="guided: processes per executable in the end-to-end timing")
    p.add_argument("--optimism", type=float, default=None, help="guided: Settings.guided_optimism (z)")
    p.add_argument("--tolerance", type=float, default=None, help="guided: Settings.guided_tolerance")
    p.add_argument("--share", type=float, default=None, help="guided: Settings.guided_share_budget")
    p.add_argument(
        "--noise-floor", action="store_true", help="guided: run exhaustive profiling twice (the run-to-run noise)"
    )
    args = p.parse_args(argv)
    print("loadavg", os.getloadavg(), flush=True)
    if args.what == "grid":
        args.models = args.models or "mlp,attention,candy_block,segformer_block"
        summary = cmd_grid(args)
    else:
        args.models = args.models or "mlp,attention,candy_block,opaque"
        args.rounds = max(args.rounds, 31)
        summary = cmd_guided(args)
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
