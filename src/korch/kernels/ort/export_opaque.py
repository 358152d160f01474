"""OPAQUE primitives back to ONNX (``korch.kernels.ort.export``): each is emitted as the
NodeProto it was fissioned from, once per (operator, inputs); the members of a
multi-output operator share its outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

if TYPE_CHECKING:
    from korch.kernels.ort.export import Exporter


def _opaque_proto(node: Node):
    import onnx

    proto = onnx.NodeProto()
    proto.ParseFromString(node.attr("node"))
    return proto


def emit_opaque(
    ex: Exporter,
    graph: Graph,
    live: list[bool],
    target: dict[int, str],
    groups: dict[tuple, list[str]],
    nid: int,
    node: Node,
) -> None:
    """Emit an OPAQUE node's NodeProto once per (operator, inputs); members share its outputs."""
    in_names = [ex.tensor(i) for i in node.inputs]
    key = (node.attr("node"), tuple(in_names))
    k = int(node.attr("out_index"))
    if key in groups:
        # emitted with an earlier member; a duplicate that is an output gets an Identity at the end
        ex.set_name(nid, groups[key][k])
        return
    proto = _opaque_proto(node)
    outs = [""] * len(proto.output)
    outs[k] = target.get(nid) or ex.fresh(f"t{nid}")
    for oid in range(nid + 1, len(graph.nodes)):
        other = graph.nodes[oid]
        if (
            live[oid]
            and other.op is Op.OPAQUE
            and other.attr("node") == node.attr("node")
            and other.inputs == node.inputs
        ):
            j = int(other.attr("out_index"))
            if not outs[j]:
                outs[j] = target.get(oid) or ex.fresh(f"t{oid}")
    outs = [o or ex.fresh(f"t{nid}_o{j}") for j, o in enumerate(outs)]
    groups[key] = outs
    ex.set_name(nid, outs[k])
    it = iter(in_names)
    new_inputs = [next(it) if name else "" for name in proto.input]
    del proto.input[:]
    proto.input.extend(new_inputs)
    del proto.output[:]
    proto.output.extend(outs)
    proto.name = ex.fresh(f"opaque{nid}")
    ex.nodes.append(proto)
