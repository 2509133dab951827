"""Polls the event log for the trainer, in the trainer's own thread.

:meth:`Fetcher.get` gathers up to ``batch_size`` records within
``max_wait_s`` and reports an idle stream as :data:`IDLE`; it also refreshes
the consumer's lag, for the metrics, at most every ``lag_every_s``.

Polling used to run one batch ahead in a second thread (``trainer.prefetch``).
Measured back to back it was no faster on the shared cores (decoding holds
the GIL, and no core is idle to overlap on: ``docs/benchmarks.md``,
*Training*), so it was removed; the loop polls between batches. Positions
are committed by the loop after the work they stand for is durable.
"""

from __future__ import annotations

import time

from feature_store.errors import BackendUnavailable
from feature_store.eventlog.base import ConsumedEvent, EventConsumer

IDLE: list[ConsumedEvent] = []
"""What :meth:`Fetcher.get` returns when a full ``max_wait`` found nothing (the stream is idle)."""


class Fetcher:
    """Batches from ``consumer`` for the loop; see the module docstring."""

    def __init__(
        self,
        consumer: EventConsumer,
        batch_size: int,
        max_wait_s: float,
        lag_every_s: float = 1.0,
    ) -> None:
        self.consumer = consumer
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.lag_every_s = lag_every_s
        self._next_lag = 0.0
        self.lag = 0
        """Records behind the log's end, summed over partitions (refreshed every second)."""
        self.error: str | None = None

    def get(self) -> list[ConsumedEvent]:
        """The next batch, or :data:`IDLE` if ``max_wait_s`` passed with nothing to read.

        Records of a partition taken from this consumer while the batch was gathered (a
        rebalance inside one of its polls) are left out: the partition's new owner reads
        them from the last commit, and must be the only one to train them.
        """
        self._refresh_lag()
        records = self._fetch()
        if records:
            owned = set(self.consumer.assignment())
            if any(r.partition not in owned for r in records):
                records = [r for r in records if r.partition in owned]
        return records or IDLE

    def _refresh_lag(self) -> None:
        now = time.monotonic()
        if now >= self._next_lag:
            self._next_lag = now + self.lag_every_s
            try:
                self.lag = int(sum(self.consumer.lag().values()))
            except BackendUnavailable as exc:
                self.error = str(exc)

    def _fetch(self) -> list[ConsumedEvent]:
        deadline = time.monotonic() + self.max_wait_s
        records: list[ConsumedEvent] = []
        while len(records) < self.batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            records += self.consumer.poll(self.batch_size - len(records), timeout_s=remaining)
        return records
