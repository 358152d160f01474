"""Note [Static memory plan]: offsets of the arena plan on hand-built step lists."""

from __future__ import annotations

from korch.executable import ARENA_ALIGN, Step, plan_arena


class _Planned:  # a kernel that writes into given memory
    def run_into(self, args, outs): ...


class _Views:  # a kernel that may return views of its inputs (numpy reshape)
    run_into = None


def _step(i, ins, outs, kernel):
    return Step(f"k{i}", "x", "w", (), tuple(ins), tuple(outs), kernel)


def _overlap(offs, size, a, b):
    return not (offs[a] + size[a] <= offs[b] or offs[b] + size[b] <= offs[a])


def test_chain_reuses_memory_and_never_overlaps_live_tensors():
    # 0 -> 1 -> 2 -> 3 -> 4 (model output): each tensor is read by the next step only
    steps = [_step(i, [i], [i + 1], _Planned()) for i in range(4)]
    size = {1: 1000, 2: 1000, 3: 1000}
    offs, total = plan_arena(steps, size, keep={4})
    assert all(o % ARENA_ALIGN == 0 for o in offs.values())
    assert not _overlap(offs, size, 1, 2) and not _overlap(offs, size, 2, 3)  # read while written
    assert offs[1] == offs[3]  # 1 is dead when 3 is written
    assert total == 2 * 1024


def test_view_returning_step_extends_its_input_lifetime():
    # 1 is read by a view step (-> 2, a view of 1) and 2 is read at the last step:
    # 1's memory must stay untouched until then, so 3 cannot reuse it
    steps = [
        _step(0, [0], [1], _Planned()),
        _step(1, [1], [2], _Views()),
        _step(2, [2], [3], _Planned()),
        _step(3, [3, 2], [4], _Planned()),
    ]
    size = {1: 640, 3: 640}
    offs, _ = plan_arena(steps, size, keep={4})
    assert _overlap(offs, size, 1, 1) and not _overlap(offs, size, 1, 3)


def test_kept_outputs_are_never_reused():
    steps = [_step(0, [0], [1], _Planned()), _step(1, [0], [2], _Planned()), _step(2, [2], [3], _Planned())]
    size = {1: 64, 2: 64, 3: 64}
    offs, _ = plan_arena(steps, size, keep={1})
    assert not _overlap(offs, size, 1, 2) and not _overlap(offs, size, 1, 3)
