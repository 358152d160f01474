"""Primitive-graph rewrites (TASO-style): rule tables, one driver, a cost-guided search.

See Note [Rewrite rules] (pattern.py), Note [Rewrite cost] (cost.py) and
Note [Rewrite search] (search.py).
"""

from korch.rewrite.cost import ByteFlopCost, default_cost
from korch.rewrite.driver import apply_rule, compact, find_matches, for_library, graph_hash, rebuild, simplify_graph
from korch.rewrite.pattern import Match, Rule
from korch.rewrite.rules import ALL_RULES, RULES_BY_NAME, SEARCH, SIMPLIFY, TABLES
from korch.rewrite.search import RewriteStats, optimize_graph

__all__ = [
    "ALL_RULES",
    "ByteFlopCost",
    "Match",
    "RULES_BY_NAME",
    "RewriteStats",
    "Rule",
    "SEARCH",
    "SIMPLIFY",
    "TABLES",
    "apply_rule",
    "compact",
    "default_cost",
    "find_matches",
    "for_library",
    "graph_hash",
    "optimize_graph",
    "rebuild",
    "simplify_graph",
]
