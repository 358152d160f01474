"""Note [Index operands]: a kernel measured alone gets integer inputs that its opaque
operators can read as positions (issue 26: roberta's token-type Gather, a table of
two rows, failed every measurement on positions 0..3)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch.fission import fission
from korch.frontend import load_model
from korch.ir import Op
from korch.ir.opaque import index_bounds
from korch.ir.subgraph import extract, kernel_consts, make_kernel
from korch.profile.timing import random_inputs
from korch.profile.worker import Job, WorkerPool


def _opaque_kernel(op: str, data_shape, idx_shape, **attrs):
    """The one opaque primitive of ``op(data, idx)`` as a standalone kernel (data constant)."""
    data = numpy_helper.from_array(np.arange(np.prod(data_shape), dtype=np.float32).reshape(data_shape), "data")
    out_shape = {"Gather": tuple(idx_shape) + tuple(data_shape[1:]), "GatherElements": tuple(idx_shape)}.get(op)
    graph = helper.make_graph(
        [helper.make_node(op, ["data", "idx"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, list(idx_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape) if out_shape else None)],
        [data],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    g = fission(load_model(model))
    (nid,) = [n for n in g.compute_ids() if g.nodes[n].op is Op.OPAQUE]
    k = make_kernel(g, g.users(), [nid])
    return extract(g, k), kernel_consts(g, k)


@pytest.mark.parametrize(
    "op, data_shape, idx_shape, attrs, bound",
    [
        ("Gather", (2, 8), (1, 64), {}, 2),
        ("Gather", (16, 3), (1, 64), {"axis": 1}, 3),
        ("GatherElements", (1, 3), (1, 64), {"axis": -1}, 3),
    ],
)
def test_random_integer_inputs_are_valid_positions(op, data_shape, idx_shape, attrs, bound):
    kg, consts = _opaque_kernel(op, data_shape, idx_shape, **attrs)
    (node,) = [n for n in kg.nodes if n.op is Op.OPAQUE]
    assert index_bounds(node, [kg.nodes[i].shape for i in node.inputs]) == {1: bound}
    for seed in range(3):
        args = dict(zip(kg.inputs, random_inputs(kg, consts, seed)))
        idx = next(a for name, a in args.items() if name not in consts)
        assert idx.min() >= 0 and idx.max() < bound
        assert idx.max() == bound - 1  # still spread over the valid positions


def test_gather_nd_bound_is_the_smallest_indexed_axis():
    b = helper.make_node("GatherND", ["data", "idx"], ["y"], batch_dims=1)
    from korch.ir.graph import Node

    node = Node(Op.OPAQUE, (0, 1), (("node", b.SerializeToString()), ("opset", (("", 17),)), ("out_index", 0)),
                (2,), "float32")  # fmt: skip
    assert index_bounds(node, [(2, 5, 3, 7), (2, 2)]) == {1: 3}
    assert index_bounds(node, [(2, 5, 3, 7), (2, 0)]) == {}


def test_a_gather_into_a_two_row_table_is_measured():
    kg, consts = _opaque_kernel("Gather", (2, 8), (1, 64))
    results = {}
    pool = WorkerPool(num_threads=1, timing=(1, 3, 0.1), timeout_s=60.0)
    try:
        pool.run([Job(("gather", "ort"), "ort", kg, consts)], lambda r: results.__setitem__(r.key[0], r))
    finally:
        pool.close()
    assert results["gather"].status == "ok", results["gather"].error  # "failed": idx=3 out of bounds
