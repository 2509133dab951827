"""The request's other work on a helper thread, beside the ranker's ONNX run.

ONNX Runtime releases the GIL while a session runs: a 500-candidate run is
about a quarter of a recommend's time (``bench/bench_serving.py``) during
which the process could compute what does not need the ranker's scores: the
two-tower affinity (and, for given candidates, the user vector and the
co-visitation read it needs), the sequence tower's logits and the live
factorisation's scores. :func:`beside` hands that work to a helper thread,
runs the session on the caller's thread, then waits for the work.

That way round, not the run on the helper: the run's first part (turning
three dozen numpy inputs into ONNX Runtime's) holds the GIL, and a helper
started while the caller computes Python waits for the GIL up to a switch
interval before it can even begin; measured so, the overlap saved a third of
what it saves this way. The run releases the GIL right after its inputs, and
the helper, already waiting for it, takes it at once.

A process has one small pool of helpers (:data:`HELPERS` threads, started on
first use): one scoring thread needs one, and a second covers a batch
recommend or a test calling the recommender from two threads at once; a
further caller waits for a free helper, never for work of its own.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")

HELPERS = 2
"""Helper threads of the process (see the module docstring)."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(HELPERS, thread_name_prefix="vidrec-onnx")
    return _pool


def beside(run: Callable[[], T], meanwhile: Callable[[], object] | None) -> T:
    """``run()``'s result, computed on this thread while a helper calls ``meanwhile()``
    (without one: ``run()`` alone). An exception of either is raised here, ``run``'s
    first; ``meanwhile`` has always finished when this returns, so what it computed
    is there to read (and nothing still runs on what the caller passed it)."""
    if meanwhile is None:
        return run()
    # In the request's context: a span the work opens is the request's (tracing).
    future = _helpers().submit(contextvars.copy_context().run, meanwhile)
    try:
        result = run()
    except BaseException:
        wait([future])
        raise
    future.result()
    return result
