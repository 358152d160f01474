"""Near ties measured twice (Note [Confirming near ties]), after the profile step."""

from __future__ import annotations

import dataclasses
import math

# Note [Confirming near ties]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# One measurement of a kernel is one sample of a noisy machine: on this VM the same
# onnxruntime region of yolo_block measured 143 us in one run and 208 us in the next,
# and the run that saw 208 built its plan around it, 1.3x slower end to
# end than the other run's. Interference only ever slows a kernel, so a second
# measurement at another moment, keeping the faster median, is closer to the kernel's
# own time. Measuring everything twice would double profiling; what decides the plan
# is the near ties. So once profiling is done, per partition: the plan on measured
# costs, and the plan with every measured kernel *not* in it made ``confirm_margin``
# cheaper. The kernels on which the two differ (the rivals within the margin of
# winning, and the choices they would displace) are measured once more (a database
# row of their own, config ``...#2``, so a resumed run re-measures nothing), at most
# ``CONFIRM_MAX``, largest first, none over ``CONFIRM_MAX_US`` (relative noise is
# small there and a second measurement dear). Report: ``measurements_confirmed``,
# and ``confirmed_faster``: how many came out more than 10% faster the second time.
CONFIRM_MAX = 24
CONFIRM_MAX_US = 50_000.0


def confirm_near_ties(ctx, workloads: dict, results: dict, db, pool) -> tuple[int, int]:
    """Measure the near ties of every partition's plan once more (Note [Confirming
    near ties]); ``results`` keeps each one's faster median. Returns (kernels measured
    again, how many came out more than 10% faster)."""
    from korch.orchestrate import OrchestrationError, solve
    from korch.profile import profile

    g, s = ctx.graph, ctx.settings
    margin = s.confirm_margin
    if margin <= 0:
        return 0, 0
    best: dict[str, tuple[float, str]] = {}  # workload -> (measured cost, its backend)
    for (h, b), m in results.items():
        if m.ok and m.median_us is not None and m.median_us < best.get(h, (math.inf, ""))[0]:
            best[h] = (m.median_us, b)
    by_part: dict[int, list] = {}
    for c in ctx.candidates:
        by_part.setdefault(c.partition, []).append(c)
    todo: set[str] = set()
    for pi, part in enumerate(ctx.partitions):
        cands = by_part.get(pi, [])
        costs = [best.get(c.hash, (math.inf, ""))[0] for c in cands]
        if len(cands) < 2:
            continue
        kernels = [c.kernel for c in cands]
        try:
            plan = solve(g, part, kernels, costs, time_limit_s=s.blp_time_limit_s)
            chosen = {cands[i].hash for i in plan.chosen}
            cheaper = [x if c.hash in chosen else x * (1.0 - margin) for c, x in zip(cands, costs)]
            alt = solve(g, part, kernels, cheaper, time_limit_s=s.blp_time_limit_s)
        except OrchestrationError:
            continue
        todo |= chosen ^ {cands[i].hash for i in alt.chosen}
    todo = {h for h in todo if h in best and best[h][0] <= CONFIRM_MAX_US}
    picked = sorted(todo, key=lambda h: (-best[h][0], h))[:CONFIRM_MAX]
    if not picked:
        return 0, 0
    again = [
        dataclasses.replace(workloads[h], backends=(best[h][1],), config=workloads[h].config + "#2") for h in picked
    ]
    second, _ = profile(again, db, s.target, s, progress=s.progress, pool=pool)
    faster = 0
    for h in picked:
        b = best[h][1]
        m2 = second.get((h, b))
        if m2 is None or not m2.ok or m2.median_us is None:
            continue
        if m2.median_us < 0.9 * best[h][0]:
            faster += 1
        if m2.median_us < best[h][0]:
            results[(h, b)] = dataclasses.replace(results[(h, b)], median_us=m2.median_us)
    return len(picked), faster
