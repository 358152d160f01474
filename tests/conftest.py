"""Session-wide test settings."""

import os

# No GPU here: every Triton kernel a test runs, runs under Triton's interpreter. Set
# before anything imports triton: a function triton.jit made before it is set (tl.zeros
# in triton.language, say) can never be interpreted, so a test that imported triton
# first (torch.compile does) broke every Triton test after it.
os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture
def quick_settings(tmp_path):
    """``Settings`` for a whole optimization in a test: a fresh database under
    ``tmp_path``, few timing repeats, one thread, no progress bars; keywords override."""
    from korch.config import Settings

    def make(**overrides) -> Settings:
        base = dict(
            db_path=str(tmp_path / "results.db"),
            progress=False,
            warmup=1,
            repeat=3,
            min_repeat_ms=0.2,
            num_threads=1,
        )
        return Settings(**{**base, **overrides})

    return make
