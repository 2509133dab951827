"""Checkpoints: everything a restarted trainer needs, written atomically.

Layout under ``<data_dir>/trainer/<group_id>/``::

    checkpoints/<seq>/state.json   positions, counters, joiner, metrics
    checkpoints/<seq>/dense.pt     dense parameters and Adam state
    checkpoints/<seq>/dedupe.npy   the dedupe window (uint64 id hashes)
    checkpoints/<seq>/shown.npy    feature values of the impressions the joiner remembers
    checkpoints/<seq>/sparse/<t>/  sparse tables, when they live in this process
    checkpoints/<seq>/activity/    the activity store, when it lives in this process
    LATEST                         {"seq": ...}, replaced atomically
    audit/<seq>.ids                (debug) ids trained up to checkpoint <seq>
    journal.jsonl                  ids of batches pushed to a durable sparse
                                   backend since the last checkpoint

A checkpoint is assembled in a hidden ``.tmp-*`` directory, fsynced, renamed
to its final name, and only then does ``LATEST`` move (``os.replace`` of a
fsynced file). A crash at any point leaves the previous checkpoint as the
one a restart loads; a half-written one is never read and is swept at the
next start. The last ``keep`` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from feature_store.atomic import atomic_json

LATEST = "LATEST"
STATE_FILE = "state.json"
DENSE_FILE = "dense.pt"
DEDUPE_FILE = "dedupe.npy"
SHOWN_FILE = "shown.npy"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            _fsync_file(path)


class Checkpointer:
    """Numbered checkpoint directories and the pointer to the newest complete one."""

    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.dir = self.root / "checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        for stale in self.dir.glob(".tmp-*"):  # a crash mid-write
            shutil.rmtree(stale, ignore_errors=True)

    def latest_seq(self) -> int | None:
        try:
            seq = json.loads((self.root / LATEST).read_text())["seq"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return None
        return int(seq) if (self.path(int(seq)) / STATE_FILE).is_file() else None

    def path(self, seq: int) -> Path:
        return self.dir / f"{seq:010d}"

    def save(self, seq: int, write: Callable[[Path], None]) -> Path:
        """``write(directory)`` fills a fresh directory that becomes checkpoint ``seq``."""
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.dir))
        try:
            write(tmp)
            _fsync_tree(tmp)
            final = self.path(seq)
            if final.exists():  # left by a run that crashed before moving LATEST
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_json(self.root / LATEST, {"seq": seq})
        self._prune(seq)
        return final

    def _prune(self, newest: int) -> None:
        done = sorted(int(p.name) for p in self.dir.iterdir() if p.name.isdigit())
        for seq in done:
            if seq > newest:  # written by a run whose LATEST never moved: orphan
                shutil.rmtree(self.path(seq), ignore_errors=True)
        kept = [s for s in done if s <= newest][-self.keep :]
        for seq in done:
            if seq < newest and seq not in kept:
                shutil.rmtree(self.path(seq), ignore_errors=True)
