"""The primitive graph beside a saved executable (``graph.json``), for ``korch explain``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GRAPH_FILE = "graph.json"


def graph_summary(graph) -> dict[str, Any]:
    """What explain needs of the primitive graph: per node op, class, inputs, shape, dtype."""
    import onnx

    from korch.ir.ops import Op, category

    nodes = []
    for n in graph.nodes:
        d: dict[str, Any] = {
            "op": n.op.value,
            "class": category(n.op),
            "inputs": list(n.inputs),
            "shape": list(n.shape),
        }
        d["dtype"] = n.dtype
        if n.op is Op.OPAQUE:
            try:
                d["op"] = "opaque:" + onnx.NodeProto.FromString(dict(n.attrs)["node"]).op_type
            except Exception:  # noqa: BLE001 - a label only
                pass
        if n.op is Op.CONST and n.is_scalar_const:
            d["scalar"] = True
        nodes.append(d)
    return {"nodes": nodes, "inputs": dict(graph.inputs), "outputs": dict(graph.outputs)}


def save_graph_summary(graph, directory: str | Path) -> None:
    Path(directory, GRAPH_FILE).write_text(json.dumps(graph_summary(graph)))
