"""Polls the event log in its own thread, one batch ahead of training.

Why: polling decodes and validates every record (Python work, GIL held)
while a training step spends much of its time where the GIL is released
(torch kernels, Redis round trips, numpy). Fetching batch k+1 while batch k
trains overlaps the two on a second core.

The consumer is touched by this thread only (kafka-python's consumer is not
thread-safe): the loop asks for commits through :meth:`Fetcher.call`, which
runs the call here between polls, and reads the lag this thread measures.
Prefetched batches are never committed until trained: the loop commits the
positions of what it trained, so a batch still in the queue when the trainer
stops is simply read again by the next run.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from feature_store.errors import BackendUnavailable
from feature_store.eventlog.base import ConsumedEvent, EventConsumer
from feature_store.worker import Worker

log = logging.getLogger(__name__)

T = TypeVar("T")

IDLE: list[ConsumedEvent] = []
"""Put in the queue when a full ``max_wait`` found nothing (the stream is idle)."""


class Fetcher:
    """Owns ``consumer`` while started; see the module docstring."""

    def __init__(
        self,
        consumer: EventConsumer,
        batch_size: int,
        max_wait_s: float,
        lag_every_s: float = 1.0,
        depth: int = 1,
        threaded: bool = True,
    ) -> None:
        self.consumer = consumer
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.lag_every_s = lag_every_s
        self._queue: queue.Queue[list[ConsumedEvent]] = queue.Queue(maxsize=depth)
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._worker = Worker("vidrec-fetcher", lambda stop: self._run(), join_timeout_s=30)
        self._stop = self._worker.stop_event
        self._paused = threading.Event()
        self.threaded = threaded
        """False: poll in the caller's thread on :meth:`get` (no overlap, no extra thread)."""
        self._next_lag = 0.0
        self.lag = 0
        """Records behind the log's end, summed over partitions (refreshed every second)."""
        self.error: str | None = None

    # --- the loop's side -------------------------------------------------

    def start(self) -> None:
        if not self.threaded:
            return
        self._worker.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop polling and join; the consumer is the caller's again afterwards."""
        self._worker.stop(timeout_s)
        self._serve_calls()  # anything asked while the thread was finishing

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def get(self, timeout_s: float) -> list[ConsumedEvent] | None:
        """The next batch (``IDLE`` if the stream was idle), or None after ``timeout_s``."""
        if not self.threaded:
            self._refresh_lag()
            return self._fetch() or IDLE
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def call(self, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
        """Run ``fn`` (which uses the consumer) on the fetcher's thread and return its result."""
        thread = self._worker.thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return fn()
        future: Future[T] = Future()
        self._calls.put((fn, future))
        return future.result(timeout=timeout_s)

    # --- the fetcher's thread -------------------------------------------

    def _serve_calls(self) -> None:
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered to the caller
                future.set_exception(exc)

    def _refresh_lag(self) -> None:
        now = time.monotonic()
        if now >= self._next_lag:
            self._next_lag = now + self.lag_every_s
            try:
                self.lag = int(sum(self.consumer.lag().values()))
            except BackendUnavailable as exc:
                self.error = str(exc)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._serve_calls()
            self._refresh_lag()
            if self._paused.is_set():
                self._stop.wait(0.02)
                continue
            try:
                records = self._fetch()
                failures = 0
            except BackendUnavailable as exc:
                self.error = str(exc)
                failures += 1
                log.warning("poll failed (%s); retrying", exc)
                self._stop.wait(min(5.0, 0.2 * 2**failures))
                continue
            self._hand_over(records if records else IDLE)
        self._serve_calls()

    def _fetch(self) -> list[ConsumedEvent]:
        deadline = time.monotonic() + self.max_wait_s
        records: list[ConsumedEvent] = []
        while len(records) < self.batch_size and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            records += self.consumer.poll(self.batch_size - len(records), timeout_s=remaining)
            self._serve_calls()
        return records

    def _hand_over(self, records: list[ConsumedEvent]) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(records, timeout=0.01)
                return
            except queue.Full:
                self._serve_calls()  # the loop may be waiting on a commit
