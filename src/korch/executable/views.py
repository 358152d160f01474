"""Kernels that only move whole contiguous blocks, run as views in a native segment.

Note [Views in a segment]
~~~~~~~~~~~~~~~~~~~~~~~~~
A concat along an axis before which every dimension is 1 (a CNN's channels at batch 1)
lays its inputs one after another: input k is the block of the output starting at the
sum of the sizes before it. A slice that keeps whole trailing axes and one range of the
first axis it cuts, with ones before it, is one block of its input, and a reshape is
its input. Copying such a block is all their kernels do: yolo_b1's composed plan ran
eight of them, 0.22 ms of 7.3 (korch explain).

In a native segment (``korch.executable.native``) each such step is a view: the
producers of a concat's inputs write straight into their blocks of its output, and a
slice's readers read its block of the input. The step stays a member (korch explain
lists it, at ~0) and runs nothing. Lifetimes follow: a block's slot lives from the first
write into any of its views to the last read of any. A concat is a view only where each
input is written by an earlier member of the segment, is no segment output, is placed
in no other concat and appears once; a slice or reshape only where its output is no
segment output (those are buffers of their own). Every block starts a multiple of
ALIGN bytes into its slot: generated kernels assume aligned buffers (Note [TVM buffer
alignment]). Outside a segment, or when a condition fails, the step's kernel runs.

The selection knows: with native segments on, such a candidate costs ``VIEW_US``
(``korch.orchestrate.guided``), so the BLP takes the plain concat over one with an
elementwise op fused in front of its copy.
"""

from __future__ import annotations

import math

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.base import ALIGN

# the cost of a view candidate, us: a step in a segment that runs nothing
VIEW_US = 1.0


def view_of(graph: Graph, nodes: tuple[int, ...]) -> tuple | None:
    """("concat", ((input, byte offset), ...)) | ("block", byte offset) for a kernel of
    ``nodes`` that only moves contiguous blocks (Note [Views in a segment]), else None."""
    if len(nodes) != 1:
        return None
    node = graph.nodes[nodes[0]]
    item = np.dtype(node.dtype).itemsize
    if node.op is Op.RESHAPE:
        return ("block", 0)
    if node.op is Op.CONCAT:
        axis = node.attr("axis") % len(node.shape)
        if math.prod(node.shape[:axis]) != 1 or len(set(node.inputs)) != len(node.inputs):
            return None
        offsets, off = [], 0
        for src in node.inputs:
            offsets.append((src, off))
            off += math.prod(graph.nodes[src].shape) * item
        return ("concat", tuple(offsets)) if all(o % ALIGN == 0 for _, o in offsets) else None
    if node.op is Op.SLICE:
        return _slice_block(graph.nodes[node.inputs[0]].shape, node, item)
    return None


def _slice_block(shape: tuple[int, ...], node, item: int) -> tuple | None:
    starts, steps, lengths = node.attr("starts"), node.attr("steps"), node.attr("lengths")
    cut = [i for i, (ln, d) in enumerate(zip(lengths, shape)) if ln != d]
    if not cut:
        return ("block", 0)
    a = cut[0]
    if len(cut) > 1 or any(lengths[i] != 1 for i in range(a)):
        return None
    if lengths[a] > 1 and steps[a] != 1:
        return None
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    off = sum(int(starts[i]) * strides[i] for i in range(a + 1)) * item
    return ("block", off) if off % ALIGN == 0 else None
