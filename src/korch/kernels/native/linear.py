"""The native linear backend: a MATMUL or 2-D CONV with an elementwise epilogue
(``korch.kernels.epilogue.match_linear``), run by korch's C++ runtime (``korch_rt.cc``).

MatMul is OpenBLAS's ``sgemm`` on blocks of rows (or columns, when M is small) that the
runtime's OpenMP threads share; Conv is direct for depthwise, one GEMM for 1x1, else
im2col in column blocks of ~512 KB and a GEMM per block. The epilogue runs on each block
right after its GEMM, while the block is in cache. Within a native segment
(``segment.py``) the same kernel is called from C++ with no Python in between; measured
alone (profiling) it is called through ctypes, which costs about a microsecond.

A kernel is described to C++ by an int64 code (``encode``), read by
``korch_linear_create``::

    1, op (0 matmul, 1 conv), n inputs, n outputs, main output, b constant, a pos, b pos, D,
    out shape[D],
    matmul: batch, M, K, N, A offsets[batch], B offsets[batch]       (elements)
    conv:   N, C, H, W, Co, kh, kw, sh, sw, dh, dw, pad top, pad left, group, Ho, Wo,
            pad mode (0 zeros, 1 reflect, 2 edge: Note [Reflected padding])
    n steps, then per step: op, kind (0 unary, 1 scalar, 2 tensor, 3 store, 4 save,
            5 saved, 6 pool, 7 input scale, 8 a step making the scale), value left,
            input pos (output pos for a store or a pool, slot for a save and a saved
            operand; 0/1 unary/scalar for kind 8), the scalar (a pool's divisor) as
            float64 bits, element strides of the operand over the out dims[D] (an input
            scale's over the conv input's)

The linear result goes to the main output (the chain's end) and the chain runs there;
a kernel with more outputs (``LinearPlan.taps``: GELU's pre-activation beside its
product, say) gets store steps that copy the value at their point of the chain. A
chain value read again later (``Operand.chain``: SiLU's x in x * sigmoid(x)) is saved
to a slot, a row of scratch, and a later binary step reads the slot. An output may
also be a chain value's mean over each channel plane of a conv (``LinearPlan.pools``:
squeeze-and-excitation's pool; Note [Pooled taps] in ``korch_rt.cc``), and a conv's
input may come scaled per channel (``LinearPlan.a_scale``: the excitation; Note
[Scaled inputs]).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.base import Backend, CompiledKernel, buffer_address, register
from korch.kernels.epilogue import EPILOGUE_UNARY, LinearPlan, load_consts, match_linear, save_consts
from korch.kernels.native.rtkernel import RuntimeKernel

CODE_VERSION = 2  # 2: a conv's pad mode (1: saved before it, read as zeros)
OP_CODES = {
    Op.ADD: 1,
    Op.SUB: 2,
    Op.MUL: 3,
    Op.DIV: 4,
    Op.MAX: 5,
    Op.MIN: 6,
    Op.NEG: 11,
    Op.EXP: 12,
    Op.TANH: 13,
    Op.SIGMOID: 14,
    Op.ABS: 15,
    Op.ERF: 16,
}


# GELU's erf as well: its whole formula, x * 0.5 * (1 + erf(x / sqrt 2)), is one chain
NATIVE_UNARY = EPILOGUE_UNARY | {Op.ERF}

PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}
STORE = 20  # kind 3: copy the chain's value so far into output ``pos``; kind 4: into slot ``pos``


class Unsupported(ValueError):
    """The plan is valid but the native runtime does not implement it."""


def _operand_strides(plan: LinearPlan, opd, input_shape: tuple[int, ...], shape=None) -> list[int]:
    """Element strides of ``opd`` (input ``pos`` seen through its reshapes/broadcasts),
    broadcast to ``shape`` (the output's); raises Unsupported when a reshape would copy."""
    x = np.empty(input_shape, dtype=np.float32)
    v = np.broadcast_to(opd.view(x), plan.shape if shape is None else shape)
    if not np.shares_memory(v, x) and x.size > 0:
        raise Unsupported("epilogue operand reshape is not a view")
    if v.__array_interface__["data"][0] != x.__array_interface__["data"][0]:
        raise Unsupported("epilogue operand starts inside its input")
    return [s // 4 for s in v.strides]


def encode(plan: LinearPlan, input_shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
    """The int64 code of ``plan`` (module docstring), or Unsupported."""
    if plan.dtype != "float32" or len(plan.shape) < 1:
        raise Unsupported(f"native linear kernels are float32 (got {plan.dtype})")
    shape = tuple(int(s) for s in plan.shape)
    taps = plan.taps or (len(plan.epilogue),)
    pooled = {k: divisor for k, divisor, _ in plan.pools}
    depthwise = plan.op is Op.CONV and plan.attrs.get("group") == plan.a_shape[1] == shape[1]
    if pooled and (not depthwise or len(shape) != 4):
        raise Unsupported("pooled outputs of a 2-D depthwise convolution only (Note [Pooled taps])")
    ends = [k for k, t in enumerate(taps) if t == len(plan.epilogue) and k not in pooled]
    if not ends and not pooled:
        raise Unsupported("no output at the chain's end")
    # the linear result is computed into this output, the chain applied there; past the
    # outputs (scratch) where only pools read the chain (Note [Pooled taps])
    main = ends[0] if ends else len(taps)
    b_const = int(plan.input_names[plan.b].endswith("_c"))  # a named constant: packed once
    code: list[int] = [CODE_VERSION, 0 if plan.op is Op.MATMUL else 1, len(input_shapes), len(taps), main, b_const]
    code += [plan.a, plan.b, len(shape)]
    code += shape
    if plan.op is Op.MATMUL:
        a, b = plan.a_shape, plan.b_shape
        if len(a) < 2 or len(b) < 2 or len(shape) < 2:
            raise Unsupported("matmul with a 1-D operand")
        m, k = a[-2:]
        n = b[-1]
        batch_shape = shape[:-2]
        batch = math.prod(batch_shape)

        def offsets(op_shape: tuple[int, ...]) -> list[int]:
            bs = op_shape[:-2]
            idx = np.arange(math.prod(bs), dtype=np.int64).reshape(bs) * (op_shape[-2] * op_shape[-1])
            idx = idx.reshape((1,) * (len(batch_shape) - len(bs)) + tuple(bs))
            return np.broadcast_to(idx, batch_shape).ravel().tolist()

        code += [batch, m, k, n, *offsets(tuple(a)), *offsets(tuple(b))]
    elif plan.op is Op.CONV:
        a, w = plan.a_shape, plan.b_shape
        attrs = plan.attrs
        if len(a) == 3:  # 1-D: H = 1
            a, w, out = (a[0], a[1], 1, a[2]), (w[0], w[1], 1, w[2]), (shape[0], shape[1], 1, shape[2])
            strides, dil = (1, *attrs["strides"]), (1, *attrs["dilations"])
            pads = (0, attrs["pads"][0])
        elif len(a) == 4:
            out = shape
            strides, dil, pads = tuple(attrs["strides"]), tuple(attrs["dilations"]), tuple(attrs["pads"])[:2]
        else:
            raise Unsupported(f"{len(a) - 2}-D convolution")
        group = int(attrs.get("group", 1))
        mode = PAD_MODES[attrs.get("pad_mode", "constant")]
        if mode and (len(plan.a_shape) != 4 or not b_const):
            raise Unsupported("reflected padding: a 2-D convolution with constant weights only")
        code += [a[0], a[1], a[2], a[3], w[0], w[2], w[3], *strides, *dil, *pads, group, out[2], out[3], mode]
        if w[1] * group != a[1]:
            raise Unsupported("conv weights do not match the channels")
    else:
        raise Unsupported(str(plan.op))
    stores = {t: [k for k, tt in enumerate(taps) if tt == t and k != main] for t in range(len(plan.epilogue) + 1)}
    chained = sorted({st.operand.chain for st in plan.epilogue if st.operand is not None and st.operand.chain >= 0})
    slot = {k: i for i, k in enumerate(chained)}
    prologue = (plan.a_scale is not None) + len(plan.a_scale_chain)
    code.append(len(plan.epilogue) + sum(len(v) for v in stores.values()) + len(slot) + prologue)
    zeros = [0] * len(shape)
    if plan.a_scale is not None:  # kind 7: the input's scale (Note [Scaled inputs])
        if plan.op is not Op.CONV or len(shape) != 4:
            raise Unsupported("an input scale on a 2-D convolution only")
        opd = plan.a_scale
        strides = _operand_strides(plan, opd, tuple(input_shapes[opd.pos]), plan.a_shape)
        if strides[2:] != [0, 0]:
            raise Unsupported("an input scale that varies over pixels")
        code += [OP_CODES[Op.MUL], 7, 1, opd.pos, 0, *strides]
        for st in plan.a_scale_chain:  # kind 8: a step making the scale (pos 0 unary, 1 scalar)
            if st.op not in OP_CODES:
                raise Unsupported(f"input scale step {st.op}")
            scalar = st.operand.scalar if st.operand is not None else None
            bits = 0 if scalar is None else int(np.array(scalar, dtype=np.float64).view(np.int64))
            code += [OP_CODES[st.op], 8, int(st.value_left), int(scalar is not None), bits, *zeros]

    def store(k: int) -> list[int]:  # output k := the value, or its pool (Note [Pooled taps])
        if k in pooled:
            return [STORE, 6, 1, k, int(np.array(pooled[k], dtype=np.float64).view(np.int64)), *zeros]
        return [STORE, 3, 1, k, 0, *zeros]

    for j, st in enumerate(plan.epilogue):
        code += [x for k in stores[j] for x in store(k)]
        if j in slot:
            code += [STORE, 4, 1, slot[j], 0, *zeros]  # slot := the value
        if st.op not in OP_CODES:
            raise Unsupported(f"epilogue {st.op}")
        opd = st.operand
        if opd is None:
            code += [OP_CODES[st.op], 0, 1, -1, 0, *([0] * len(shape))]
        elif opd.chain >= 0:
            code += [OP_CODES[st.op], 5, int(st.value_left), slot[opd.chain], 0, *zeros]
        elif opd.scalar is not None:
            bits = int(np.array(opd.scalar, dtype=np.float64).view(np.int64))
            code += [OP_CODES[st.op], 1, int(st.value_left), -1, bits, *([0] * len(shape))]
        else:
            strides = _operand_strides(plan, opd, tuple(input_shapes[opd.pos]))
            code += [OP_CODES[st.op], 2, int(st.value_left), opd.pos, 0, *strides]
    code += [x for k in stores[len(plan.epilogue)] for x in store(k)]
    return np.asarray(code, dtype=np.int64)


def plan_of(kgraph: Graph) -> LinearPlan | None:
    return match_linear(
        kgraph, frozenset({Op.MATMUL, Op.CONV}), taps=True, rejoin=True, unary=NATIVE_UNARY, pools=True, prologue=True
    )


class NativeLinearKernel(RuntimeKernel):
    def __init__(self, plan: LinearPlan, consts: dict[str, np.ndarray], input_shapes: Sequence[tuple[int, ...]]):
        self.plan = plan
        self.input_shapes = [tuple(s) for s in input_shapes]
        self._create(encode(plan, self.input_shapes))
        self.consts = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in consts.items()}
        self._const_at = {plan.input_names.index(k): v for k, v in self.consts.items() if k in plan.input_names}
        self.out_shapes = plan.out_shapes()
        self.n_outputs = len(self.out_shapes)
        self._ptrs = (ctypes.c_void_p * (len(self.input_shapes) + self.n_outputs))()
        for i, a in self._const_at.items():  # the weights' addresses never change
            self._ptrs[i] = a.ctypes.data
        self._moving = [i for i in range(len(self.input_shapes)) if i not in self._const_at]

    def arg_specs(self) -> tuple[list[tuple[tuple[int, ...], str]], list[tuple[tuple[int, ...], str]]]:
        """(shape, dtype) of each input and output, as a segment lays them out."""
        return [(s, "float32") for s in self.input_shapes], [(s, "float32") for s in self.out_shapes]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        # (addresses by buffer_address: ``.ctypes.data`` per argument made a 2 us kernel
        # cost 15 us measured through this call)
        keep = []
        for i in self._moving:
            a = np.ascontiguousarray(inputs[i], dtype=np.float32)
            keep.append(a)
            self._ptrs[i] = buffer_address(a)
        outs = [np.empty(s, dtype=np.float32) for s in self.out_shapes]
        for j, o in enumerate(outs):
            self._ptrs[len(inputs) + j] = buffer_address(o)
        self._run("linear kernel")
        return outs

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        meta = save_consts(self.backend, self.plan, self.consts, Path(directory), stem)
        meta["input_shapes"] = [list(s) for s in self.input_shapes]
        return meta


def input_shapes(kgraph: Graph) -> list[tuple[int, ...]]:
    return [tuple(kgraph.nodes[nid].shape) for nid in kgraph.inputs.values()]


def _spec_kinds() -> tuple[tuple[str, Any, Any], ...]:
    """(saved op name, kernel class, spec matcher) of the runtime's memory kernels, in the
    order they are tried: pooling (pool.py), softmax (softmax.py), LayerNorm (norm.py),
    transpose (transpose.py), strided copies (copy.py)."""
    from korch.kernels.native.copy import NativeCopyKernel, copy_spec
    from korch.kernels.native.norm import NativeLayerNormKernel, layernorm_spec
    from korch.kernels.native.pool import NativePoolKernel, pool_spec
    from korch.kernels.native.softmax import NativeSoftmaxKernel, softmax_spec
    from korch.kernels.native.transpose import NativeTransposeKernel, transpose_spec

    return (
        ("pool", NativePoolKernel, pool_spec),
        ("softmax", NativeSoftmaxKernel, softmax_spec),
        ("layernorm", NativeLayerNormKernel, layernorm_spec),
        ("transpose", NativeTransposeKernel, transpose_spec),
        ("copy", NativeCopyKernel, copy_spec),
    )


class NativeBackend(Backend):
    name = "native"
    # opaque: TopK (topk.py); memory: the kernels of _spec_kinds
    kinds = frozenset({"linear", "opaque", "memory"})

    def supports(self, kgraph: Graph) -> bool:
        from korch.kernels.native.topk import topk_spec

        if topk_spec(kgraph) is not None or any(f(kgraph) is not None for _, _, f in _spec_kinds()):
            return True
        plan = plan_of(kgraph)
        if plan is None:
            return False
        try:
            encode(plan, input_shapes(kgraph))
        except Unsupported:
            return False
        return True

    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        from korch.kernels.native.topk import build_topk, topk_spec

        spec = topk_spec(kgraph)
        if spec is not None:
            topk = build_topk(kgraph, spec, consts)
            topk.set_threads(num_threads)
            return topk
        for _, kind, spec_of in _spec_kinds():
            spec = spec_of(kgraph)
            if spec is not None:
                k = kind.of(kgraph, spec)
                k.set_threads(num_threads)
                return k
        plan = plan_of(kgraph)
        if plan is None:
            raise ValueError("native backend: not a MATMUL/CONV with an elementwise epilogue")
        k = NativeLinearKernel(plan, consts, input_shapes(kgraph))
        k.set_threads(num_threads)
        return k

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel:
        if meta.get("op") == "topk":
            from korch.kernels.native.topk import load_topk

            topk = load_topk(meta)
            topk.set_threads(num_threads)
            return topk
        kinds = {op: kind for op, kind, _ in _spec_kinds()}
        if meta.get("op") in kinds:
            k = kinds[meta["op"]].load(meta)
            k.set_threads(num_threads)
            return k
        plan, consts = load_consts(meta, directory)
        k = NativeLinearKernel(plan, consts, [tuple(s) for s in meta["input_shapes"]])
        k.set_threads(num_threads)
        return k

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            blas = version("scipy-openblas32")
        except PackageNotFoundError:
            blas = "missing"
        from korch.kernels.native.toolchain import source_hash

        # the runtime's sources are part of the version: a faster GEMM re-measures
        return f"native-{CODE_VERSION}-{source_hash()[:8]}-openblas-{blas}"


register(NativeBackend())
