"""onnxruntime's whole-model time per node, from its own profiler: what to hold each of
korch's kernels against (``korch explain OUT --threads 2`` gives korch's side in place).

    python benchmarks/ort_nodes.py MODEL.onnx [--threads 2] [--runs 30] [--top 40]

Prints the total, the time per operator type and the slowest nodes (median over the
runs, us). onnxruntime's node names end in ``_nchwc`` where its NCHWc transformer
rewrote them, and a fused Conv's time includes its activation and sum. Random inputs
(floats uniform, integers 1). A benchmark: prints, never fails on a timing.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "ort")
        s = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
        feeds = {}
        for i in s.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            feeds[i.name] = (
                np.random.rand(*shape).astype(np.float32) if "float" in i.type else np.ones(shape, dtype=np.int64)
            )
        for _ in range(5):
            s.run(None, feeds)
        for _ in range(args.runs):
            s.run(None, feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    per: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[(e["name"][: -len("_kernel_time")], e["args"].get("op_name", "?"))].append(e["dur"])
    rows = sorted(((statistics.median(v), k) for k, v in per.items()), reverse=True)
    print(f"total {sum(r[0] for r in rows) / 1000:.2f} ms over {len(rows)} nodes ({args.threads} threads)")
    by_op: collections.Counter[str] = collections.Counter()
    for t, (_, op) in rows:
        by_op[op] += t
    for op, t in by_op.most_common():
        print(f"  {op:24s} {t / 1000:8.2f} ms")
    for t, (name, op) in rows[: args.top]:
        print(f"{t:8.0f} us  {op:14s} {name}")


if __name__ == "__main__":
    main()
