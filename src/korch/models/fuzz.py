"""Mutating valid ONNX models into bad input, and running the cheap path on them.

Note [Fuzzing the frontend]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
A case is (seed model, mutation kind, random choices). ``mutate`` returns bytes,
since a truncated or bit-flipped file is no longer a ModelProto. ``check`` runs what
every model goes through before profiling — load, fission, verify, partition,
identify (on the first partitions) — and says how it ended:

* ``("ok", summary)`` — a result;
* ``("error", message)`` — a ``KorchError`` whose message is one line naming the
  problem (what the CLI prints after ``korch: error:``);
* ``("crash", "Type: message")`` — anything else: a bug.

``Runner`` runs each case in a long-lived child process with a time limit and a
resident-memory limit, so a hang (``"hang"``), a dead interpreter or runaway memory
(``"crash"``) is a finding too, never the end of the run. ``tests/test_fuzz.py`` drives
it from hypothesis; ``benchmarks/fuzz.py`` runs over a thousand seeded cases.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import re
import time
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

KINDS = [
    "truncate",
    "bitflip",
    "wrong_shape",
    "init_shape",
    "dangling",
    "cycle",
    "self_loop",
    "unknown_op",
    "unknown_domain",
    "huge_dim",
    "huge_reshape",
    "nan_const",
    "wrong_dtype",
    "init_dtype",
    "drop_node",
    "bad_attr",
    "swap_inputs",
    "zero_dim",
    "opset",
    "duplicate_output",
    "no_outputs",
    "symbolic_dim",
]

# the seed models (korch.models.NAMES minus the slowest to load)
SEEDS = ["attention", "mlp", "candy_block", "segformer_block", "yolo_block", "opaque"]


def _pick(rng: random.Random, seq):
    return seq[rng.randrange(len(seq))]


def _value_infos(m: onnx.ModelProto):
    return list(m.graph.input) + list(m.graph.output)


def mutate(model: onnx.ModelProto, kind: str, rng: random.Random) -> bytes:
    """One mutation of ``model`` (not changed) as serialized bytes."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    nodes = list(g.node)
    node = _pick(rng, nodes)
    if kind == "truncate":
        data = m.SerializeToString()
        return data[: rng.randrange(len(data))]
    if kind == "bitflip":
        data = bytearray(m.SerializeToString())
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == "wrong_shape":
        vi = _pick(rng, _value_infos(m))
        dims = vi.type.tensor_type.shape.dim
        if len(dims) and rng.random() < 0.7:
            _pick(rng, list(dims)).dim_value = rng.choice([1, 2, 3, 5, 7, 100])
        else:
            vi.type.tensor_type.shape.dim.add().dim_value = rng.choice([1, 2, 3])
    elif kind == "init_shape":
        t = _pick(rng, list(g.initializer))
        if len(t.dims) and rng.random() < 0.5:
            t.dims[rng.randrange(len(t.dims))] += rng.choice([-1, 1, 5])
        else:
            t.dims.append(rng.choice([1, 2, 3]))
    elif kind == "dangling":
        if node.input:
            node.input[rng.randrange(len(node.input))] = f"missing_{rng.randrange(1000)}"
        else:
            node.input.append("missing_value")
    elif kind in ("cycle", "self_loop"):
        later = nodes[nodes.index(node) :] if kind == "cycle" else [node]
        src = _pick(rng, later)
        outs = [o for o in src.output if o]
        if node.input and outs:
            node.input[rng.randrange(len(node.input))] = _pick(rng, outs)
    elif kind == "unknown_op":
        node.op_type = rng.choice(["FooBar", "Conv2DTransposeX", "", "Relu6", "softmax"])
    elif kind == "unknown_domain":
        node.domain = rng.choice(["com.example", "ai.onnx.ml", "com.microsoft", "x" * 40])
    elif kind == "huge_dim":
        vi = _pick(rng, list(g.input))
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            _pick(rng, list(dims)).dim_value = rng.choice([2**31, 10**9, 2**40, 2**62])
    elif kind == "huge_reshape":
        shapes = [t for t in g.initializer if t.data_type == TensorProto.INT64 and len(t.dims) == 1]
        if shapes:
            t = _pick(rng, shapes)
            v = numpy_helper.to_array(t).copy()
            if v.size:
                v[rng.randrange(v.size)] = rng.choice([2**31, 10**12, -7, 0])
                t.CopyFrom(numpy_helper.from_array(v, t.name))
    elif kind == "nan_const":
        floats = [t for t in g.initializer if t.data_type == TensorProto.FLOAT]
        if floats:
            t = _pick(rng, floats)
            v = numpy_helper.to_array(t).copy()
            flat = v.reshape(-1)
            for _ in range(rng.randint(1, max(1, flat.size // 4))):
                flat[rng.randrange(flat.size)] = rng.choice([np.nan, np.inf, -np.inf, 1e38])
            t.CopyFrom(numpy_helper.from_array(v, t.name))
    elif kind == "wrong_dtype":
        vi = _pick(rng, _value_infos(m))
        vi.type.tensor_type.elem_type = rng.choice(
            [TensorProto.INT64, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.STRING, 0, 99]
        )
    elif kind == "init_dtype":
        t = _pick(rng, list(g.initializer))
        t.data_type = rng.choice([TensorProto.INT32, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.UINT8, 0])
    elif kind == "drop_node":
        g.node.remove(node)
    elif kind == "bad_attr":
        if node.attribute:
            a = _pick(rng, list(node.attribute))
            if a.type == onnx.AttributeProto.INT:
                a.i = rng.choice([-100, -1, 0, 5, 2**40])
            elif a.type == onnx.AttributeProto.INTS:
                if len(a.ints) and rng.random() < 0.6:
                    a.ints[rng.randrange(len(a.ints))] = rng.choice([-9, 0, 7, 1000])
                else:
                    a.ints.append(rng.choice([0, 3]))
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = rng.choice([math.nan, math.inf, -1.0, 0.0])
            elif a.type == onnx.AttributeProto.STRING:
                a.s = rng.choice([b"nonsense", b""])
            else:
                a.type = onnx.AttributeProto.STRING
        else:
            node.attribute.append(onnx.helper.make_attribute("axis", rng.choice([-5, 9])))
    elif kind == "swap_inputs":
        if len(node.input) >= 2:
            i, j = rng.sample(range(len(node.input)), 2)
            node.input[i], node.input[j] = node.input[j], node.input[i]
    elif kind == "zero_dim":
        vi = _pick(rng, list(g.input))
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            _pick(rng, list(dims)).dim_value = 0
    elif kind == "opset":
        m.opset_import[0].version = rng.choice([1, 6, 11, 99, 0])
    elif kind == "duplicate_output":
        other = _pick(rng, nodes)
        if other is not node and other.output and node.output:
            other.output[0] = node.output[0]
    elif kind == "no_outputs":
        del g.output[:]
    elif kind == "symbolic_dim":
        vi = _pick(rng, list(g.input))
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            _pick(rng, list(dims)).dim_param = "batch"
    else:
        raise ValueError(f"unknown mutation {kind!r}")
    return m.SerializeToString()


def check(data: bytes, max_states: int = 64, max_partitions: int = 3) -> tuple[str, str]:
    """The cheap path on one model; see Note [Fuzzing the frontend]."""
    from korch.errors import KorchError

    try:
        from korch.fission import fission
        from korch.frontend import load_model
        from korch.identify import candidates
        from korch.ir import verify
        from korch.partition import partition

        model = load_model(data)
        g = fission(model)
        verify(g)
        parts = partition(g, max_states)
        n = sum(len(list(candidates(g, p, 8))) for p in parts[:max_partitions])
        return "ok", f"{len(g.compute_ids())} primitives, {len(parts)} partitions, {n} candidates"
    except KorchError as e:
        return "error", str(e)
    except Exception as e:  # noqa: BLE001 - the finding
        import traceback

        tb = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}"
        return "crash", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''} (at {where})"


def one_line_ok(message: str) -> bool:
    return bool(message) and "\n" not in message and "Traceback" not in message and len(message) <= 600


def error_kind(message: str) -> str:
    """A coarse class of an error message for counting (names and numbers dropped)."""
    text = re.sub(r"^[^:]*: ", "", message, count=1)  # the file name
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\bnode '…' \(([\w.]+)\)", r"node (\1)", text)
    text = re.sub(r"\d+", "N", text)
    return text.split(":")[0][:70]


def _child(conn, check_fn: Callable[[bytes], tuple[str, str]]) -> None:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    while True:
        data = conn.recv()
        if data is None:
            return
        conn.send(check_fn(data))


class Runner:
    """Runs ``check`` per case in a child process with a time and a memory limit."""

    def __init__(self, timeout_s: float = 30.0, memory_mb: float = 3000.0, check_fn=check):
        self.timeout_s, self.memory_mb, self.check_fn = timeout_s, memory_mb, check_fn
        self._proc = self._conn = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child, self.check_fn), daemon=True)
        self._proc.start()
        child.close()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
                self._proc.join(5)
            except OSError:
                pass
        self._kill()

    def run(self, data: bytes) -> tuple[str, str]:
        import psutil

        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send(data)
        deadline = time.monotonic() + self.timeout_s
        while not self._conn.poll(0.05):
            if not self._proc.is_alive():
                self._kill()
                return "crash", f"the checking process died (exit code {self._proc.exitcode if self._proc else '?'})"
            if time.monotonic() > deadline:
                self._kill()
                return "hang", f"no answer within {self.timeout_s:.0f} s"
            try:
                rss = psutil.Process(self._proc.pid).memory_info().rss / 2**20
            except psutil.Error:
                rss = 0.0
            if rss > self.memory_mb:
                self._kill()
                return "crash", f"runaway memory (over {self.memory_mb:.0f} MiB resident)"
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._kill()
            return "crash", "the checking process died"


_SEED_CACHE: dict[str, onnx.ModelProto] = {}


def seed_model(name: str) -> onnx.ModelProto:
    if name not in _SEED_CACHE:
        from korch.models import build

        _SEED_CACHE[name] = build(name)
    return _SEED_CACHE[name]


def case(seed: str, kind: str, rng_seed: int) -> bytes:
    return mutate(seed_model(seed), kind, random.Random(rng_seed))


__all__ = ["KINDS", "SEEDS", "Runner", "case", "check", "error_kind", "mutate", "one_line_ok", "seed_model"]
