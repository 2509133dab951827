"""The one atomic-write helper: a reader sees the old file or the new one, never half."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from feature_store import atomic
from feature_store.atomic import atomic_binary, atomic_json, atomic_write


def test_each_form_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    atomic_write(tmp_path / "a.txt", "é\n")
    atomic_write(tmp_path / "b.bin", b"\x00\xff")
    atomic_json(tmp_path / "c.json", {"b": 1, "a": 2}, sort_keys=True)
    with atomic_binary(tmp_path / "b.bin") as out:
        out.write(b"\x01")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "é\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x01"
    assert (tmp_path / "c.json").read_text() == '{"a": 2, "b": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_json(target, {"seq": 1})
    with pytest.raises(TypeError):
        atomic_json(target, {"seq": object()})  # not JSON: fails half-way through the dump
    assert json.loads(target.read_text()) == {"seq": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_file_and_then_its_directory_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    atomic_write(tmp_path / "x", b"data")
    assert synced == ["file", "dir"]
