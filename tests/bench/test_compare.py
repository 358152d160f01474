"""Timing harness: engines alternate in blocks (Note [Timing in blocks])."""

from korch.profile.e2e import time_alternating, time_shuffled


def test_engines_alternate_in_blocks_and_drop_each_blocks_first_call():
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("a", "b")}
    out = time_alternating(fns, rounds=4, block=3)
    # two warm-up calls each, then per round a block of three per engine, odd rounds
    # in reverse order (no engine always runs right after the same other one)
    assert calls[:4] == ["a", "a", "b", "b"]
    assert calls[4:] == (["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3) * 2
    assert out["a"]["runs"] == out["b"]["runs"] == 4 * 2


def test_block_of_one_keeps_every_call():
    fns = {"a": lambda: None}
    assert time_alternating(fns, rounds=5, block=1)["a"]["runs"] == 5


def test_rel_cancels_drift_between_rounds(monkeypatch):
    # a fake clock: engine "a" takes 2 units, "b" 1 unit, and the machine's speed
    # changes 10x from round to round; the medians mix the phases, rel does not
    import korch.profile.e2e as C

    now = [0.0]
    calls = [0]

    def engine(units):
        def fn():
            calls[0] += 1
            round_no = max(0, calls[0] - 5) // 6  # 4 warm-up calls, then 6 per round
            now[0] += units * (10.0 if round_no % 2 else 1.0)

        return fn

    monkeypatch.setattr(C.time, "perf_counter", lambda: now[0])
    out = C.time_alternating({"a": engine(2.0), "b": engine(1.0)}, rounds=6, block=3)
    assert abs(out["a"]["rel"] / out["b"]["rel"] - 2.0) < 1e-9
    assert abs(out["a"]["rel"] * out["b"]["rel"] - 1.0) < 1e-9


def test_quiesce_waits_for_a_spinning_thread_to_stop():
    # Note [Engines in their own processes]: a thread busy for 60 ms after a call is
    # waited for; an idle process returns after one quiet window
    import threading
    import time

    from korch.profile.e2e import quiesce

    assert quiesce() < 0.1

    def spin(until):
        while time.monotonic() < until:
            pass

    threading.Thread(target=spin, args=(time.monotonic() + 0.06,), daemon=True).start()
    waited = quiesce()
    assert 0.05 <= waited < 0.5


def test_quiesce_first_runs_before_each_block(monkeypatch):
    import korch.profile.e2e as C

    log: list[str] = []
    monkeypatch.setattr(C, "quiesce", lambda: log.append("q") or 0.0)
    fns = {k: (lambda k=k: log.append(k)) for k in ("a", "b")}
    C.time_alternating(fns, rounds=2, block=2, quiesce_first=True)
    assert log[4:] == ["q", "a", "a", "q", "b", "b", "q", "b", "b", "q", "a", "a"]  # odd rounds reversed


def test_slow_engines_get_blocks_of_two(monkeypatch):
    # calls of SLOW_BLOCK_CALL_MS or more: one dropped call and one kept per block
    import korch.profile.e2e as C

    now = [0.0]

    def engine():
        now[0] += C.SLOW_BLOCK_CALL_MS / 1e3

    monkeypatch.setattr(C.time, "perf_counter", lambda: now[0])
    out = C.time_alternating({"a": engine, "b": engine}, rounds=4, block=None)
    assert out["a"]["block"] == 2 and out["a"]["runs"] == 4
    fast = C.time_alternating({"a": lambda: None}, rounds=2, block=None)
    assert fast["a"]["block"] >= 3


def test_shuffled_rounds_give_one_median_per_round_per_engine():
    calls = {"a": 0, "b": 0}

    def engine(k):
        def fn():
            calls[k] += 1

        return fn

    out = time_shuffled({k: engine(k) for k in calls}, rounds=4, calls=5, warmup=2)
    assert {k: len(v) for k, v in out.items()} == {"a": 4, "b": 4}
    assert calls == {"a": 4 * (2 + 5), "b": 4 * (2 + 5)}


def test_over_processes_takes_the_median_of_each_processs_median():
    # Note [Medians over processes]: one unlucky process moves an engine no more than one round does
    from korch.profile.e2e import over_processes

    def one(med_a, med_b):
        return {
            k: {"median_ms": m, "p10_ms": m, "p90_ms": m, "runs": 4, "rel": 1.0, "round_ms": [m, m], "block": 3}
            for k, m in (("a", med_a), ("b", med_b))
        }

    out = over_processes([one(1.0, 2.0), one(1.1, 9.0), one(5.0, 2.2)])
    assert out["a"]["median_ms"] == 1.1 and out["b"]["median_ms"] == 2.2
    assert out["a"]["process_ms"] == [1.0, 1.1, 5.0] and out["a"]["processes"] == 3
    assert out["a"]["runs"] == 12 and len(out["a"]["round_ms"]) == 6
    # an engine missing from a set (a peer that did not start again) is combined over the rest
    partial = over_processes([one(1.0, 2.0), {"a": one(3.0, 0)["a"]}])
    assert partial["b"]["processes"] == 1 and partial["b"]["median_ms"] == 2.0
    assert partial["a"]["median_ms"] == 2.0
    # a single set is passed through, its call-level spread kept
    assert over_processes([one(1.0, 2.0)])["a"]["p10_ms"] == 1.0
