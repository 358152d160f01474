"""The dtypes onnxruntime's CPU kernels run in, for ``korch.kernels.ort.export``.

Note [ONNX dtypes]
~~~~~~~~~~~~~~~~~~
onnxruntime's CPU kernels cover fewer dtypes than numpy (no Exp on int64, no Conv on
float64, no Add on bool ...). Each primitive is computed in the dtype numpy would use
(``np.result_type`` of its non-scalar inputs); when onnxruntime has no kernel for that
dtype we compute in the next wider one (``_WIDER``) and Cast back to the node's dtype.
Rank-0 constants are emitted in the dtype of the tensor they meet when the value fits
(same kind, or the value round-trips), so ``x * 0.5`` stays one float32 Mul; numpy would
compute ``float32 * float64-0d`` in float64, which differs by at most a rounding.
"""

from __future__ import annotations

_FLOATS = ("float32", "float16", "float64")
_INTS = ("int64", "int32", "int8", "uint8")
_ALL = _FLOATS + _INTS + ("bool",)
_NUM = _FLOATS + _INTS

# dtypes onnxruntime's CPU provider runs each operator on (probed with onnxruntime 1.31, opset 20)
_SUPPORT: dict[str, tuple[str, ...]] = {
    "Neg": ("float32", "float16", "float64", "int64", "int32", "int8"),
    "Abs": _NUM,
    "Exp": _FLOATS,
    "Log": _FLOATS,
    "Sqrt": _FLOATS,
    "Reciprocal": _FLOATS,
    "Tanh": _FLOATS,
    "Sigmoid": _FLOATS,
    "Floor": _FLOATS,
    "Ceil": _FLOATS,
    "Erf": ("float32", "float16"),
    "Not": ("bool",),
    "And": ("bool",),
    "Or": ("bool",),
    "Add": _NUM,
    "Sub": _NUM,
    "Mul": _NUM,
    "Div": _NUM,
    "Max": _NUM,
    "Min": _NUM,
    "Pow": ("float32", "float16", "float64", "int64", "int32"),
    "Equal": _ALL,
    "Less": _NUM,
    "Greater": _NUM,
    "Where": _NUM,
    "ReduceSum": ("float32", "float16", "float64", "int64", "int32"),
    "ReduceMax": _ALL,
    "ReduceMin": _ALL,
    "MatMul": ("float32", "float16", "float64", "int64", "int32"),
    "Conv": ("float32", "float16"),
}

# the dtypes to try, in order, when onnxruntime lacks a kernel for a dtype
_WIDER: dict[str, tuple[str, ...]] = {
    "bool": ("uint8", "int32", "int64", "float32"),
    "uint8": ("int32", "int64", "float64", "float32"),
    "int8": ("int32", "int64", "float64", "float32"),
    "int32": ("int64", "float64", "float32"),
    "int64": ("float64", "float32"),
    "float16": ("float32", "float64"),
    "float32": ("float64",),
    "float64": ("float32",),
}


def compute_dtype(dtype: str, op_type: str) -> str:
    """The dtype onnxruntime computes ``op_type`` in for a ``dtype`` computation."""
    sup = _SUPPORT.get(op_type)
    if sup is None or dtype in sup:
        return dtype
    for d in _WIDER.get(dtype, ()):
        if d in sup:
            return d
    raise NotImplementedError(f"onnxruntime has no {op_type} kernel for {dtype}")
