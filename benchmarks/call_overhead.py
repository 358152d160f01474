"""What korch's Executable adds to a call, on an executable of one onnxruntime kernel.

    python benchmarks/call_overhead.py OUTDIR [--rounds 40] [--calls 200]

OUTDIR is a korch output folder (``korch optimize`` / ``korch example``) whose plan is
one onnxruntime kernel, e.g. ``korch example attention -o OUT`` then
``OUT/attention``. Times, in one process, the Executable's call, the kernel's call
(``OrtKernel``) and the kernel's session run with the same arrays, in shuffled order
round by round (medians of per-round medians). The difference between the first and
the last is the wrapper's cost (Note [Call overhead] in ``korch/executable``). A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics

from korch.api import load
from korch.profile.e2e import random_feeds, time_shuffled


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdir")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    compiled = load(args.outdir)
    exe = compiled.executable
    if len(exe.steps) != 1 or exe.steps[0].backend != "ort":
        raise SystemExit(f"{args.outdir}: not one onnxruntime kernel ({len(exe.steps)} steps)")
    feeds = random_feeds(exe.inputs)
    kernel = exe.steps[0].kernel
    run, names = kernel._run, kernel.output_names
    by_node = {spec.node: feeds[name] for name, spec in exe.inputs.items()} | dict(exe.consts)
    args_in = [by_node[i] for i in exe.steps[0].inputs]
    feed = {n: args_in[pos] for n, pos in zip(kernel.feed_names, kernel.feed_positions)}
    fns = {
        "executable": lambda: compiled(feeds),
        "kernel": lambda: kernel(args_in),
        "session run": lambda: run(names, feed, None),
    }
    per_round = {k: [t * 1e6 for t in v] for k, v in time_shuffled(fns, args.rounds, args.calls).items()}
    base = statistics.median(per_round["session run"])
    for name, v in per_round.items():
        med = statistics.median(v)
        print(f"{name:12s} {med:9.1f} us  (+{med - base:5.1f} us over the session run)")


if __name__ == "__main__":
    main()
