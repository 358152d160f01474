"""Elementwise primitives and literals as Triton expressions (``korch.kernels.triton.lower``).

``ew_code`` is the expression of an elementwise primitive on its inputs' expressions;
transcendental functions of float16 are computed in float32.
"""

from __future__ import annotations

import math

from korch.ir.graph import Node
from korch.ir.ops import Op
from korch.kernels.triton.index import paren

FLOAT_DTYPES = ("float32", "float16", "float64")
TRANSCENDENTAL = frozenset({Op.EXP, Op.LOG, Op.SQRT, Op.TANH, Op.ERF, Op.SIGMOID, Op.POW})
TL_DTYPE = {
    "float32": "tl.float32",
    "float16": "tl.float16",
    "float64": "tl.float64",
    "int64": "tl.int64",
    "int32": "tl.int32",
    "int8": "tl.int8",
    "uint8": "tl.uint8",
    "bool": "tl.int1",
}


def literal(value, dtype: str) -> str:
    if dtype == "bool":
        return "True" if value else "False"
    if dtype in FLOAT_DTYPES:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))


def ew_code(node: Node, args: list[str], in_dtypes: list[str]) -> str:
    op, dt = node.op, node.dtype
    a = [paren(x) for x in args]
    if op is Op.CAST:
        to = node.attr("to")
        if to == "bool":
            return f"{a[0]} != 0"
        return f"{a[0]}.to({TL_DTYPE[to]})"
    if op in TRANSCENDENTAL and dt == "float16":
        up = [f"{x}.to(tl.float32)" if not _is_literal(r) else r for x, r in zip(a, args)]
        return f"({_ew_float(op, up)}).to(tl.float16)"
    if op in TRANSCENDENTAL:
        return _ew_float(op, [r if _is_literal(r) else x for x, r in zip(a, args)])
    if op is Op.NEG:
        return f"0 - {a[0]}" if dt == "uint8" else f"-{a[0]}"
    if op is Op.ABS:
        return f"tl.abs({a[0]})"
    if op is Op.FLOOR:
        return f"tl.floor({a[0]})"
    if op is Op.CEIL:
        return f"tl.ceil({a[0]})"
    if op is Op.NOT:
        return f"{a[0]} == 0"
    if op is Op.RECIPROCAL:
        return f"1.0 / {a[0]}"
    if op is Op.WHERE:
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"
    binop = {
        Op.ADD: "+",
        Op.SUB: "-",
        Op.MUL: "*",
        Op.DIV: "/",
        Op.EQUAL: "==",
        Op.LESS: "<",
        Op.GREATER: ">",
        Op.AND: "&",
        Op.OR: "|",
    }
    if op in binop:
        return f"{a[0]} {binop[op]} {a[1]}"
    if op is Op.MAX:
        return f"tl.maximum({args[0]}, {args[1]})"
    if op is Op.MIN:
        return f"tl.minimum({args[0]}, {args[1]})"
    raise NotImplementedError(op)


def _is_literal(x: str) -> bool:
    try:
        float(x)
        return True
    except ValueError:
        return x.startswith("float(")


def _ew_float(op: Op, a: list[str]) -> str:
    x = a[0]
    if op is Op.EXP:
        return f"tl.exp({x})"
    if op is Op.LOG:
        return f"tl.log({x})"
    if op is Op.SQRT:
        return f"tl.sqrt({x})"
    if op is Op.ERF:
        return f"tl.erf({x})"
    if op is Op.SIGMOID:
        return f"tl.sigmoid({x})"
    if op is Op.TANH:
        # sign(x) (1 - e) / (1 + e) with e = exp(-2|x|): no overflow, exact sign
        e = f"tl.exp(-2.0 * tl.abs({x}))"
        return f"tl.where({x} < 0, -1.0, 1.0) * (1.0 - {e}) / (1.0 + {e})"
    if op is Op.POW:
        b = a[1]
        if _is_literal(b) and not b.startswith("float("):
            e = float(b)
            if e == 1.0:
                return x
            if e == 2.0:
                return f"{x} * {x}"
            if e == 3.0:
                return f"{x} * {x} * {x}"
            if e == 0.5:
                return f"tl.sqrt({x})"
            if e == -1.0:
                return f"1.0 / {x}"
            if e == int(e):
                odd = int(e) % 2 == 1
                mag = f"tl.exp({e!r} * tl.log(tl.abs({x})))"
                return f"tl.where({x} < 0, -{mag}, {mag})" if odd else mag
        return f"tl.exp({b} * tl.log({x}))"
    raise NotImplementedError(op)
