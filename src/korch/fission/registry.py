"""The fission rule table and the context every rule builds with.

Note [Fission rules]
~~~~~~~~~~~~~~~~~~~~
One function per ONNX operator, named as in the spec and registered under that name
by ``@rule``. The driver calls it as ``Op(ctx, *inputs, **attributes)``:

* inputs are ``Value``s (node ids in the primitive graph), positional in spec order,
  ``None`` for an absent optional input;
* attributes are keywords with the spec's names; parameter defaults are the spec's
  defaults. Where an older opset had an attribute that a newer one made an input
  (``axes``, ``split``, ``pads``, Clip's ``min``/``max``) one parameter serves both:
  ``ctx.array``/``ctx.ints`` accept a ``Value`` (must be constant) or a plain value;
* the result is a node id, or a tuple with one entry per ONNX output (``None`` for an
  output the rule does not compute);
* a rule builds only primitives, through ``ctx.b`` (a GraphBuilder: it infers shapes,
  and ``binary``/``broadcast_to`` make numpy broadcasting explicit).

A rule raises ``Unsupported`` when a precondition fails (non-constant indices, an
attribute value it does not handle). The driver then emits the operator as OPAQUE,
as it does for an operator without a rule, for an attribute the function does not
take, and for an output the rule leaves ``None`` that the model reads. Nodes a failed
rule already built are dead and pruned at the end.

Float constants take the dtype of the tensor they combine with (``ctx.scalar``), so
float32 models compute in float32 throughout.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from korch.ir import GraphBuilder, Op

Rule = Callable[..., Any]
RULES: dict[str, Rule] = {}


class Unsupported(Exception):
    """A rule's precondition failed; the operator becomes opaque."""


class Value(int):
    """An ONNX input handed to a rule: the id of its node in the primitive graph."""


def rule(fn: Rule) -> Rule:
    """Register ``fn`` as the fission rule of the ONNX operator ``fn.__name__``."""
    assert fn.__name__ not in RULES, fn.__name__
    params = list(inspect.signature(fn).parameters.values())[1:]
    fn.attr_names = frozenset(p.name for p in params)  # type: ignore[attr-defined]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    fn.max_inputs = None if variadic else len(positional)  # type: ignore[attr-defined]
    fn.input_names = tuple(p.name for p in positional)  # type: ignore[attr-defined]
    RULES[fn.__name__] = fn
    return fn


@dataclasses.dataclass
class Ctx:
    """What a rule sees besides its inputs: the builder, the opset and the output types."""

    b: GraphBuilder
    opset: int  # version of the default ONNX domain
    out_types: Sequence[tuple[tuple[int, ...], str] | None]  # inferred, per ONNX output

    # --- facts about values --------------------------------------------------------
    def shape(self, x: int) -> tuple[int, ...]:
        return self.b.shape(x)

    def dtype(self, x: int) -> str:
        return self.b.dtype(x)

    def rank(self, x: int) -> int:
        return len(self.b.shape(x))

    def out_shape(self, k: int = 0) -> tuple[int, ...]:
        t = self.out_types[k]
        if t is None:
            raise Unsupported(f"output {k} has no static type")
        return t[0]

    def const(self, x: int | None) -> np.ndarray | None:
        """The value of ``x`` if it is a constant node, else None."""
        if x is None:
            return None
        node = self.b.node(x)
        if node.op is not Op.CONST:
            return None
        return self.b.graph.const_value(x)

    def array(self, v: Any) -> np.ndarray | None:
        """A constant input (``Value``) or an attribute value, as an array; None if absent."""
        if v is None:
            return None
        if isinstance(v, Value):
            arr = self.const(v)
            if arr is None:
                raise Unsupported("input must be constant")
            return arr
        return np.asarray(v)

    def ints(self, v: Any) -> list[int] | None:
        arr = self.array(v)
        return None if arr is None else [int(i) for i in arr.reshape(-1)]

    def floats(self, v: Any) -> list[float] | None:
        arr = self.array(v)
        return None if arr is None else [float(i) for i in arr.reshape(-1)]

    # --- building ---------------------------------------------------------------
    def scalar(self, value: float, like: int) -> int:
        """A rank-0 constant in ``like``'s dtype (kernels inline it)."""
        return self.b.scalar(value, like)

    def unary(self, op: Op, x: int, **attrs: Any) -> int:
        return self.b.unary(op, x, **attrs)

    def binary(self, op: Op, a: int, b: int) -> int:
        return self.b.binary(op, a, b)

    def mul_const(self, x: int, value: float) -> int:
        return x if value == 1.0 else self.binary(Op.MUL, x, self.scalar(value, x))

    def add_const(self, x: int, value: float) -> int:
        return x if value == 0.0 else self.binary(Op.ADD, x, self.scalar(value, x))

    def reshape(self, x: int, shape: Sequence[int]) -> int:
        """RESHAPE, computed at once for a named constant (a weight in another layout)."""
        shape = tuple(int(d) for d in shape)
        value = self.const(x)
        if value is not None and value.ndim > 0 and shape != value.shape:
            return self.b.const(value.reshape(shape))
        return self.b.reshape(x, shape)

    def transpose(self, x: int, perm: Sequence[int]) -> int:
        value = self.const(x)
        if value is not None and value.ndim > 1 and list(perm) != list(range(len(perm))):
            return self.b.const(np.ascontiguousarray(value.transpose(perm)))
        return self.b.transpose(x, perm)

    def slice_axis(self, x: int, axis: int, start: int, length: int, step: int = 1) -> int:
        shape = self.shape(x)
        if start == 0 and step == 1 and length == shape[axis]:
            return x
        starts = [0] * len(shape)
        steps = [1] * len(shape)
        lengths = list(shape)
        starts[axis], steps[axis], lengths[axis] = start, step, length
        return self.b.add(Op.SLICE, [x], starts=starts, steps=steps, lengths=lengths)

    def mean(self, x: int, axes: Sequence[int]) -> int:
        """Mean over ``axes`` keeping dims: REDUCE_SUM then divide by the count."""
        rank = self.rank(x)
        axes = sorted({a % rank for a in axes})
        count = int(np.prod([self.shape(x)[a] for a in axes]))
        s = self.b.reduce(Op.REDUCE_SUM, x, axes)
        return s if count == 1 else self.binary(Op.DIV, s, self.scalar(count, s))


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0
