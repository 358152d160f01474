"""korch: operator fission, optimal kernel orchestration and auto tiling for ONNX models."""

from korch.api import CompiledModel, load, optimize
from korch.config import Settings
from korch.errors import InputError, KorchError, ModelError

__version__ = "0.1.0"
__all__ = ["CompiledModel", "InputError", "KorchError", "ModelError", "Settings", "load", "optimize"]
