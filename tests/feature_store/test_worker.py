"""Background threads: started once, stopped without waiting out their interval."""

from __future__ import annotations

import threading
import time

import pytest

from feature_store.runtime.worker import Worker, periodic


def test_stop_wakes_a_waiting_loop_and_joins_it() -> None:
    ticks: list[int] = []
    worker = periodic("test-periodic", 3600.0, lambda: ticks.append(1))
    worker.start()
    worker.start()  # a no-op while it runs: still one thread
    assert worker.alive and worker.thread is not None and worker.thread.daemon
    assert worker.thread.name == "test-periodic"
    started = time.monotonic()
    worker.stop()
    assert not worker.alive
    assert time.monotonic() - started < 60, "stop waited out the hour-long interval"
    assert ticks == []


def test_a_failing_tick_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = threading.Semaphore(0)

    def tick() -> None:
        calls.release()
        raise RuntimeError("boom")

    with periodic("test-failing", 0.001, tick):
        assert calls.acquire(timeout=30) and calls.acquire(timeout=30)
    assert "test-failing: background tick failed" in caplog.text


def test_a_stopped_worker_starts_again_and_may_stop_itself() -> None:
    runs: list[str] = []

    def run(stop: threading.Event) -> None:
        runs.append(threading.current_thread().name)
        me.stop()  # from its own thread: sets the flag, does not join itself
        assert stop.is_set()

    me = Worker("test-self-stop", run)
    for _ in range(2):
        me.start()
        me.stop()
    assert runs == ["test-self-stop", "test-self-stop"]
