"""Auto tiling (the GE seed): targets as data, kernel description, symbolic buffer and
pipe-time models, calibration and solvers. See Note [Kernel description] (describe.py),
Note [Tiling model] (model.py), Note [Target cost formulas] (target.py), Note
[Axis-ordering solver] (solvers.py) and Note [Calibration] (calibrate.py).

Imports no TVM: the kernel generator consumes ``TilingSolution`` values.
"""

from korch.tiling.describe import Axis, KernelDesc, TensorDesc, describe
from korch.tiling.model import TemplateModel, Var, build_models
from korch.tiling.solvers import SOLVERS, TilingSolution, axis_order, predict_latency_us, solve
from korch.tiling.target import TARGETS, BufferLevel, Target, get_target

__all__ = [
    "SOLVERS",
    "TARGETS",
    "Axis",
    "BufferLevel",
    "KernelDesc",
    "Target",
    "TemplateModel",
    "TensorDesc",
    "TilingSolution",
    "Var",
    "axis_order",
    "build_models",
    "describe",
    "get_target",
    "predict_latency_us",
    "solve",
]
