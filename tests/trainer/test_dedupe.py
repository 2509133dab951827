"""The dedupe window of recently trained event ids."""

from __future__ import annotations

from trainer.dedupe import DedupeWindow


def test_repeats_are_dropped_within_and_across_batches() -> None:
    window = DedupeWindow(capacity=100)
    assert window.admit(["a", "b", "a"]) == [0, 1]
    assert window.admit(["b", "c"]) == [1]
    assert window.duplicates == 2


def test_window_forgets_the_oldest_beyond_capacity() -> None:
    window = DedupeWindow(capacity=3)
    window.admit(["a", "b", "c", "d"])
    assert "a" not in window and "d" in window
    assert window.admit(["a"]) == [0]


def test_round_trip_through_array_keeps_order_and_members() -> None:
    window = DedupeWindow(capacity=10)
    window.admit([f"e{i}" for i in range(12)])
    restored = DedupeWindow(capacity=10)
    restored.load_array(window.to_array())
    assert restored.admit(["e5", "e0"]) == [1]  # e0 was beyond the window
    assert len(restored) == 10  # e0 pushed out e2


def test_zero_capacity_disables_dedupe() -> None:
    assert DedupeWindow(capacity=0).admit(["a", "a"]) == [0, 1]
