"""The verifier: run after fission and after the rewrites, and between stages in tests."""

from __future__ import annotations

from korch.ir.graph import Graph, infer
from korch.ir.ops import GroupOp, Op


class VerifyError(ValueError):
    pass


def verify(graph: Graph) -> None:
    """Check topological order, arity, shapes and dtypes, sources and outputs."""
    for nid, node in enumerate(graph.nodes):
        where = f"%{nid} ({node.op.value})"
        if node.op not in GroupOp.PRIMITIVE and node.op not in GroupOp.SOURCE:
            raise VerifyError(f"{where}: not a primitive")
        for i in node.inputs:
            if not 0 <= i < nid:
                raise VerifyError(f"{where}: input %{i} is not an earlier node (cycle or dangling)")
        if node.op is Op.INPUT:
            if graph.inputs.get(node.attr("name")) != nid:
                raise VerifyError(f"{where}: not registered as graph input")
            continue
        if node.op is Op.CONST:
            if node.attr("value") is None:
                name = node.attr("name")
                if name not in graph.consts:
                    raise VerifyError(f"{where}: constant {name!r} has no value")
                val = graph.consts[name]
                if tuple(val.shape) != node.shape or str(val.dtype) != node.dtype:
                    raise VerifyError(f"{where}: constant value {val.dtype}{list(val.shape)} mismatch")
            continue
        if node.op is Op.OPAQUE:
            continue
        arity = {
            **{o: 1 for o in GroupOp.UNARY},
            **{o: 2 for o in GroupOp.BINARY},
            Op.WHERE: 3,
            Op.MATMUL: 2,
            Op.CONV: 2,
        }
        if node.op in GroupOp.REDUCE | GroupOp.BROADCAST | GroupOp.LAYOUT - {Op.CONCAT}:
            arity[node.op] = 1
        if node.op in arity and len(node.inputs) != arity[node.op]:
            raise VerifyError(f"{where}: takes {arity[node.op]} inputs, has {len(node.inputs)}")
        ins = [graph.nodes[i] for i in node.inputs]
        try:
            shape, dtype = infer(node.op, [n.shape for n in ins], [n.dtype for n in ins], dict(node.attrs))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise VerifyError(f"{where}: {e}") from None
        if shape != node.shape or dtype != node.dtype:
            raise VerifyError(f"{where}: recorded {node.dtype}{list(node.shape)}, rules give {dtype}{list(shape)}")
        if node.op in GroupOp.ELEMENTWISE:
            for i, n in zip(node.inputs, ins):
                if n.shape != node.shape and not n.is_scalar_const:
                    raise VerifyError(f"{where}: input %{i} needs an explicit broadcast")
    for name, nid in graph.outputs.items():
        if not 0 <= nid < len(graph.nodes):
            raise VerifyError(f"output {name!r}: no node %{nid}")
