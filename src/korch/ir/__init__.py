"""The primitive IR shared by every stage (see Note [Primitive classes] in ops.py)."""

from korch.ir.graph import Graph, GraphBuilder, Node, infer
from korch.ir.interp import eval_node, evaluate
from korch.ir.ops import DTYPES, GroupOp, Op, category
from korch.ir.text import assert_structural_equal, parse_graph, print_graph
from korch.ir.verify import VerifyError, verify

__all__ = [
    "DTYPES",
    "Graph",
    "GraphBuilder",
    "GroupOp",
    "Node",
    "Op",
    "VerifyError",
    "assert_structural_equal",
    "category",
    "eval_node",
    "evaluate",
    "infer",
    "parse_graph",
    "print_graph",
    "verify",
]
