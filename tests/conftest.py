"""Session-wide test settings."""

import os

# No GPU here: every Triton kernel a test runs, runs under Triton's interpreter. Set
# before anything imports triton: a function triton.jit made before it is set (tl.zeros
# in triton.language, say) can never be interpreted, so a test that imported triton
# first (torch.compile does) broke every Triton test after it.
os.environ.setdefault("TRITON_INTERPRET", "1")
