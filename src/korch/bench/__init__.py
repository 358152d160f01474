"""Side-by-side measurement against peers (onnxruntime here; more in benchmarks/)."""
