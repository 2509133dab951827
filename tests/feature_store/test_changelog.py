"""The change log that serving's per-video rows follow."""

from __future__ import annotations

from feature_store.changelog import ChangeLog


def test_readers_get_what_changed_after_their_sequence_number() -> None:
    log = ChangeLog(capacity=4)
    assert log.since(0) == (0, [])
    log.append(["a", "b"])
    seq, ids = log.since(0)
    assert (seq, ids) == (2, ["a", "b"])
    log.append(["c"])
    assert log.since(seq) == (3, ["c"])
    assert log.since(3) == (3, [])


def test_a_reader_left_behind_is_told_to_start_over() -> None:
    log = ChangeLog(capacity=2)
    log.append(["a", "b", "c", "d", "e"])  # past 2 x capacity: the oldest are dropped
    seq, ids = log.since(0)
    assert ids is None and seq == 5
    assert log.since(4) == (5, ["e"])
    log.everything_changed()
    seq, ids = log.since(5)
    assert ids is None and seq > 5
    assert log.since(seq) == (seq, [])
