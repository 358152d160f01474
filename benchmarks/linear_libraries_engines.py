"""Engines for benchmarks/linear_libraries.py: one maker per library, plus dispatch costs.

A maker takes (case, data, threads, libs, native_status) and returns a Run, or raises
Skip with the reason. Heavy imports (onnxruntime, openvino, torch, tvm) happen inside
the makers, in the child process whose thread count is already fixed.
"""

from __future__ import annotations

import ctypes
import tempfile
import time
from pathlib import Path

import numpy as np


class Skip(Exception):
    """An engine does not apply to a case, or its library is missing."""


class Run:
    """A prepared op. call() computes once; output() returns y (MxN or NCHW numpy)."""

    info = ""

    def __init__(self, call, output, timed=None, close=None):
        self.call, self.output, self._timed, self._close = call, output, timed, close

    def time(self, n: int) -> np.ndarray:
        """Per-call wall times in ns for n calls."""
        if self._timed:
            return self._timed(n)
        out = np.empty(n)
        call, clock = self.call, time.perf_counter_ns
        for i in range(n):
            t0 = clock()
            call()
            out[i] = clock() - t0
        return out

    def warm(self) -> tuple[np.ndarray, float]:
        """Warm up (~50 ms; one call if it takes > 0.5 s); returns the output and median s per call."""
        ts = list(self.time(1))
        while sum(ts) < 5e7 and len(ts) < 60 and ts[0] < 5e8:
            ts += list(self.time(3))
        return self.output(), float(np.median(ts)) / 1e9

    def close(self):
        if self._close:
            self._close()


def _conv_out(case):
    c, h, w, o, k, s, p, g = case.dims
    return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1


def _im2col(x, k, s, p):
    """x (C, H, W) -> cols (C, k*k, OH*OW), a copy."""
    xp = np.pad(x, ((0, 0), (p, p), (p, p))) if p else x
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(1, 2))[:, ::s, ::s]
    c, oh, ow = win.shape[:3]
    return np.ascontiguousarray(win.transpose(0, 3, 4, 1, 2)).reshape(c, k * k, oh * ow)


def conv_numpy(x, w, b, case):
    """Conv of x (1, C, H, W) with w (O, C/g, k, k), bias b, as im2col + matmul."""
    c, h, wd, o, k, s, p, g = case.dims
    oh, ow = _conv_out(case)
    cols = _im2col(x[0], k, s, p)
    if g == 1:
        y = w.reshape(o, -1) @ cols.reshape(c * k * k, -1)
    elif g == c == o:  # depthwise
        y = np.einsum("ckp,ck->cp", cols, w.reshape(c, k * k))
    else:
        raise NotImplementedError("grouped conv other than depthwise")
    return (y + b[:, None]).reshape(1, o, oh, ow)


def make_data(case) -> dict:
    """Inputs (fp32, fixed seed) and the float64 numpy reference output."""
    rng = np.random.default_rng(0)

    def randn(*shape):
        return (rng.standard_normal(shape) * 0.1).astype("float32")

    if case.kind == "mm":
        m, k, n = case.dims
        d = {"x": randn(m, k), "w": randn(k, n)}
        ref = d["x"].astype("float64") @ d["w"].astype("float64")
    else:
        c, h, w, o, k, s, p, g = case.dims
        d = {"x": randn(1, c, h, w), "w": randn(o, c // g, k, k), "b": randn(o)}
        ref = conv_numpy(d["x"].astype("float64"), d["w"].astype("float64"), d["b"].astype("float64"), case)
    if case.fused:
        d["r"] = randn(*ref.shape)
        ref = np.maximum(ref + d["r"], 0)
    d["ref"] = ref
    d["y"] = np.zeros(ref.shape, "float32")
    return d


def onnx_model(case, d):
    """One-node MatMul / Conv model (+ Add(residual) + Relu when fused)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(d["w"], "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(d["x"].shape))]
    if case.kind == "mm":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["op"])]
    else:
        c, h, w, o, k, s, p, g = case.dims
        inits.append(numpy_helper.from_array(d["b"], "b"))
        nodes = [
            helper.make_node(
                "Conv", ["x", "w", "b"], ["op"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=g
            )
        ]
    if case.fused:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(d["r"].shape)))
        nodes += [helper.make_node("Add", ["op", "r"], ["sum"]), helper.make_node("Relu", ["sum"], ["y"])]
    else:
        nodes[0].output[0] = "y"
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(d["ref"].shape))]
    graph = helper.make_graph(nodes, "op", inputs, out, initializer=inits)
    # IR 10: the newest onnxruntime 1.31 reads (onnx 1.23 writes 14 by default).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def make_ort(case, d, threads, libs, native):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(onnx_model(case, d).SerializeToString(), so, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    io.bind_cpu_input("x", d["x"])
    if case.fused:
        io.bind_cpu_input("r", d["r"])
    y = np.zeros_like(d["y"])
    io.bind_output("y", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    return Run(lambda: sess.run_with_iobinding(io), lambda: y.copy())


def make_openvino(case, d, threads, libs, native):
    try:
        import openvino as ov
    except ImportError as e:
        raise Skip(f"openvino not installed: {e}") from e
    core = ov.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "op.onnx"
        path.write_bytes(onnx_model(case, d).SerializeToString())
        model = core.read_model(str(path))
    cfg = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(model, "CPU", cfg)
    req = compiled.create_infer_request()
    req.set_tensor("x", ov.Tensor(d["x"], shared_memory=True))
    if case.fused:
        req.set_tensor("r", ov.Tensor(d["r"], shared_memory=True))
    return Run(req.infer, lambda: req.get_output_tensor(0).data.copy())


def make_torch(case, d, threads, libs, native):
    import torch

    torch.set_num_threads(threads)
    x, w = torch.from_numpy(d["x"]), torch.from_numpy(d["w"])
    y = torch.from_numpy(np.zeros_like(d["y"]))
    r = torch.from_numpy(d["r"]) if case.fused else None
    if case.kind == "mm":

        def op():
            torch.matmul(x, w, out=y)
            return y
    else:
        b = torch.from_numpy(d["b"])
        c, h, wd, o, k, s, p, g = case.dims

        def op():
            return torch.nn.functional.conv2d(x, w, b, s, p, 1, g)

    box = {}

    def call():
        with torch.inference_mode():
            out = op()
            if r is not None:
                out = torch.relu_(out + r)
            box["y"] = out

    return Run(call, lambda: box["y"].numpy().copy())


def make_numpy(case, d, threads, libs, native):
    x, w, y = d["x"], d["w"], np.zeros_like(d["y"])
    r = d.get("r")
    if case.kind == "mm":

        def call():
            np.matmul(x, w, out=y)
            if r is not None:
                np.add(y, r, out=y)
                np.maximum(y, 0, out=y)
    else:

        def call():
            y[...] = conv_numpy(x, w, d["b"], case)
            if r is not None:
                np.add(y, r, out=y)
                np.maximum(y, 0, out=y)

    return Run(call, lambda: y.copy())


def _ptr(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if a is not None else None


def _native_run(lib, run_fn, args, output, handle, destroy):
    """Run whose timing loop is inside C++: run_fn(handle, *args, n, ns_out)."""
    buf = np.empty(300)

    def timed(n):
        b = buf if n <= len(buf) else np.empty(n)
        run_fn(handle, *args, n, b.ctypes.data)
        return b[:n].copy()

    run = Run(lambda: timed(1), output, timed=timed, close=lambda: destroy(handle))
    return run


def _onednn(case, d, threads, libs, native, nhwc):
    if "onednn" not in libs:
        raise Skip(native["onednn"])
    lib = libs["onednn"]
    lib.onednn_matmul_create.restype = lib.onednn_conv_create.restype = ctypes.c_void_p
    lib.onednn_impl.restype = ctypes.c_char_p
    lib.onednn_impl.argtypes = lib.onednn_destroy.argtypes = [ctypes.c_void_p]
    lib.onednn_run.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p]
    fused = int(case.fused)
    y = np.zeros_like(d["y"])
    x, r = d["x"], d.get("r")
    keep = [d["w"]]
    if case.kind == "mm":
        if nhwc:
            raise Skip("conv only")
        m, k, n = case.dims
        h = lib.onednn_matmul_create(m, k, n, _ptr(d["w"]), None, fused, threads)
        output = y.copy
    else:
        c, hh, ww, o, k, s, p, g = case.dims
        oh, ow = _conv_out(case)
        if nhwc:  # the executable would keep activations channels-last end to end
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
            r = np.ascontiguousarray(r.transpose(0, 2, 3, 1)) if r is not None else None
            y = np.zeros((1, oh, ow, o), "float32")
        h = lib.onednn_conv_create(
            1, c, hh, ww, o, k, k, s, s, p, p, g, oh, ow, _ptr(d["w"]), _ptr(d["b"]), fused, int(nhwc), threads
        )
        output = (lambda: y.transpose(0, 3, 1, 2).copy()) if nhwc else y.copy
    keep += [x, r, y]
    run = _native_run(
        lib,
        lib.onednn_run,
        [x.ctypes.data, r.ctypes.data if r is not None else None, y.ctypes.data],
        output,
        h,
        lib.onednn_destroy,
    )
    run.info = lib.onednn_impl(h).decode()
    run.keep = keep
    return run


def make_onednn(case, d, threads, libs, native):
    return _onednn(case, d, threads, libs, native, nhwc=False)


def make_onednn_nhwc(case, d, threads, libs, native):
    return _onednn(case, d, threads, libs, native, nhwc=True)


def _mkl(case, d, threads, libs, native, packed):
    if "mkl" not in libs:
        raise Skip(native["mkl"])
    if case.kind != "mm":
        raise Skip("BLAS has no conv")
    if case.fused:
        raise Skip("BLAS has no epilogue")
    lib = libs["mkl"]
    lib.mkl_matmul_create.restype = ctypes.c_void_p
    lib.mkl_matmul_create.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.mkl_run.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p]
    lib.mkl_destroy.argtypes = [ctypes.c_void_p]
    m, k, n = case.dims
    y = np.zeros_like(d["y"])
    h = lib.mkl_matmul_create(m, k, n, d["w"].ctypes.data, int(packed), threads)
    run = _native_run(lib, lib.mkl_run, [d["x"].ctypes.data, y.ctypes.data], y.copy, h, lib.mkl_destroy)
    run.keep = [y]
    return run


def make_mkl(case, d, threads, libs, native):
    return _mkl(case, d, threads, libs, native, packed=False)


def make_mkl_packed(case, d, threads, libs, native):
    return _mkl(case, d, threads, libs, native, packed=True)


def make_tvm(case, d, threads, libs, native):
    if case.kind != "mm" or case.fused:
        raise Skip("only the unscheduled te matmul is built")
    try:
        import tvm
        import tvm_ffi
        from tvm import te
    except ImportError as e:
        raise Skip(f"tvm not installed: {e}") from e
    m, k, n = case.dims
    if m * k * n > 128 * 768 * 768:
        raise Skip("unscheduled build too slow (> 1 s per call)")
    a = te.placeholder((m, k), "float32", name="a")
    w = te.placeholder((k, n), "float32", name="w")
    kk = te.reduce_axis((0, k), name="kk")
    y = te.compute((m, n), lambda i, j: te.sum(a[i, kk] * w[kk, j], axis=kk), name="y")
    f = tvm.compile(
        tvm.IRModule({"mm": te.create_prim_func([a, w, y]).with_attr("global_symbol", "mm")}), target="llvm"
    )["mm"]
    out = np.zeros_like(d["y"])
    ta, tw, ty = (tvm_ffi.from_dlpack(v) for v in (d["x"], d["w"], out))
    return Run(lambda: f(ta, tw, ty), out.copy)


ENGINE_MAKERS = {
    "ort": make_ort,
    "openvino": make_openvino,
    "torch": make_torch,
    "numpy": make_numpy,
    "onednn": make_onednn,
    "onednn-nhwc": make_onednn_nhwc,
    "mkl": make_mkl,
    "mkl-packed": make_mkl_packed,
    "tvm": make_tvm,
}


def _per_call_ns(fn, n=200_000) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return round(best, 1)


def dispatch_costs(libs, native) -> dict:
    """ns per call of a trivial kernel through each calling route (best of 5 loops)."""
    out = {}
    if "dispatch" in libs:
        lib = libs["dispatch"]
        lib.dispatch_cpp_loop_ns.restype = ctypes.c_double
        out["C++ loop, function pointer"] = round(min(lib.dispatch_cpp_loop_ns(10_000_000) for _ in range(5)), 2)
        noop = lib.dispatch_noop
        out["Python -> ctypes, no args"] = _per_call_ns(noop)
        a, b = np.arange(4, dtype="float32"), np.zeros(4, "float32")
        add = lib.dispatch_add_one
        add.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        pa, pb = a.ctypes.data, b.ctypes.data
        out["Python -> ctypes, add_one(2 pointers)"] = _per_call_ns(lambda: add(pa, pb))
    else:
        out["C++ / ctypes"] = "skip: " + native.get("dispatch", "")
    try:
        import tvm
        import tvm_ffi
        from tvm import te
    except ImportError as e:
        out["TVM"] = f"skip: {e}"
        return out
    a_ = te.placeholder((4,), "float32", name="a")
    b_ = te.compute((4,), lambda i: a_[i] + 1.0, name="b")
    mod = tvm.IRModule({"add_one": te.create_prim_func([a_, b_]).with_attr("global_symbol", "add_one")})
    with tempfile.TemporaryDirectory() as tmp:
        so = str(Path(tmp) / "add_one.so")
        tvm.compile(mod, target="llvm").export_library(so)
        f = tvm.runtime.load_module(so)["add_one"]
        ta, tb = tvm_ffi.from_dlpack(np.arange(4, dtype="float32")), tvm_ffi.from_dlpack(np.zeros(4, "float32"))
        out["Python -> TVM ffi Function (exported .so)"] = _per_call_ns(lambda: f(ta, tb))
        if "dispatch_tvm_ffi" in libs:
            fn = libs["dispatch_tvm_ffi"].dispatch_tvm_ffi_ns
            fn.restype = ctypes.c_double
            fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
            check = ctypes.c_float()
            ns = min(fn(so.encode(), b"add_one", 2_000_000, ctypes.byref(check)) for _ in range(5))
            out["C++ -> TVM ffi Function (Module::LoadFromFile, libtvm_ffi only)"] = (
                round(ns, 2) if check.value == 2.0 else f"wrong result {check.value}"
            )
        else:
            out["C++ -> TVM ffi"] = "skip: " + native.get("dispatch_tvm_ffi", "")
    return out


def versions() -> str:
    import platform

    vs = [platform.processor() or platform.machine()]
    for mod in ("onnxruntime", "openvino", "torch", "numpy", "tvm"):
        try:
            vs.append(f"{mod} {__import__(mod).__version__}")
        except Exception:  # noqa: BLE001 - report what is there
            vs.append(f"{mod} missing")
    return ", ".join(vs)
