"""The ranker's run beside the request's other work (app/scoring/overlap.py)."""

from __future__ import annotations

import contextvars
import threading

import pytest

from app.scoring.overlap import beside


def test_meanwhile_runs_on_another_thread_and_is_done_when_the_run_returns() -> None:
    seen: list[str] = []
    release = threading.Event()

    def meanwhile() -> None:
        release.wait(30)  # held until the run has started: both are in flight at once
        seen.append(threading.current_thread().name)

    def run() -> int:
        release.set()
        return 7

    assert beside(run, meanwhile) == 7
    assert seen and seen[0] != threading.current_thread().name


def test_without_meanwhile_the_run_is_all() -> None:
    assert beside(lambda: 3, None) == 3


def test_the_runs_error_comes_first_and_meanwhile_has_finished() -> None:
    finished = threading.Event()

    def meanwhile() -> None:
        finished.set()
        raise KeyError("meanwhile")

    def run() -> None:
        raise ValueError("run")

    with pytest.raises(ValueError, match="run"):
        beside(run, meanwhile)
    assert finished.is_set()


def test_an_error_of_meanwhile_reaches_the_caller() -> None:
    def meanwhile() -> None:
        raise KeyError("meanwhile")

    with pytest.raises(KeyError):
        beside(lambda: 1, meanwhile)


def test_meanwhile_sees_the_callers_context() -> None:
    request: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")
    request.set("r1")
    seen: list[str] = []
    beside(lambda: None, lambda: seen.append(request.get()))
    assert seen == ["r1"]
