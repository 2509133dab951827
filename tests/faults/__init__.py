"""The fault suite (issue #13): real redis-server, a real broker, real processes, kill -9.

Marked ``faults`` (``./scripts/test -m faults`` runs it alone); part of the
default run too. ``bench/bench_faults.py`` runs the same scenarios longer and
prints their figures.
"""
