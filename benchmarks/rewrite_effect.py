"""korch end to end with and without the primitive-graph rewrites, per test model.

Each model is optimized twice (``rewrite=False`` and ``rewrite=True``) against one
persistent results database, so a re-run measures nothing new and only re-times. The
two executables and onnxruntime (same threads, no spinning pools) then alternate round
by round in this process; we report medians. "predicted" is the report's
``predicted_latency_us`` (the sum of the chosen kernels' measured costs); "rw cost" is
the rewrite search's own byte/flop estimate before -> after (Note [Rewrite cost]).

    .venv/bin/python benchmarks/rewrite_effect.py [NAME ...] [--db /tmp/korch-bench.db] [--threads 2]
"""

from __future__ import annotations

import argparse
import os

from fission_only import ort_session  # same directory

import korch
from korch.config import Settings
from korch.models import NAMES, build
from korch.profile.e2e import max_rel_error, random_feeds, time_alternating


def study(name: str, settings: Settings, rounds: int) -> dict:
    model = build(name)
    off = korch.optimize(model, settings=settings, rewrite=False, measure=False)
    on = korch.optimize(model, settings=settings, rewrite=True, measure=False)
    sess = ort_session(model, settings.num_threads)
    feeds = random_feeds(off.executable.inputs)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    timing = time_alternating(
        {"ort": lambda: sess.run(None, feeds), "off": lambda: off(feeds), "on": lambda: on(feeds)}, rounds=rounds
    )
    r0, r1 = off.report, on.report
    return {
        "model": name,
        "applied": r1["rewrites_applied"],
        "rw_cost": (r1["rewrite_cost_before"], r1["rewrite_cost_after"]),
        "rw_s": r1["rewrite_seconds"],
        "pred": (r0["predicted_latency_us"], r1["predicted_latency_us"]),
        "ms": (timing["off"]["median_ms"], timing["on"]["median_ms"]),
        "p10": (timing["off"]["p10_ms"], timing["on"]["p10_ms"]),
        "ort_ms": timing["ort"]["median_ms"],
        "kernels": (r0["kernels_chosen"], r1["kernels_chosen"]),
        "opt_s": (r0["optimize_seconds"], r1["optimize_seconds"]),
        "err": (max_rel_error(off(feeds), want), max_rel_error(on(feeds), want)),
    }


def table(rows: list[dict], threads: int, load: tuple[float, float, float]) -> str:
    head = (
        f"{threads} threads; load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        f"(1/5/15 min) on {os.cpu_count()} cores. Pairs are without -> with rewrites.\n\n"
        "| model | rewrites applied | rw cost us (pred.) | predicted us | measured ms, median (p10) | onnxruntime ms "
        "| kernels | optimize s (rewrite s) | max rel err |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        applied = ", ".join(f"{k} {v}" for k, v in r["applied"].items()) or "none"
        lines.append(
            f"| {r['model']} | {applied} | {r['rw_cost'][0]:.0f} -> {r['rw_cost'][1]:.0f} "
            f"| {r['pred'][0]:.0f} -> {r['pred'][1]:.0f} | {r['ms'][0]:.3f} ({r['p10'][0]:.3f}) -> {r['ms'][1]:.3f} ({r['p10'][1]:.3f}) "
            f"| {r['ort_ms']:.3f} "
            f"| {r['kernels'][0]} -> {r['kernels'][1]} | {r['opt_s'][0]:.1f} -> {r['opt_s'][1]:.1f} ({r['rw_s']:.1f}) "
            f"| {r['err'][0]:.1e} / {r['err'][1]:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help=f"test model names (default: all of {', '.join(NAMES)})")
    p.add_argument("--db", default="/tmp/korch-bench.db")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    settings = Settings(db_path=args.db, num_threads=args.threads, progress=False)
    load = os.getloadavg()
    rows = []
    for name in args.models or NAMES:
        r = study(name, settings, args.rounds)
        print(f"{name}: {r['ms'][0]:.3f} -> {r['ms'][1]:.3f} ms (onnxruntime {r['ort_ms']:.3f})", flush=True)
        rows.append(r)
    print()
    print(table(rows, args.threads, load))


if __name__ == "__main__":
    main()
