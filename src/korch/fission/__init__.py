"""Operator fission: every ONNX operator becomes primitives (see Note [Fission rules]).

Importing the rule modules fills ``RULES``; operators without a rule, or whose rule
does not apply, become OPAQUE primitives run by onnxruntime.
"""

from korch.fission import activations, arithmetic, layout, linear, normalization, pooling, reduce, resize  # noqa: F401
from korch.fission.driver import fission
from korch.fission.registry import RULES, Ctx, Unsupported, Value, rule

__all__ = ["RULES", "Ctx", "Unsupported", "Value", "fission", "rule"]
