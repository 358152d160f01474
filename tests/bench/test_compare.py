"""Timing harness: engines alternate in blocks (Note [Timing in blocks])."""

from korch.bench.compare import time_alternating


def test_engines_alternate_in_blocks_and_drop_each_blocks_first_call():
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("a", "b")}
    out = time_alternating(fns, rounds=4, block=3)
    # two warm-up calls each, then per round a block of three per engine
    assert calls[:4] == ["a", "a", "b", "b"]
    assert calls[4:] == (["a"] * 3 + ["b"] * 3) * 4
    assert out["a"]["runs"] == out["b"]["runs"] == 4 * 2


def test_block_of_one_keeps_every_call():
    fns = {"a": lambda: None}
    assert time_alternating(fns, rounds=5, block=1)["a"]["runs"] == 5
