"""Frontend: ONNX file -> checked, shape-bound, constant-folded ModelProto.

See Note [Frontend contract] in load.py.
"""

from korch.frontend.load import load_model, parse_shape_arg, tensor_types

__all__ = ["load_model", "parse_shape_arg", "tensor_types"]
