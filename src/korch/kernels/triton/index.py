"""Integer index expressions for the Triton generator (Note [Triton row tiles] in
``triton_lower``): an ``Ix`` is Triton source text for an integer block expression,
with the tile variables it depends on and its value when constant; the helpers fold
constants and map indices through flatten / unflatten / reshape."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Ix:
    code: str
    deps: frozenset[str] = frozenset()
    const: int | None = None


def C(v: int) -> Ix:
    return Ix(str(int(v)), frozenset(), int(v))


def paren(code: str) -> str:
    return code if code.isidentifier() or code.lstrip("-").isdigit() else f"({code})"


def ix_add(a: Ix, b: Ix) -> Ix:
    if a.const is not None and b.const is not None:
        return C(a.const + b.const)
    if a.const == 0:
        return b
    if b.const == 0:
        return a
    if b.const is not None and b.const < 0:
        return Ix(f"{a.code} - {-b.const}", a.deps)
    return Ix(f"{a.code} + {b.code}", a.deps | b.deps)


def ix_sub(a: Ix, b: Ix) -> Ix:
    if b.const is not None:
        return ix_add(a, C(-b.const))
    if a.const is not None and a.const == 0:
        return Ix(f"-{paren(b.code)}", b.deps)
    return Ix(f"{a.code} - {paren(b.code)}", a.deps | b.deps)


def ix_mul(a: Ix, c: int) -> Ix:
    if a.const is not None:
        return C(a.const * c)
    if c == 0:
        return C(0)
    if c == 1:
        return a
    return Ix(f"{paren(a.code)} * {c}", a.deps)


def ix_div(a: Ix, c: int) -> Ix:
    """Floor division of a non-negative index by a positive constant."""
    if a.const is not None:
        return C(a.const // c)
    if c == 1:
        return a
    return Ix(f"{paren(a.code)} // {c}", a.deps)


def ix_mod(a: Ix, c: int) -> Ix:
    if a.const is not None:
        return C(a.const % c)
    if c == 1:
        return C(0)
    return Ix(f"{paren(a.code)} % {c}", a.deps)


def ix_min(a: Ix, c: int) -> Ix:
    if a.const is not None:
        return C(min(a.const, c))
    return Ix(f"tl.minimum({a.code}, {c})", a.deps)


def ix_max(a: Ix, c: int) -> Ix:
    if a.const is not None:
        return C(max(a.const, c))
    return Ix(f"tl.maximum({a.code}, {c})", a.deps)


def flatten(idx: list[Ix], shape: tuple[int, ...]) -> Ix:
    flat = C(0)
    for i, d in zip(idx, shape):
        flat = ix_add(ix_mul(flat, d), i)
    return flat


def unflatten(flat: Ix, shape: tuple[int, ...], total: int | None = None) -> list[Ix]:
    """Row-major multi-index of ``flat`` in ``shape``; the leading division needs no modulo
    when ``flat < prod(shape)`` (``total`` = its bound, if known)."""
    out: list[Ix] = []
    stride = 1
    strides = []
    for d in reversed(shape):
        strides.append(stride)
        stride *= d
    strides.reverse()
    for k, (d, s) in enumerate(zip(shape, strides)):
        if d == 1:
            out.append(C(0))
            continue
        q = ix_div(flat, s)
        out.append(q if k == 0 and (total is None or total <= stride) else ix_mod(q, d))
    return out


def reshape_index(idx: list[Ix], out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> list[Ix]:
    """Index of ``in_shape`` for an index of ``out_shape`` (same element count), matching
    equal leading and trailing dims so that common reshapes stay cheap."""
    out_l, in_l, idx_l = list(out_shape), list(in_shape), list(idx)
    head: list[Ix] = []
    while out_l and in_l and out_l[0] == in_l[0]:
        head.append(idx_l.pop(0))
        out_l.pop(0)
        in_l.pop(0)
    tail: list[Ix] = []
    while out_l and in_l and out_l[-1] == in_l[-1]:
        tail.insert(0, idx_l.pop())
        out_l.pop()
        in_l.pop()
    mid_idx = [i for i, d in zip(idx_l, out_l) if d != 1]
    mid_out = tuple(d for d in out_l if d != 1)
    if not in_l:
        mid: list[Ix] = []
    elif not mid_out:
        mid = [C(0) for _ in in_l]
    else:
        mid = unflatten(flatten(mid_idx, mid_out), tuple(in_l), math.prod(mid_out))
    return head + mid + tail


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def pow2_floor(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)
