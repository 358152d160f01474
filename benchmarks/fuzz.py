"""Fuzz the frontend and fission with mutated ONNX models (issue 6, item 3).

    .venv/bin/python benchmarks/fuzz.py [--cases 1200] [--seed 0]

Each case is (seed model, mutation, random choices) from a seeded generator, run
through the cheap path (load, fission, verify, partition, identify) in a child process
with a 60 s time limit and a 3 GB memory limit (korch.models.fuzz.Runner). Prints
cases tried, results, errors by kind, crashes and hangs (each with its case, so it
can be replayed with korch.models.fuzz.case(seed, kind, rng_seed)).
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time

from korch.models.fuzz import KINDS, SEEDS, Runner, case, error_kind, one_line_ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    gen = random.Random(args.seed)
    runner = Runner(timeout_s=args.timeout, memory_mb=3000.0)
    status = collections.Counter()
    by_mutation: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    kinds = collections.Counter()
    findings = []
    t0 = time.perf_counter()
    try:
        for i in range(args.cases):
            seed, kind, rng_seed = gen.choice(SEEDS), gen.choice(KINDS), gen.randrange(2**32)
            st, msg = runner.run(case(seed, kind, rng_seed))
            if st == "error" and not one_line_ok(msg):
                st = "bad message"
            status[st] += 1
            by_mutation[kind][st] += 1
            if st == "error":
                kinds[error_kind(msg)] += 1
            elif st != "ok":
                findings.append((seed, kind, rng_seed, st, msg))
                print(f"  {st}: case({seed!r}, {kind!r}, {rng_seed}): {msg}", flush=True)
            if (i + 1) % 100 == 0:
                print(f"  {i + 1} cases, {dict(status)}, {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        runner.close()
    print(f"\ncases tried: {args.cases} ({time.perf_counter() - t0:.0f} s)")
    print(f"results: {status['ok']}   one-line errors: {status['error']}")
    print(f"crashes: {status['crash'] + status['bad message']}   hangs: {status['hang']}")
    print("\nby mutation (ok / error):")
    for kind in KINDS:
        c = by_mutation[kind]
        print(
            f"  {kind:<18} {c['ok']:>4} / {c['error']:<4}"
            + (f"  FINDINGS {c.total() - c['ok'] - c['error']}" if c.total() - c["ok"] - c["error"] else "")
        )
    print("\nerrors by kind:")
    for k, n in kinds.most_common():
        print(f"  {n:>5}  {k}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
