"""The rule tables, grouped by theme (see Note [Rewrite rules] in pattern.py).

SEARCH rules may make a graph better or worse; the cost-guided search chooses.
SIMPLIFY rules always help; the driver applies them greedily to every graph.
"""

from korch.rewrite.rules.affine import AFFINE_RULES, INPUT_AFFINE_RULES
from korch.rewrite.rules.channel_major import CHANNEL_MAJOR_RULES
from korch.rewrite.rules.layout import CONST_FOLD_RULES, LAYOUT_RULES
from korch.rewrite.rules.linear import LINEAR_RULES
from korch.rewrite.rules.merge import MERGE_RULES
from korch.rewrite.rules.s2d import S2D_RULES
from korch.rewrite.rules.sink import LIBRARY_LAYOUT_RULES, SINK_RULES
from korch.rewrite.rules.split import SPLIT_RULES

TABLES = {
    "linear": LINEAR_RULES,
    "merge": MERGE_RULES,
    "sink": SINK_RULES,
    "split": SPLIT_RULES,
    "s2d": S2D_RULES,
    "affine": AFFINE_RULES + INPUT_AFFINE_RULES,
    "layout": LAYOUT_RULES,
    "const_fold": CONST_FOLD_RULES,
}
SEARCH = SINK_RULES + S2D_RULES + LINEAR_RULES + MERGE_RULES + AFFINE_RULES
SIMPLIFY = LAYOUT_RULES + CONST_FOLD_RULES
# applied after the search, greedily (korch.rewrite.for_library): layouts an onnxruntime
# region runs faster, and epilogues moved above a split (Note [Pointwise over a split]),
# that the byte/flop cost cannot see
LIBRARY_LAYOUT = LIBRARY_LAYOUT_RULES + CHANNEL_MAJOR_RULES + SPLIT_RULES
# applied once after the search and the library layouts (korch.pipeline.step_rewrite):
# Note [An affine map before a MatMul]
# (and the shift's bias merged with the Linear's own: two ADDs of constants are one)
AFTER_SEARCH = INPUT_AFFINE_RULES + tuple(r for r in AFFINE_RULES if r.name == "add_const_chain")
ALL_RULES = SEARCH + SIMPLIFY + LIBRARY_LAYOUT + INPUT_AFFINE_RULES
RULES_BY_NAME = {r.name: r for r in ALL_RULES}
assert len(RULES_BY_NAME) == len(ALL_RULES), "rule names must be unique"

__all__ = [
    "AFFINE_RULES",
    "AFTER_SEARCH",
    "CHANNEL_MAJOR_RULES",
    "ALL_RULES",
    "CONST_FOLD_RULES",
    "LAYOUT_RULES",
    "LIBRARY_LAYOUT",
    "LINEAR_RULES",
    "MERGE_RULES",
    "S2D_RULES",
    "SINK_RULES",
    "SPLIT_RULES",
    "RULES_BY_NAME",
    "SEARCH",
    "SIMPLIFY",
    "TABLES",
]
