"""A text form of the primitive graph that prints and parses back.

    %0 = input() {'name': 'x'} : float32[2, 8]
    %1 = const() {'value': 0.5} : float32[]
    %2 = mul(%0, %1) : float32[2, 8]
    %3 = reduce_sum(%2) {'axes': (1,)} : float32[2, 1]
    output 'y' = %3

Attributes are a Python dict literal; tensors of named constants are not printed.
"""

from __future__ import annotations

import ast
import re

import numpy as np

from korch.ir.graph import Graph, GraphBuilder, _freeze
from korch.ir.ops import Op

_LINE = re.compile(r"^%(\d+) = (\w+)\(([^)]*)\)(?: (\{.*\}))? : (\w+)\[([^\]]*)\]$")
_OUT = re.compile(r"^output (.+) = %(\d+)$")


def print_graph(graph: Graph) -> str:
    lines = []
    for nid, node in enumerate(graph.nodes):
        args = ", ".join(f"%{i}" for i in node.inputs)
        attrs = f" {dict(node.attrs)!r}" if node.attrs else ""
        shape = ", ".join(str(d) for d in node.shape)
        lines.append(f"%{nid} = {node.op.value}({args}){attrs} : {node.dtype}[{shape}]")
    for name, nid in graph.outputs.items():
        lines.append(f"output {name!r} = %{nid}")
    return "\n".join(lines) + "\n"


class _NonFinite(ast.NodeTransformer):
    """``repr`` writes infinite and NaN floats as bare names (a max-pool's pad value is
    -inf): read them back as floats."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("inf", "nan"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def _literal(text: str):
    return ast.literal_eval(_NonFinite().visit(ast.parse(text, mode="eval")))


def parse_graph(text: str, consts: dict[str, np.ndarray] | None = None, seed: int = 0) -> Graph:
    """Parse the text form. Named constants missing from ``consts`` get random values."""
    consts = dict(consts or {})
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    ids: dict[int, int] = {}
    for lineno, raw in enumerate(text.strip().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _OUT.match(line)
        if m:
            b.output(ast.literal_eval(m.group(1)), ids[int(m.group(2))])
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"line {lineno}: cannot parse {raw!r}")
        tid, opname, args, attr_text, dtype, shape_text = m.groups()
        op = Op(opname)
        attrs = _literal(attr_text) if attr_text else {}
        shape = tuple(int(d) for d in shape_text.split(",") if d.strip())
        inputs = [ids[int(a.strip()[1:])] for a in args.split(",") if a.strip()]
        if op is Op.INPUT:
            nid = b.input(attrs["name"], shape, dtype)
        elif op is Op.CONST and "value" in attrs:
            nid = b.const(np.array(attrs["value"], dtype=dtype))
        elif op is Op.CONST:
            name = attrs["name"]
            if name not in consts:
                consts[name] = rng.standard_normal(shape).astype(dtype)
            b.graph.consts[name] = np.asarray(consts[name], dtype=dtype)
            nid = b.add(Op.CONST, name=name, shape=shape, dtype=dtype)
        elif op is Op.OPAQUE:
            nid = b.add(op, inputs, shape=shape, dtype=dtype, **attrs)
        else:
            nid = b.add(op, inputs, **attrs)
            got = b.graph.nodes[nid]
            if got.shape != shape or got.dtype != dtype:
                raise ValueError(
                    f"line {lineno}: declared {dtype}{list(shape)} but {opname} gives {got.dtype}{list(got.shape)}"
                )
        ids[int(tid)] = nid
    return b.graph


def assert_structural_equal(a: Graph, b: Graph) -> None:
    """Raise AssertionError showing both texts when two graphs differ in structure."""
    ta, tb = print_graph(a), print_graph(b)
    if ta != tb:
        raise AssertionError(f"graphs differ:\n--- got\n{ta}--- expected\n{tb}")


__all__ = ["print_graph", "parse_graph", "assert_structural_equal", "_freeze"]
