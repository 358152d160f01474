"""The library backends' pattern: one linear primitive with an elementwise epilogue.

``match_linear`` is what the library backends (numpy, torch on cpu and cuda) accept:
one linear primitive whose operands are kernel inputs, followed by a chain of
elementwise primitives (bias add, relu = MAX with scalar 0, scale, sigmoid ...), each
reading the chain's value once and otherwise only scalars or inputs seen through
RESHAPE/BROADCAST (numpy broadcasting does those for free). The chain's end is the
kernel's only output and is written in place into the linear result (``out=``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op

EPILOGUE_BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN})
EPILOGUE_UNARY = frozenset({Op.NEG, Op.EXP, Op.TANH, Op.SIGMOID, Op.ABS})
_FLOAT = ("float32", "float64")


@dataclasses.dataclass(frozen=True)
class Operand:
    """A scalar, or kernel input ``pos`` seen through RESHAPE/BROADCAST ``steps``, or
    (``chain`` >= 0, ``match_linear(..., rejoin=True)``) the chain's own value after
    ``chain`` epilogue steps: SiLU's x in x * sigmoid(x)."""

    scalar: float | None = None
    pos: int = -1
    name: str = ""
    steps: tuple[tuple[str, tuple[int, ...]], ...] = ()
    chain: int = -1

    def view(self, x: np.ndarray) -> np.ndarray:
        """Apply the steps; a trailing BROADCAST is left to the ufunc's broadcasting."""
        steps = self.steps
        while steps and steps[-1][0] == "broadcast":
            steps = steps[:-1]
        for kind, shape in steps:
            x = np.reshape(x, shape) if kind == "reshape" else np.broadcast_to(x, shape)
        return x

    def to_json(self) -> dict:
        return {
            "scalar": self.scalar,
            "pos": self.pos,
            "name": self.name,
            "steps": [[k, list(s)] for k, s in self.steps],
            "chain": self.chain,
        }

    @staticmethod
    def from_json(d: dict) -> Operand:
        steps = tuple((k, tuple(s)) for k, s in d["steps"])
        return Operand(d["scalar"], d["pos"], d["name"], steps, d.get("chain", -1))


@dataclasses.dataclass(frozen=True)
class EpilogueStep:
    op: Op
    operand: Operand | None = None  # None for unary ops
    value_left: bool = True  # whether the chain's value is the left operand

    def to_json(self) -> dict:
        return {
            "op": self.op.value,
            "operand": self.operand.to_json() if self.operand else None,
            "value_left": self.value_left,
        }

    @staticmethod
    def from_json(d: dict) -> EpilogueStep:
        return EpilogueStep(Op(d["op"]), Operand.from_json(d["operand"]) if d["operand"] else None, d["value_left"])


@dataclasses.dataclass(frozen=True)
class LinearPlan:
    op: Op  # MATMUL or CONV
    a: int  # positions of the linear primitive's operands among the kernel inputs
    b: int
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    attrs: dict
    shape: tuple[int, ...]
    dtype: str
    epilogue: tuple[EpilogueStep, ...]
    input_names: tuple[str, ...]
    # ``match_linear(..., taps=True)``: the kernel's outputs by position, each the chain's
    # value after that many epilogue steps (0: the linear result); () is one output, the
    # chain's end
    taps: tuple[int, ...] = ()
    # ``match_linear(..., pools=True)``: (output position, divisor, shape) of each output
    # that is its tap's value summed over each channel plane of a 2-D conv and divided
    # (a squeeze-and-excitation's global average pool; the native runtime's Note
    # [Pooled taps])
    pools: tuple[tuple[int, float, tuple[int, ...]], ...] = ()
    # ``match_linear(..., prologue=True)``: the conv's input is input ``a`` times this
    # operand, one number per image and channel (squeeze-and-excitation's scale; the
    # native runtime's Note [Scaled inputs])
    a_scale: Operand | None = None
    # the unary and scalar steps that make the scale from that input (a sigmoid, a
    # HardSigmoid's affine map and clamp), in order
    a_scale_chain: tuple[EpilogueStep, ...] = ()

    def out_shapes(self) -> list[tuple[int, ...]]:
        """The shape of each output (``taps`` or the one chain end)."""
        shapes = [tuple(self.shape)] * (len(self.taps) or 1)
        for k, _, shape in self.pools:
            shapes[k] = tuple(shape)
        return shapes

    def to_json(self) -> dict:
        return {
            "op": self.op.value,
            "a": self.a,
            "b": self.b,
            "a_shape": list(self.a_shape),
            "b_shape": list(self.b_shape),
            "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.attrs.items()},
            "shape": list(self.shape),
            "dtype": self.dtype,
            "input_names": list(self.input_names),
            "epilogue": [s.to_json() for s in self.epilogue],
            "taps": list(self.taps),
            "pools": [[k, d, list(shape)] for k, d, shape in self.pools],
            "a_scale": self.a_scale.to_json() if self.a_scale else None,
            "a_scale_chain": [s.to_json() for s in self.a_scale_chain],
        }

    @staticmethod
    def from_json(d: dict) -> LinearPlan:
        return LinearPlan(
            Op(d["op"]),
            d["a"],
            d["b"],
            tuple(d["a_shape"]),
            tuple(d["b_shape"]),
            {k: tuple(v) if isinstance(v, list) else v for k, v in d["attrs"].items()},
            tuple(d["shape"]),
            d["dtype"],
            tuple(EpilogueStep.from_json(s) for s in d["epilogue"]),
            tuple(d["input_names"]),
            tuple(d.get("taps", ())),
            tuple((k, div, tuple(shape)) for k, div, shape in d.get("pools", ())),
            Operand.from_json(d["a_scale"]) if d.get("a_scale") else None,
            tuple(EpilogueStep.from_json(s) for s in d.get("a_scale_chain", ())),
        )


def match_linear(
    kgraph: Graph,
    linear_ops: frozenset[Op] = frozenset({Op.MATMUL, Op.CONV}),
    taps: bool = False,
    rejoin: bool = False,
    unary: frozenset[Op] = EPILOGUE_UNARY,
    pools: bool = False,
    prologue: bool = False,
) -> LinearPlan | None:
    """The plan for a linear primitive plus elementwise chain, or None if ``kgraph`` is not one.
    ``taps``: the kernel may also output values along the chain (GELU's pre-activation,
    say); ``LinearPlan.taps`` says where each output is taken. ``rejoin``: a chain value
    may be read once more by a later binary step (``Operand.chain``: SiLU's
    x * sigmoid(x), a sigmoid-gated add), which the native backend takes; so is
    ``unary``, the elementwise functions the backend computes (ERF as well for it).
    ``pools`` (with ``taps``): an output may be a chain value's mean over each channel
    plane of a 2-D conv (``LinearPlan.pools``). ``prologue``: a 2-D conv's input may be
    an input times a per-channel operand (``LinearPlan.a_scale``), or an input padded
    on its two spatial axes (with zeros, or reflected or its edge repeated: ``attrs``'
    ``pads`` and ``pad_mode``)."""
    nodes = kgraph.nodes
    if len(kgraph.outputs) != 1 and not taps:
        return None
    positions = {nid: pos for pos, nid in enumerate(kgraph.inputs.values())}
    names = list(kgraph.inputs)
    users = kgraph.users()
    lin = [i for i, n in enumerate(nodes) if n.op in (Op.MATMUL, Op.CONV)]
    if len(lin) != 1 or nodes[lin[0]].op not in linear_ops:
        return None
    lid = lin[0]
    lnode = nodes[lid]
    dtype = lnode.dtype
    if dtype not in _FLOAT:
        return None

    def operand(nid: int) -> Operand | None:
        node = nodes[nid]
        if node.is_scalar_const:
            return Operand(scalar=float(node.attr("value")))
        steps: list[tuple[str, tuple[int, ...]]] = []
        while node.op in (Op.RESHAPE, Op.BROADCAST):
            steps.append(("reshape" if node.op is Op.RESHAPE else "broadcast", node.shape))
            nid = node.inputs[0]
            node = nodes[nid]
        if node.op is not Op.INPUT or node.dtype != dtype:
            return None
        return Operand(pos=positions[nid], name=node.attr("name"), steps=tuple(reversed(steps)))

    a, b = lnode.inputs
    used = {lid}
    a_scale, scale_chain = None, ()
    if prologue and lnode.op is Op.CONV and len(lnode.shape) == 4 and nodes[a].op is Op.MUL and len(users[a]) == 1:
        found = _input_scale(nodes, a, positions, unary)
        if found is None:
            return None
        a, a_scale, scale_chain, members = found
        used.update(members)
    pad = None
    if prologue and lnode.op is Op.CONV and len(lnode.shape) == 4 and nodes[a].op is Op.PAD and len(users[a]) == 1:
        pad = _input_pad(nodes[a], lnode.attr("pads"))
        if pad is None:
            return None
        used.add(a)
        a = nodes[a].inputs[0]
    if any(nodes[i].op is not Op.INPUT or nodes[i].dtype != dtype for i in (a, b)):
        return None
    used |= {a, b}
    cur = lid
    chain: list[EpilogueStep] = []
    out_ids = list(kgraph.outputs.values())
    at: dict[int, int] = {lid: 0}  # chain node -> epilogue steps before its value
    out_id = out_ids[0] if len(out_ids) == 1 else None
    can_pool = pools and taps and lnode.op is Op.CONV and len(lnode.shape) == 4
    if can_pool:
        out_id = None  # the chain ends where nothing reads it further (its one output may be a pool)
    forks: dict[int, int] = {}  # a binary node -> the earlier chain node it reads again
    pooled: dict[int, tuple[int, float]] = {}  # a pool's output node -> (its tap, divisor)
    out_set = set(out_ids)
    while cur != out_id:
        nexts = [u for u in users[cur] if forks.get(u) != cur]
        for u in list(nexts) if can_pool else ():
            branch = _pool_branch(nodes, users, u, out_set)
            if branch is not None:
                end, divisor, members = branch
                pooled[end] = (at[cur], divisor)
                used.update(members)
                nexts.remove(u)
        if out_id is None and not nexts:
            break  # the chain's end (with taps)
        if rejoin and len(nexts) == 2:
            fork = _fork(nodes, users, cur, nexts)
            if fork is None:
                return None
            nexts, forks[fork] = [u for u in nexts if u != fork], cur
        if len(nexts) != 1:
            return None
        nid = nexts[0]
        node = nodes[nid]
        if node.shape != lnode.shape or node.dtype != dtype:
            return None
        if node.op in unary:
            chain.append(EpilogueStep(node.op))
        elif node.op in EPILOGUE_BINARY:
            x, y = node.inputs
            if (x == cur) == (y == cur):
                return None
            other = y if x == cur else x
            opd = Operand(chain=at[other]) if forks.get(nid) == other else operand(other)
            if opd is None:
                return None
            chain.append(EpilogueStep(node.op, opd, x == cur))
            walk = other
            while nodes[walk].op in (Op.RESHAPE, Op.BROADCAST):
                used.add(walk)
                walk = nodes[walk].inputs[0]
        else:
            return None
        used.add(nid)
        cur = nid
        at[cur] = len(chain)
    for i, n in enumerate(nodes):
        if n.op not in (Op.INPUT, Op.CONST) and i not in used:
            return None  # something else is computed
    tap_steps: tuple[int, ...] = ()
    if taps:
        if any(o not in at and o not in pooled for o in out_ids):
            return None  # an output off the chain
        if cur not in out_ids and at[cur] not in {t for t, _ in pooled.values()}:
            return None  # the chain's end is neither an output nor pooled
        tap_steps = tuple(at[o] if o in at else pooled[o][0] for o in out_ids)
    attrs = {}
    if lnode.op is Op.CONV:
        attrs = {k: lnode.attr(k) for k in ("strides", "dilations", "pads", "group")}
        if pad is not None:
            attrs["pads"], mode = pad
            if mode != "constant":
                attrs["pad_mode"] = mode
    return LinearPlan(
        lnode.op,
        positions[a],
        positions[b],
        nodes[a].shape,
        nodes[b].shape,
        attrs,
        lnode.shape,
        dtype,
        tuple(chain),
        tuple(names),
        tap_steps,
        tuple((k, pooled[o][1], nodes[o].shape) for k, o in enumerate(out_ids) if o in pooled),
        a_scale,
        scale_chain,
    )


def _input_pad(pad, conv_pads) -> tuple[tuple[int, ...], str] | None:
    """A PAD in front of a 2-D conv as the conv's own padding: (its pads, top, left,
    bottom, right, and the mode). A zero pad on the two spatial axes adds to the conv's
    pads; a reflect or edge pad (ONNX's, ahead of a conv with none: a style-transfer
    net's) becomes the conv's padding in that mode (``LinearPlan.attrs["pad_mode"]``)."""
    pp = [tuple(int(v) for v in p) for p in pad.attr("pads")]
    mode = pad.attr("mode", "constant")
    if len(pp) != 4 or pp[0] != (0, 0) or pp[1] != (0, 0) or min(v for p in pp for v in p) < 0:
        return None
    ours = (pp[2][0], pp[3][0], pp[2][1], pp[3][1])
    if mode == "constant":
        if float(pad.attr("value", 0.0)) != 0.0:
            return None
        return tuple(int(x) + y for x, y in zip(conv_pads, ours)), mode
    if mode not in ("reflect", "edge") or any(conv_pads):
        return None
    return ours, mode


def _input_scale(nodes, mul: int, positions: dict, unary) -> tuple[int, Operand, tuple, list[int]] | None:
    """The conv input ``mul`` as INPUT x times an input made by unary and scalar steps
    and seen through RESHAPE/BROADCAST (whether it varies only by image and channel is
    the backend's check); (x, that operand, the steps in order, the nodes)."""
    for x, s in (nodes[mul].inputs, reversed(nodes[mul].inputs)):
        if nodes[x].op is not Op.INPUT or nodes[x].shape != nodes[mul].shape:
            continue
        members, views, steps = [mul], [], []
        while nodes[s].op in (Op.RESHAPE, Op.BROADCAST):
            views.append(("reshape" if nodes[s].op is Op.RESHAPE else "broadcast", nodes[s].shape))
            members.append(s)
            s = nodes[s].inputs[0]
        while nodes[s].op is not Op.INPUT:
            node = nodes[s]
            if node.op in unary:
                steps.append(EpilogueStep(node.op))
                nxt = node.inputs[0]
            elif node.op in EPILOGUE_BINARY and any(nodes[i].is_scalar_const for i in node.inputs):
                left = nodes[node.inputs[1]].is_scalar_const
                nxt, c = node.inputs if left else reversed(node.inputs)
                steps.append(EpilogueStep(node.op, Operand(scalar=float(nodes[c].attr("value"))), left))
            else:
                break
            members.append(s)
            s = nxt
        if nodes[s].op is not Op.INPUT or nodes[s].dtype != nodes[x].dtype:
            continue
        opd = Operand(pos=positions[s], name=nodes[s].attr("name"), steps=tuple(reversed(views)))
        return x, opd, tuple(reversed(steps)), members
    return None


def _pool_branch(nodes, users, nid: int, outs: set[int]) -> tuple[int, float, list[int]] | None:
    """A chain value's user ``nid`` as a global average (or sum) pool over a conv's two
    spatial axes: REDUCE_SUM over (2, 3), then an optional DIV by a nonzero scalar and
    an optional RESHAPE, single users, the last a kernel output; (that output, the
    divisor, the nodes)."""
    node = nodes[nid]
    if node.op is not Op.REDUCE_SUM or tuple(node.attr("axes") or ()) != (2, 3):
        return None
    members, divisor, end = [nid], 1.0, nid
    for op in (Op.DIV, Op.RESHAPE):
        if end in outs or len(users[end]) != 1 or nodes[users[end][0]].op is not op:
            continue
        nxt = nodes[users[end][0]]
        if op is Op.DIV:
            d = nodes[nxt.inputs[1]]
            if nxt.inputs[0] != end or not d.is_scalar_const or float(d.attr("value")) == 0.0:
                return None
            divisor = float(d.attr("value"))
        end = users[end][0]
        members.append(end)
    if end not in outs:
        return None
    return end, divisor, members


def _fork(nodes, users, cur: int, nexts: list[int]) -> int | None:
    """Of ``cur``'s two users, the binary one that the other reaches along single-user
    nodes (the chain leaves ``cur`` through the other and comes back to it)."""
    for branch, back in ((nexts[0], nexts[1]), (nexts[1], nexts[0])):
        if nodes[back].op not in EPILOGUE_BINARY:
            continue
        walk = branch
        for _ in range(8):
            if len(users[walk]) != 1:
                break
            walk = users[walk][0]
            if walk == back:
                return back
    return None


# --- numpy execution -------------------------------------------------------------------


def save_consts(backend: str, plan: LinearPlan, consts: dict[str, np.ndarray], directory: Path, stem: str) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, value in consts.items():
        fname = f"{stem}.{name}.npy"
        np.save(directory / fname, value)
        files[name] = fname
    return {"backend": backend, "plan": json.loads(json.dumps(plan.to_json())), "consts": files}


def load_consts(meta: dict, directory: Path) -> tuple[LinearPlan, dict[str, np.ndarray]]:
    plan = LinearPlan.from_json(meta["plan"])
    consts = {name: np.load(Path(directory) / fname) for name, fname in meta["consts"].items()}
    return plan, consts
