"""Bad input (issue 6, item 3): mutated ONNX models end in a result or one line.

hypothesis picks a seed model (korch.models), a mutation (korch.models.fuzz.KINDS)
and the mutation's random choices; each case runs the cheap path (load, fission,
verify, partition, identify) in a child process with a time and memory limit. Every
case must end in a result or a one-line KorchError — never another exception, a
dead process or a hang. ``benchmarks/fuzz.py`` runs the same over 1,000+ cases.
A few error cases go through ``korch optimize`` to check the CLI's stderr.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from korch.models.fuzz import KINDS, SEEDS, Runner, check, mutate, one_line_ok, seed_model

CASES = 150


@pytest.fixture(scope="module")
def runner():
    r = Runner(timeout_s=60.0, memory_mb=3000.0)
    yield r
    r.close()


@settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.sampled_from(SEEDS), kind=st.sampled_from(KINDS), rng_seed=st.integers(0, 2**32 - 1))
def test_mutated_models_end_in_result_or_one_line_error(runner, seed, kind, rng_seed):
    data = mutate(seed_model(seed), kind, random.Random(rng_seed))
    status, message = runner.run(data)
    assert status in ("ok", "error"), f"{seed}/{kind}/{rng_seed}: {status}: {message}"
    if status == "error":
        assert one_line_ok(message), message


def test_fission_shape_conflicts_are_model_errors():
    """Found by fuzzing: ONNX shape inference lets a Conv channel mismatch through;
    fission's shape rule refuses it, which must read as a ModelError naming the node."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], name="c1")
    g = helper.make_graph(
        [conv],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [numpy_helper.from_array(np.ones((4, 5, 3, 3), np.float32), "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    status, message = check(m.SerializeToString())
    assert status == "error" and one_line_ok(message)
    assert message.startswith("node 'c1' (Conv): its inputs do not fit together")


def test_initializer_size_mismatch_is_model_error():
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(seed_model("candy_block"))
    t = next(t for t in m.graph.initializer if len(t.dims) == 4)
    t.dims[0] -= 1
    status, message = check(m.SerializeToString())
    assert status == "error" and f"initializer {t.name!r} has dims" in message


@pytest.mark.parametrize("kind,rng_seed", [("truncate", 1), ("init_shape", 232)])
def test_cli_prints_one_line(kind, rng_seed, tmp_path):
    data = mutate(seed_model(SEEDS[rng_seed % len(SEEDS)]), kind, random.Random(rng_seed))
    status, message = check(data)
    assert status == "error", (status, message)
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    proc = subprocess.run(
        [sys.executable, "-m", "korch", "optimize", str(path), "-o", str(tmp_path / "o"), "--db", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("korch: error:") and proc.stderr.count("\n") == 1, proc.stderr


def test_swapped_instance_norm_operands_are_model_error():
    """Found by benchmarks/fuzz.py: x and scale of InstanceNormalization swapped pass
    ONNX inference, and fission's result disagrees with it; onnxruntime cannot run the
    node either, so it is the model's fault: a ModelError, not an internal error."""
    from korch.models.fuzz import case

    status, message = check(case("candy_block", "swap_inputs", 2371834560))
    assert status == "error" and one_line_ok(message)
    assert "(InstanceNormalization): its inputs do not fit together" in message
