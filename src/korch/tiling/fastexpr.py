"""A tiny expression builder that compiles the tiling model to Python without sympy.

Note [Fast model algebra]
~~~~~~~~~~~~~~~~~~~~~~~~~
``TemplateModel`` builds its expressions through an *algebra*: sympy (the symbolic
form, for reading and printing) or this one. Here every operation on a variable
appends one line of straight-line Python (``x12 = x3 * x7``) to a ``Builder``;
identical lines are shared (hash-consing, so common subexpressions are computed once)
and operations on plain numbers are folded by Python itself. ``compile`` keeps the
lines the requested outputs depend on and ``exec``s one function, which runs with the
scalar (``math``) or the numpy function table of ``model.py``: the same numbers as
sympy's ``lambdify`` of the symbolic form, built ~100x faster (sympy's printing and
CSE took 150-250 ms per kernel, which made predicting 1,000 candidates take minutes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence


def _lit(x) -> str:
    t = type(x)
    if t is int:
        return str(x)
    if t is float:
        return repr(x)
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        return str(int(x))
    return repr(float(x))


def _ref(x) -> str:
    return x.name if type(x) is Ex else _lit(x)


class Builder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, tuple[str, ...]]] = []  # (name, rhs, deps)
        self.memo: dict[str, Ex] = {}

    def var(self, name: str) -> Ex:
        return Ex(self, name)

    def _emit(self, rhs: str, args) -> Ex:
        hit = self.memo.get(rhs)
        if hit is not None:
            return hit
        name = f"_x{len(self.lines)}"
        self.lines.append((name, rhs, tuple(a.name for a in args if type(a) is Ex)))
        e = self.memo[rhs] = Ex(self, name)
        return e

    def bin(self, op: str, a, b) -> Ex:
        return self._emit(f"({_ref(a)} {op} {_ref(b)})", (a, b))

    def call(self, fn: str, args) -> Ex:
        return self._emit(fn + "(" + ", ".join(_ref(a) for a in args) + ")", args)

    def compile(self, params: Sequence[str], outputs: Sequence, funcs: Mapping[str, Callable]) -> Callable:
        """A function ``f(*params) -> list`` of ``outputs`` (expressions or numbers)."""
        need: set[str] = {o.name for o in outputs if isinstance(o, Ex)}
        body = []
        for name, rhs, deps in reversed(self.lines):
            if name in need:
                body.append(f"    {name} = {rhs}")
                need.update(deps)
        body.reverse()
        ret = ", ".join(_ref(o) for o in outputs)
        src = f"def _f({', '.join(params)}):\n" + "\n".join(body) + f"\n    return [{ret}]\n"
        ns: dict = dict(funcs)
        code = _CODE.get(src)
        if code is None:
            # a model's kernels repeat programs: segformer_b1's first 600 workloads compiled
            # 3071 programs in 2.1 s (of 15 s of tiling prediction), 2090 with this cache
            code = _CODE[src] = compile(src, "<korch.tiling model>", "exec")
            if len(_CODE) > _CODE_MAX:
                _CODE.pop(next(iter(_CODE)))
        exec(code, ns)  # noqa: S102 - our own generated code
        fn = ns["_f"]
        fn.source = src
        return fn


_CODE: dict[str, object] = {}  # generated source -> code object
_CODE_MAX = 4096


class Ex:
    """A value computed by a line of the builder's program."""

    __slots__ = ("b", "name")

    def __init__(self, b: Builder, name: str):
        self.b, self.name = b, name

    def __add__(self, o):
        if type(o) is not Ex and o == 0:
            return self
        return self.b.bin("+", self, o)

    def __radd__(self, o):
        return self.__add__(o)

    def __sub__(self, o):
        if type(o) is not Ex and o == 0:
            return self
        return self.b.bin("-", self, o)

    def __rsub__(self, o):
        return self.b.bin("-", o, self)

    def __mul__(self, o):
        if type(o) is not Ex and o == 1:
            return self
        return self.b.bin("*", self, o)

    def __rmul__(self, o):
        return self.__mul__(o)

    def __truediv__(self, o):
        if type(o) is not Ex and o == 1:
            return self
        return self.b.bin("/", self, o)

    def __rtruediv__(self, o):
        return self.b.bin("/", o, self)

    def __neg__(self):
        return self.b.bin("*", -1, self)

    def __repr__(self) -> str:
        return f"Ex({self.name})"


def is_num(x) -> bool:
    return not isinstance(x, Ex)


class FastAlgebra:
    """The operations ``TemplateModel`` needs, on ``Ex`` values and plain numbers."""

    name = "fast"

    def __init__(self) -> None:
        self.b = Builder()

    def sym(self, name: str) -> Ex:
        return self.b.var(name)

    def integer(self, n: int):
        return int(n)

    def rational(self, n: int, d: int):
        return int(n) if d == 1 else n / d

    def number(self, x: float):
        return x

    def mul(self, xs: Sequence):
        out = 1
        for x in xs:
            out = out * x
        return out

    def add(self, xs: Sequence):
        out = 0
        for x in xs:
            out = out + x
        return out

    def _call(self, fn: str, args: Sequence):
        return self.b.call(fn, args)

    def max(self, *args):
        if len(args) == 1:
            return args[0]
        nums = [a for a in args if is_num(a)]
        rest = [a for a in args if not is_num(a)]
        if not rest:
            return max(nums)
        return self._call("vmax", rest + ([max(nums)] if nums else []))

    def min(self, *args):
        if len(args) == 1:
            return args[0]
        nums = [a for a in args if is_num(a)]
        rest = [a for a in args if not is_num(a)]
        if not rest:
            return min(nums)
        return self._call("vmin", rest + ([min(nums)] if nums else []))

    def ceil(self, e):
        if isinstance(e, int):
            return e
        if is_num(e):
            return math.ceil(e - 1e-9)
        return self._call("vceil", [e])

    def ge(self, x, threshold, then, other):
        if is_num(x):
            return then if x >= threshold else other
        return self._call("vge", [x, threshold, then, other])

    def eq(self, x, y, then, other):
        if is_num(x) and is_num(y):
            return then if abs(x - y) < 1e-9 else other
        return self._call("veq", [x, y, then, other])

    def compile(self, symbols: Sequence[Ex], outputs: Sequence, funcs: Mapping[str, Callable]) -> Callable:
        return self.b.compile([s.name for s in symbols], outputs, funcs)
