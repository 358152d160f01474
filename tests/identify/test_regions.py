"""Library regions (Note [Library regions] in korch/pipeline.py): which they are, and
that onnxruntime runs one exactly as the reference interpreter does."""

from __future__ import annotations

import numpy as np
import pytest

from korch.fission import fission
from korch.frontend import load_model
from korch.ir.ops import GroupOp
from korch.ir.subgraph import extract, kernel_consts, make_kernel
from korch.kernels.registry import get_backend
from korch.models import build
from korch.partition import partition
from korch.pipeline import library_regions
from korch.profile.timing import check_outputs, random_inputs


def _convex(graph, members: set[int]) -> bool:
    """No path leaves ``members`` and comes back."""
    users = graph.users()
    outside = [u for n in members for u in users[n] if u not in members]
    seen: set[int] = set()
    while outside:
        n = outside.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in members:
            return False
        outside.extend(users[n])
    return True


@pytest.fixture(scope="module")
def yolo():
    g = fission(load_model(build("yolo_block")))
    return g, partition(g, 400)


def test_regions_are_the_partition_and_its_halves(yolo):
    g, parts = yolo
    n_linear = lambda nodes: sum(1 for n in nodes if g.nodes[n].op in GroupOp.LINEAR)
    total = 0
    for part in parts:
        regions = library_regions(g, part, 3)
        total += len(regions)
        assert all(n_linear(r) >= 2 and _convex(g, set(r)) and set(r) <= set(part) for r in regions)
        assert len({tuple(r) for r in regions}) == len(regions)
        if n_linear(part) >= 2:
            assert regions[0] == part  # level 0: the whole partition
        assert len(regions) <= 1 + 2 + 4
        assert library_regions(g, part, 0) == []
    assert total >= 2  # yolo_block's Conv chains give regions


def test_region_runs_in_onnxruntime_like_the_interpreter(yolo):
    g, parts = yolo
    part = max(parts, key=len)
    region = library_regions(g, part, 1)[0]
    k = make_kernel(g, g.users(), region)
    kg, consts = extract(g, k), kernel_consts(g, k)
    compiled = get_backend("ort").build(kg, consts, 1)
    args = random_inputs(kg, consts)
    got = compiled([args[i] for i in range(len(args))])
    assert len(got) == len(k.outputs) >= 1
    assert check_outputs(kg, args, got, rtol=1e-4) == ""
    # nothing inside is left to onnxruntime's generic Gather (Resize/MaxPool raised)
    import onnx

    model = onnx.load_from_string(compiled._model_bytes)
    assert "Gather" not in {n.op_type for n in model.graph.node}
    assert np.isfinite(np.concatenate([np.ravel(x) for x in got])).all()
