"""Optimizations that raised: skipped, and recorded for ``report.json``.

Note [Skipped optimizations]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Past the frontend every stage is an optimization of a model that already has a
meaning: a rewrite rule at one match, a raising or export pass, one candidate's tile
config or build. When one raises on a valid model (a rule whose precondition was not
checked: issue 26, ``sink_pointwise_conv`` on a rank-0 scalar), the model must still
compile. So each such unit runs under ``guarded``: an exception skips that unit alone
(the rule is not applied there, the pass does not run, the candidate is dropped) and
is recorded as a ``Skipped`` value in the innermost ``collecting()`` block;
``run_pipeline`` puts them in ``report.json`` under ``skipped`` and the summary counts
them.

What is not contained: the frontend (a malformed model gets its clear ``ModelError``),
``KorchError`` in general (the user's input or setup), ``KeyboardInterrupt`` (not an
``Exception``) and correctness checks (the verifier between stages, the comparison
with onnxruntime): a wrong number is a bug, not an optimization to skip, and those
checks run outside any guard. A guard changes nothing when nothing raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from korch.errors import KorchError

log = logging.getLogger("korch")

T = TypeVar("T")

# messages are kept to this many characters (a traceback's last line is enough)
_MESSAGE_CHARS = 500


@dataclasses.dataclass(frozen=True)
class Skipped:
    """One optimization unit that raised and was skipped.

    ``stage``: the pipeline stage ("rewrite", "export", "tiling", "build");
    ``unit``: the rule, pass or candidate; ``error``: the exception's type name.
    """

    stage: str
    unit: str
    error: str
    message: str

    def as_dict(self, count: int = 1) -> dict[str, Any]:
        return {"stage": self.stage, "unit": self.unit, "error": self.error, "message": self.message, "count": count}


class Collector:
    """The records of one ``collecting()`` block; a unit failing again (the search
    meets the same rule at the same match in many graphs) is counted, not repeated."""

    def __init__(self) -> None:
        self.counts: dict[Skipped, int] = {}

    def add(self, s: Skipped) -> None:
        self.counts[s] = self.counts.get(s, 0) + 1

    def __len__(self) -> int:
        return len(self.counts)

    def records(self) -> list[dict[str, Any]]:
        """For ``report.json``: in the order first met."""
        return [s.as_dict(n) for s, n in self.counts.items()]


# a stack, not a context variable: worker threads (the profiler's pool) record into the
# pipeline's collector too
_ACTIVE: list[Collector] = []
_LOCK = threading.Lock()


@contextlib.contextmanager
def collecting() -> Iterator[Collector]:
    """Collect the ``Skipped`` records of everything run inside the block."""
    c = Collector()
    with _LOCK:
        _ACTIVE.append(c)
    try:
        yield c
    finally:
        with _LOCK:
            _ACTIVE.remove(c)


def record(stage: str, unit: str, exc: BaseException | str, error: str | None = None) -> Skipped:
    """Record ``exc`` (or a message, with ``error`` its kind) as a skipped ``unit``."""
    if isinstance(exc, BaseException):
        error, message = type(exc).__name__, str(exc)
    else:
        error, message = error or "Error", exc
    s = Skipped(stage, str(unit), error, message.strip()[:_MESSAGE_CHARS])
    log.warning("%s: skipped %s after %s: %s (Note [Skipped optimizations])", stage, unit, s.error, s.message)
    with _LOCK:
        if _ACTIVE:
            _ACTIVE[-1].add(s)
    return s


def guarded(stage: str, unit: str, fn: Callable[..., T], *args: Any, default: Any = None, **kwargs: Any) -> T | Any:
    """``fn(*args, **kwargs)``, or ``default`` with the exception recorded if it raises
    (Note [Skipped optimizations]).

    Precondition: ``fn`` is an optimization that leaves its inputs as they were when
    it raises (a pure function, or one that works on its own copy), so that skipping
    it leaves the program unchanged. ``KorchError`` and non-``Exception`` errors pass.
    """
    try:
        return fn(*args, **kwargs)
    except KorchError:
        raise
    except Exception as e:  # noqa: BLE001 - the point: an optimization that raises is skipped
        record(stage, unit, e)
        return default


def run_passes(stage: str, build: Callable[[], T], passes: list[Callable[[T], T]]) -> T:
    """``build()``'s result through ``passes`` in order, skipping a pass that raises.

    A pass may change its argument in place (the ONNX export passes edit the model),
    so one that raises half way cannot be undone: the value is built again and the
    passes before it applied again (precondition: ``build`` and the passes are
    deterministic). Nothing is copied or built twice when nothing raises.
    """
    done: list[Callable[[T], T]] = []
    x = build()
    for p in passes:
        try:
            x = p(x)
        except KorchError:
            raise
        except Exception as e:  # noqa: BLE001 - Note [Skipped optimizations]
            record(stage, getattr(p, "__name__", repr(p)), e)
            x = build()
            for q in done:
                x = q(x)
            continue
        done.append(p)
    return x


__all__ = ["Collector", "Skipped", "collecting", "guarded", "record", "run_passes"]
