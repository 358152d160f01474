"""``korch explain OUTDIR``: where an optimized model's time goes, and a picture of its kernels.

Timing: the saved executable is loaded and run with a clock around every step, in
place (the same buffers, order and threads as a normal run). Per run r, step i takes
t[r][i] and the whole run T[r]; a step's time is its median over runs, and the
dispatch overhead (the Python loop, buffer bookkeeping, argument marshalling between
kernels) is the median over runs of T[r] - sum_i t[r][i]. The reported end-to-end time
is the sum of the step medians plus that overhead, so kernels never sum to more than
end to end; the uninstrumented end-to-end median is printed beside it.

Picture: every chosen kernel is a cluster holding the primitives it computes,
coloured by primitive class; a primitive computed by more than one kernel appears in
each of them, drawn with a red double border (redundant computation). Edges inside a
kernel stay in registers or cache; edges between clusters are tensors written to
memory. Graphviz ``dot`` renders it when installed (SVG and PNG); otherwise a simple
layered SVG is written directly.
"""

from __future__ import annotations

import html
import json
import math
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from korch.errors import KorchError
from korch.executable.graph_summary import GRAPH_FILE, graph_summary
from korch.kernels.registry import GENERATORS
from korch.profile.e2e import time_steps

CLASS_COLOURS = {
    "elementwise": "#a6d96a",
    "reduce": "#fdae61",
    "broadcast": "#abd9e9",
    "layout": "#e0e0e0",
    "linear": "#f46d43",
    "opaque": "#c2a5cf",
    "source": "#ffffff",
}
KERNEL_COLOURS = {"tvm": "#1a9850", "ort": "#2166ac", "numpy": "#762a83", "torch": "#d6604d"}


def _load_graph(d: Path, report: dict) -> dict[str, Any]:
    p = d / GRAPH_FILE
    if p.exists():
        return json.loads(p.read_text())
    model = report.get("model")
    if not model or not Path(model).exists():
        raise KorchError(f"{d}: no {GRAPH_FILE} and the source model is not at {model!r}; re-optimize")
    # An executable saved before graph.json existed: redo the graph-building steps
    # (everything before partitioning, rewrites included) with default settings.
    from korch.config import Settings
    from korch.pipeline import STEPS, Context

    ctx = Context(Settings(progress=False), model, None)
    for name, fn in STEPS:
        if name == "partition":
            break
        fn(ctx)
    g = graph_summary(ctx.graph)
    plan = json.loads((d / "plan.json").read_text())
    n = len(g["nodes"])
    ok = all(s["outputs"] and max(s["nodes"]) < n for s in plan["steps"]) and all(
        v["node"] < n and g["nodes"][v["node"]]["shape"] == list(v["shape"]) for v in plan["outputs"].values()
    )
    if not ok:
        raise KorchError(
            f"{d}: no {GRAPH_FILE}, and rebuilding the primitive graph from {model} does not match; re-optimize"
        )
    return g


def _kernel_class(nodes: Sequence[int], g: dict) -> str:
    classes = [g["nodes"][n]["class"] for n in nodes]
    if classes.count("linear") > 1:
        return "region"  # Note [Library regions]: several library ops in one session
    if "opaque" in classes:
        return "opaque"
    if "linear" in classes:
        return "linear"
    return "memory"


def _label(nodes: Sequence[int], g: dict, limit: int = 6) -> str:
    ops = [g["nodes"][n]["op"] for n in nodes]
    head = "+".join(ops[:limit])
    return head + (f"+...({len(ops) - limit} more)" if len(ops) > limit else "")


def explain(outdir: str | Path, runs: int = 20, top: int = 15, num_threads: int | None = None) -> dict[str, Any]:
    from korch.api import load
    from korch.bench.suite import bench_feeds

    d = Path(outdir)
    compiled = load(d, num_threads)
    exe = compiled.executable
    g = _load_graph(d, compiled.report)
    feeds = bench_feeds(exe.inputs)
    t = time_steps(exe, feeds, runs)
    ksteps = exe.kernel_steps()  # a native segment's kernels one by one
    count: dict[int, int] = {}
    for st in ksteps:
        for n in st.nodes:
            count[n] = count.get(n, 0) + 1
    kernels = []
    for st, us in zip(ksteps, t["kernel_us"]):
        kernels.append(
            {
                "name": st.name,
                "backend": st.backend,
                "segment": st.meta.get("segment"),  # the native segment running it, or None
                "class": _kernel_class(st.nodes, g),
                "us": us,  # in place: a clock around the step in the executable
                "predicted_us": st.cost_us,  # the BLP's cost: measured alone, plus a step's hand-off, or None
                "primitives": len(st.nodes),
                "redundant": sum(1 for n in st.nodes if count[n] > 1),
                "ops": _label(st.nodes, g),
                "out_shape": g["nodes"][st.outputs[0]]["shape"] if st.outputs else [],
            }
        )
    groups: dict[str, dict[str, float]] = {}
    for k in kernels:
        key = f"{k['class']}/{k['backend']}"
        e = groups.setdefault(key, {"kernels": 0, "us": 0.0})
        e["kernels"] += 1
        e["us"] += k["us"]
    return {
        "outdir": str(d),
        "kernels": kernels,
        "groups": groups,
        # everything outside a kernel's clock: the Python loop between steps, and inside
        # a native segment the calls between its kernels and the one ctypes call
        "dispatch_us": t["dispatch_us"] + t["segment_overhead_us"],
        # Note [Segment overhead] in profile/e2e.py: not dispatch, the kernels' spread
        "spread_us": t.get("segment_spread_us", 0.0),
        "dispatch_us_per_kernel": (t["dispatch_us"] + t["segment_overhead_us"]) / max(1, len(kernels)),
        "segments": sum(1 for st in exe.steps if st.backend == "native-segment"),
        "end_to_end_us": t["end_to_end_us"],
        "plain_end_to_end_us": t["plain_end_to_end_us"],
        "runs": t["runs"],
        "redundant_primitives": sum(c - 1 for c in count.values() if c > 1),
        "top": sorted(kernels, key=lambda k: -k["us"])[:top],
        "report": {
            k: compiled.report.get(k)
            for k in ("latency_ms", "onnxruntime_ms", "predicted_latency_us", "plan_name", "plan_family", "skipped")
        },
        # the share of end-to-end time in kernels korch generated (TVM, Triton)
        "generated_share": sum(k["us"] for k in kernels if k["backend"] in GENERATORS) / max(t["end_to_end_us"], 1e-9),
        "graph": g,
        "steps": ksteps,
    }


def _plan_line(info: dict[str, Any]) -> str:
    r = info["report"]
    name, family = r.get("plan_name"), r.get("plan_family")
    plan = f"plan shipped: {name!r} ({family})" if name else "plan shipped: not recorded"
    return f"{plan}; {100 * info['generated_share']:.1f}% of end-to-end time in korch-generated kernels"


def format_explain(info: dict[str, Any]) -> str:
    e2e = info["end_to_end_us"]
    pct = lambda us: f"{100 * us / e2e:5.1f}%" if e2e > 0 else "  -  "  # noqa: E731
    lines = [
        f"{info['outdir']}: {len(info['kernels'])} kernels ({info.get('segments', 0)} native segments), "
        f"end to end {e2e / 1e3:.3f} ms "
        f"(uninstrumented {info['plain_end_to_end_us'] / 1e3:.3f} ms, {info['runs']} runs), "
        f"{info['redundant_primitives']} redundant primitive computations",
        _plan_line(info),
        "",
        f"{'class/backend':<20} {'kernels':>7} {'ms':>9} {'share':>6}",
    ]
    for key, v in sorted(info["groups"].items(), key=lambda kv: -kv[1]["us"]):
        lines.append(f"{key:<20} {v['kernels']:>7} {v['us'] / 1e3:>9.3f} {pct(v['us'])}")
    lines.append(f"{'dispatch overhead':<20} {'':>7} {info['dispatch_us'] / 1e3:>9.3f} {pct(info['dispatch_us'])}")
    n = max(1, len(info["kernels"]))
    lines.append(f"  ({info['dispatch_us'] / n:.1f} us dispatch per kernel)")
    if info.get("spread_us", 0.0) > 0:
        lines.append(
            f"{'kernels above median':<20} {'':>7} {info['spread_us'] / 1e3:>9.3f} {pct(info['spread_us'])}"
            "  (a call's kernels are not all at their medians at once)"
        )
    pred = info["report"].get("predicted_latency_us")
    if pred and math.isfinite(pred):
        lines.append(f"sum of profiled kernel costs (the BLP's objective): {pred / 1e3:.3f} ms")
    known = [k for k in info["kernels"] if k["predicted_us"]]
    if known:
        a, p = sum(k["predicted_us"] for k in known), sum(k["us"] for k in known)
        lines.append(f"{len(known)} kernels predicted {a / 1e3:.3f} ms, in place {p / 1e3:.3f} ms ({p / a:.2f}x)")
    skipped = info["report"].get("skipped") or []
    if skipped:  # Note [Skipped optimizations]
        units = ", ".join(sorted({f"{r['stage']}:{r['unit']}" for r in skipped}))
        lines.append(f"optimizations skipped (they raised; report.json 'skipped'): {len(skipped)}: {units}")
    lines += [
        "",
        f"top {len(info['top'])} kernels (in place: timed in the executable; predicted: the BLP's cost, measured alone "
        "plus a library step's hand-off, Note [A step outside the segments]):",
        f"{'kernel':<16} {'backend':<7} {'class':<7} {'in place':>9} {'predicted':>9} {'share':>6}  primitives",
    ]
    for k in info["top"]:
        red = f" [{k['redundant']} redundant]" if k["redundant"] else ""
        predicted = f"{k['predicted_us']:>9.1f}" if k["predicted_us"] else f"{'-':>9}"
        lines.append(
            f"{k['name']:<16} {k['backend']:<7} {k['class']:<7} {k['us']:>9.1f} {predicted} {pct(k['us'])}  "
            f"{k['ops']} -> {k['out_shape']}{red}"
        )
    return "\n".join(lines)


# --- pictures -------------------------------------------------------------------------------
def _short(op: str) -> str:
    return op.replace("opaque:", "").replace("reduce_", "r_").replace("broadcast", "bcast")


def to_dot(info: dict[str, Any]) -> str:
    g = info["graph"]
    steps = info["steps"]
    kt = {k["name"]: k for k in info["kernels"]}
    count: dict[int, int] = {}
    for st in steps:
        for n in st.nodes:
            count[n] = count.get(n, 0) + 1
    producer: dict[int, str] = {}  # node -> dot id of the copy written to memory
    out = [
        "digraph korch {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=10, nodesep=0.15, ranksep=0.25, compound=true];',
        '  node [shape=box, style="filled,rounded", fontname="Helvetica", fontsize=9, height=0.25, margin="0.05,0.02"];',
        '  edge [arrowsize=0.5, color="#555555"];',
    ]
    for name, nid in g["inputs"].items():
        out.append(f'  n{nid} [label="{html.escape(name)}", shape=ellipse, fillcolor="#ffffff"];')
        producer[nid] = f"n{nid}"
    for si, st in enumerate(steps):
        k = kt[st.name]
        colour = KERNEL_COLOURS.get(st.backend, "#333333")
        label = f"{st.name} · {st.backend} · {k['us']:.0f} us"
        out.append(f"  subgraph cluster_{si} {{")
        out.append(
            f'    label="{html.escape(label)}"; color="{colour}"; penwidth=2; fontcolor="{colour}"; style=rounded;'
        )
        members = set(st.nodes)
        for n in st.nodes:
            nd = g["nodes"][n]
            red = count[n] > 1
            extra = ', peripheries=2, color="#d7191c", penwidth=1.5' if red else ""
            tip = f"%{n} {nd['op']} {nd['dtype']}{nd['shape']}" + (f" (computed by {count[n]} kernels)" if red else "")
            out.append(
                f'    s{si}_{n} [label="{html.escape(_short(nd["op"]))}", fillcolor="{CLASS_COLOURS.get(nd["class"], "#fff")}", '
                f'tooltip="{html.escape(tip)}"{extra}];'
            )
        out.append("  }")
        for n in st.nodes:
            for src in g["nodes"][n]["inputs"]:
                if src in members:
                    out.append(f"  s{si}_{src} -> s{si}_{n};")
                elif src in producer:
                    out.append(f'  {producer[src]} -> s{si}_{n} [color="#2166ac", penwidth=1.2];')
        for n in st.outputs:
            producer[n] = f"s{si}_{n}"
    for name, nid in g["outputs"].items():
        out.append(f'  out_{nid} [label="{html.escape(name)}", shape=ellipse, fillcolor="#ffffff"];')
        if nid in producer:
            out.append(f"  {producer[nid]} -> out_{nid};")
    out.append("}")
    return "\n".join(out) + "\n"


def to_svg(info: dict[str, Any]) -> str:
    """A dependency-free picture: kernels top to bottom in execution order, each a box of its
    primitives (coloured by class, redundant ones with a red border); memory edges between
    kernels as curves on the left."""
    g = info["graph"]
    steps = info["steps"]
    kt = {k["name"]: k for k in info["kernels"]}
    count: dict[int, int] = {}
    for st in steps:
        for n in st.nodes:
            count[n] = count.get(n, 0) + 1
    per_row, cw, ch, pad, left = 8, 74, 20, 6, 60
    width = left + per_row * (cw + pad) + pad + 260
    y = 40
    boxes = []
    pos: dict[tuple[int, int], tuple[float, float]] = {}
    producer_y: dict[int, float] = {}
    edges = []
    for si, st in enumerate(steps):
        rows = (len(st.nodes) + per_row - 1) // per_row
        h = 18 + rows * (ch + pad) + pad
        boxes.append((si, y, h))
        for j, n in enumerate(st.nodes):
            pos[(si, n)] = (left + pad + (j % per_row) * (cw + pad), y + 18 + (j // per_row) * (ch + pad))
        for src in sorted({s for n in st.nodes for s in g["nodes"][n]["inputs"] if s not in set(st.nodes)}):
            if src in producer_y:
                edges.append((producer_y[src], y + 9))
        for n in st.outputs:
            producer_y[n] = y + h - 4
        y += h + 10
    height = y + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="Helvetica,Arial,sans-serif" font-size="10">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" font-size="13">{html.escape(info["outdir"])}: {len(steps)} kernels, '
        f"{info['end_to_end_us'] / 1e3:.3f} ms end to end (red border = redundant primitive)</text>",
    ]
    for a, b in edges:
        bend = left - 12 - min(40, abs(b - a) / 20)
        parts.append(
            f'<path d="M {left - 2} {a} C {bend} {a}, {bend} {b}, {left - 2} {b}" stroke="#2166ac" stroke-opacity="0.35" fill="none"/>'
        )
    for si, y0, h in boxes:
        st = steps[si]
        k = kt[st.name]
        colour = KERNEL_COLOURS.get(st.backend, "#333333")
        parts.append(
            f'<g class="kernel" id="{html.escape(st.name)}"><title>{html.escape(st.name)} {html.escape(k["ops"])}</title>'
        )
        parts.append(
            f'<rect x="{left}" y="{y0}" width="{per_row * (cw + pad) + pad}" height="{h}" rx="5" fill="none" stroke="{colour}" stroke-width="2"/>'
        )
        parts.append(
            f'<text x="{left + per_row * (cw + pad) + 2 * pad}" y="{y0 + 13}" fill="{colour}">{html.escape(st.name)} · '
            f"{st.backend} · {k['class']} · {k['us']:.0f} us</text>"
        )
        for n in st.nodes:
            nd = g["nodes"][n]
            x, yy = pos[(si, n)]
            red = count[n] > 1
            stroke = 'stroke="#d7191c" stroke-width="2"' if red else 'stroke="#666" stroke-width="0.5"'
            parts.append(
                f'<rect x="{x}" y="{yy}" width="{cw}" height="{ch}" rx="3" fill="{CLASS_COLOURS.get(nd["class"], "#fff")}" {stroke}>'
                f"<title>%{n} {html.escape(nd['op'])} {nd['dtype']}{nd['shape']}</title></rect>"
            )
            parts.append(f'<text x="{x + 3}" y="{yy + 14}">{html.escape(_short(nd["op"])[:12])}</text>')
        parts.append("</g>")
    lx = 10
    for cls, col in CLASS_COLOURS.items():
        if cls == "source":
            continue
        parts.append(f'<rect x="{lx}" y="{height - 25}" width="12" height="12" fill="{col}" stroke="#666"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 15}">{cls}</text>')
        lx += 90
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def render(info: dict[str, Any], stem: str | Path, renderer: str = "auto") -> list[Path]:
    """Write STEM.dot always; STEM.svg (+ STEM.png) with Graphviz, else the Python SVG."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    dot_src = to_dot(info)
    dot_path = stem.with_suffix(".dot")
    dot_path.write_text(dot_src)
    written.append(dot_path)
    dot = shutil.which("dot") if renderer in ("auto", "dot") else None
    if renderer == "dot" and not dot:
        raise KorchError("Graphviz `dot` is not installed (apt-get install graphviz); use --renderer python")
    if dot:
        try:
            for fmt in ("svg", "png"):
                p = stem.with_suffix(f".{fmt}")
                subprocess.run(
                    [dot, f"-T{fmt}", "-o", str(p), str(dot_path)], check=True, timeout=300, capture_output=True
                )
                written.append(p)
            return written
        except (subprocess.SubprocessError, OSError):
            pass  # fall back to the Python picture
    p = stem.with_suffix(".svg")
    p.write_text(to_svg(info))
    written.append(p)
    return written


def explain_json(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in ("graph", "steps")}


__all__ = ["explain", "format_explain", "render", "to_dot", "to_svg"]
