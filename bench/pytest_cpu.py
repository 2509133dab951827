"""A pytest plugin printing each test's wall and CPU seconds (docs/benchmarks.md, *Test
suite wall time*).

CPU is this process's plus that of the children it reaped during the test (the
``vidrec`` processes, brokers and servers a test starts), since on a shared machine the
load moves wall time by 2-3x while CPU stays put. Use:
``python -m pytest FILES -q -s -p bench.pytest_cpu``.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator

import pytest


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Setup, call and teardown of ``item``, timed together."""
    wall, cpu = time.perf_counter(), _cpu_s()
    yield
    print(f"\ncpu-plugin {item.nodeid}: wall {time.perf_counter() - wall:.1f} s, "
          f"cpu {_cpu_s() - cpu:.1f} s")
