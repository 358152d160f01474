"""Time korch against onnxruntime, OpenVINO (fp32) and torch.compile on the real-model zoo.

Reads the manifest ``export_zoo.py`` wrote and runs ``korch bench``'s measurement
(``korch.bench.suite.bench_model``) on each model: korch optimizes it (in a process of
its own, unless ``OUT/NAME`` already holds an executable), then every engine runs in
processes of its own, alternated round by round, ``--processes`` fresh sets of them,
medians over processes (Note [Medians over processes]). Every output is checked
against onnxruntime.

A benchmark, not a test: it never fails on a timing, and a model korch cannot optimize
or run (an internal error) is a row with the error, not the end of the run. Results go
to ``OUT/zoo_bench.json`` as each model finishes, and a markdown table is printed.

    .venv/bin/python benchmarks/export_zoo.py
    .venv/bin/python benchmarks/zoo_bench.py --threads 2 --db /tmp/zoo.db
    .venv/bin/python benchmarks/zoo_bench.py --only mobilenetv3_small --rounds 2 --processes 1 --peers ort,ov
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-4  # korch vs onnxruntime, normwise relative (compare.max_rel_error)


def bench_one(entry: dict, zoo_dir: Path, out_root: Path, settings, peers, rounds, processes, reoptimize) -> dict:
    """One row: ``bench_model``'s, or the model's name with the error that stopped it."""
    from korch.bench.suite import bench_model

    row = {"model": entry["name"], "family": entry.get("family", "?"), "batch": entry.get("batch")}
    if not entry.get("ort_ok"):
        return {**row, "error": "not exported: " + str(entry.get("error") or entry.get("ort_error"))}
    t0 = time.perf_counter()
    try:
        got = bench_model(
            zoo_dir / entry["file"], out_root / entry["name"], settings, peers, rounds, 0, reoptimize, True, processes
        )
    except Exception as e:  # noqa: BLE001 - an internal error is this model's result, not the run's end
        tb = traceback.format_exc(limit=6)
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return {**row, "error": f"{type(e).__name__}: {msg}", "traceback": tb, "seconds": time.perf_counter() - t0}
    got.update(row)
    got["seconds"] = round(time.perf_counter() - t0, 1)
    ms = got["ms"]
    best = [ms[k] for k in ("ort", "ov") if k in ms]
    if best:
        got["speedup_vs_ort_ov"] = round(min(best) / ms["korch"], 3)
    if got["max_rel_err_korch"] > TOLERANCE:
        got["error"] = f"korch differs from onnxruntime: {got['max_rel_err_korch']:.1e} > {TOLERANCE:g}"
    return got


def format_zoo_table(rows: list[dict]) -> str:
    head = ["model", "family", "korch ms", "ort ms", "OpenVINO f32 ms", "torch.compile ms",
            "best(ort,ov)/korch", "korch rel err", "error"]  # fmt: skip

    def ms(r, k):
        t = r.get("ms", {}).get(k)
        if t is None:
            why = r.get("skipped", {}).get(k)
            return "skip" if why else "-"
        return f"{t:.0f}" if t >= 100 else f"{t:.3g}"

    lines = []
    for r in rows:
        err = r.get("max_rel_err_korch")
        sp = r.get("speedup_vs_ort_ov")
        lines.append([r["model"], r.get("family", ""), ms(r, "korch"), ms(r, "ort"), ms(r, "ov"), ms(r, "compile"),
                      f"{sp:.2f}x" if sp else "-", f"{err:.1e}" if err is not None else "-",
                      (r.get("error") or "").replace("|", "/")[:90]])  # fmt: skip
    widths = [max(len(h), *(len(str(x[i])) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [fmt(x) for x in lines])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these zoo models")
    p.add_argument("--zoo", default=str(HERE / "models" / "zoo"), help="folder of export_zoo.py's manifest")
    p.add_argument("-o", "--out", default=str(HERE / "out" / "zoo"), help="per-model korch executables and the JSON")
    p.add_argument("--peers", default="ort,ov,compile", help="comma list of ort, ov, eager, compile")
    p.add_argument("--rounds", type=int, default=12, help="alternating rounds, shared among the process sets")
    p.add_argument("--processes", type=int, default=3, help="fresh sets of engine processes per model")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--db", help="korch's results database (default: korch's own)")
    p.add_argument("--reoptimize", action="store_true", help="optimize even where OUT/NAME holds an executable")
    args = p.parse_args(argv)

    from korch.config import Settings

    manifest = Path(args.zoo) / "manifest.json"
    if not manifest.exists():
        p.error(f"{manifest} not found: run benchmarks/export_zoo.py first")
    entries = json.loads(manifest.read_text())["models"]
    if args.only:
        known = {e["name"] for e in entries}
        bad = [n for n in args.only if n not in known]
        if bad:
            p.error(f"not in the manifest: {bad}")
        entries = [e for e in entries if e["name"] in args.only]
    kw = {"num_threads": args.threads, "progress": False}
    if args.db:
        kw["db_path"] = args.db
    settings = Settings(**kw)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for e in entries:
        print(f"{e['name']} ...", flush=True)
        row = bench_one(e, Path(args.zoo), out, settings, peers, args.rounds, args.processes, args.reoptimize)
        rows.append(row)
        print(format_zoo_table([row]).splitlines()[-1], flush=True)
        (out / "zoo_bench.json").write_text(json.dumps({"rows": rows}, indent=1, default=str))
    print(format_zoo_table(rows))
    bad = [r["model"] for r in rows if r.get("error")]
    print(f"{len(rows) - len(bad)} of {len(rows)} models optimized and matching onnxruntime within {TOLERANCE:g}")
    if bad:
        print("errors: " + ", ".join(bad))
    print(f"wrote {out / 'zoo_bench.json'}")
    return 0  # a benchmark: the table says what failed


if __name__ == "__main__":
    sys.exit(main())
