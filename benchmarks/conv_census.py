"""Every distinct Conv of some ONNX models, korch's native kernel against onnxruntime's, per op.

Where a model's convolutions lose, weighted by how often each shape occurs: each
distinct (input shape, weight shape, strides, pads, group, dilations) is built as
conv + per-channel bias (what fission and the plan give a linear kernel) and timed by
``native_linear.time_case``, each backend in a process of its own (onnxruntime's
spinning pool would otherwise slow korch's). The table is sorted by the time lost,
count x (native - onnxruntime). A benchmark: prints a table, never fails on a timing.

    .venv/bin/python benchmarks/conv_census.py benchmarks/models/zoo/resnet18.onnx ... --threads 2
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
from onnx import numpy_helper, shape_inference


def census(paths: list[str]) -> list[dict]:
    """Distinct conv signatures over the models, with how often each occurs (and where)."""
    found: dict[tuple, dict] = {}
    for path in paths:
        m = shape_inference.infer_shapes(onnx.load(path))
        shapes = {}
        for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
            dims = [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
            shapes[vi.name] = tuple(dims)
        inits = {t.name: numpy_helper.to_array(t).shape for t in m.graph.initializer}
        for n in m.graph.node:
            if n.op_type != "Conv" or n.input[0] not in shapes or n.input[1] not in inits:
                continue
            x, w = shapes[n.input[0]], inits[n.input[1]]
            if len(x) != 4:
                continue
            a = {at.name: onnx.helper.get_attribute_value(at) for at in n.attribute}
            if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                continue
            key = (
                x,
                tuple(w),
                tuple(a.get("strides", (1, 1))),
                tuple(a.get("pads", (0, 0, 0, 0))),
                int(a.get("group", 1)),
                tuple(a.get("dilations", (1, 1))),
            )
            e = found.setdefault(key, {"key": key, "count": 0, "models": collections.Counter()})
            e["count"] += 1
            e["models"][Path(path).stem] += 1
    return list(found.values())


def label(key) -> str:
    x, w, s, p, g, d = key
    k = f"{w[2]}x{w[3]}"
    kind = "dw" if g == x[1] and g > 1 else (f"g{g} " if g > 1 else "")
    extra = ("" if s == (1, 1) else f" s{s[0]}") + ("" if d == (1, 1) else f" d{d[0]}")
    return f"{kind}{k}{extra} {x[1]}->{w[0]} {x[2]}x{x[3]}"


def child(keys: list, backend: str, threads: int, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
    from native_linear import time_case
    from test_library_backends import conv_graph

    res = []
    for key in keys:
        x, w, s, p, g, d = (tuple(v) if isinstance(v, list) else v for v in key)
        r = time_case(conv_graph(x, w, s, p, g, dil=d, bias=True), threads, (backend,))
        res.append(r.get(backend))
    Path(out).write_text(json.dumps(res))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="processes per backend, alternated")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # backend keys.json out.json
    args = p.parse_args()
    if args.child:
        backend, keys, out = args.child
        child(json.loads(Path(keys).read_text()), backend, args.threads, out)
        return
    rows = census(args.models)
    keys = [r["key"] for r in rows]
    times: dict[str, list[list[float]]] = {"native": [], "ort": []}
    with tempfile.TemporaryDirectory() as tmp:
        kp = Path(tmp) / "keys.json"
        kp.write_text(json.dumps(keys))
        for rnd in range(args.rounds):
            for backend in times:
                out = Path(tmp) / f"{backend}{rnd}.json"
                cmd = [sys.executable, __file__, "--threads", str(args.threads), "--child", backend, str(kp), str(out)]
                subprocess.run(cmd, check=True)
                times[backend].append(json.loads(out.read_text()))
    for i, r in enumerate(rows):
        for b in times:
            vals = [t[i] for t in times[b] if t[i] is not None]
            r[b] = min(vals) if vals else None  # the fastest process: the least disturbed
        r["lost"] = r["count"] * (r["native"] - r["ort"]) if r["native"] and r["ort"] else 0.0
    rows.sort(key=lambda r: -r["lost"])
    print(f"\n{args.threads} thread(s), conv + bias, us (fastest of {args.rounds} processes per backend)\n")
    print("| conv | count | korch | onnxruntime | ratio | lost x count | models |")
    print("|---|---|---|---|---|---|---|")
    for r in rows[: args.top]:
        nat, o = r["native"], r["ort"]
        ratio = f"{o / nat:.2f}" if nat and o else "-"
        models = ", ".join(f"{m} x{c}" for m, c in r["models"].most_common(3))
        nat_s = f"{nat:.1f}" if nat else "-"
        o_s = f"{o:.1f}" if o else "-"
        print(f"| {label(r['key'])} | {r['count']} | {nat_s} | {o_s} | {ratio} | {r['lost']:.0f} | {models} |")
    tot_n = sum(r["count"] * r["native"] for r in rows if r["native"] and r["ort"])
    tot_o = sum(r["count"] * r["ort"] for r in rows if r["native"] and r["ort"])
    print(f"\nall convs, weighted by count: korch {tot_n / 1000:.2f} ms, onnxruntime {tot_o / 1000:.2f} ms")


if __name__ == "__main__":
    main()
