"""onnxruntime: the library backend, and korch's graph exported back to ONNX with its ONNX-to-ONNX passes."""
