"""Refits of the sequence tower in a child process (:func:`main`, started by :class:`RemoteFit`).

Why a process: a refit is seconds of small torch operations, mostly Python
glue that holds the GIL. On a thread it would take the GIL from the trainer's
thread (and, embedded, from the API's) for those seconds: measured as the
window between a batch's journal line and its group progress widening from
under a millisecond to the GIL's switch interval and more, which is the
window a SIGKILL must miss for exactly-once (``trainer/distributed.py``). In a
process of its own, with one torch thread, it costs a core's time, never the
GIL.

Protocol (stdin / stdout of the child, trusted: a child this trainer
started): frames of an 8-byte big-endian length and a ``torch.save`` of a
dict of tensors and numbers, loaded with ``weights_only=True``. Requests:
``{"op": "fit", "lengths", "flat", "items"}`` (the users' views as one flat
code array) -> ``{"state": weights or {}, "steps", "loss"}``;
``{"op": "load", "state"}`` -> ``{}``. The child starts at the first refit;
a child that died is replaced at the next one, which goes on from the newest
weights it returned or was given.
"""

from __future__ import annotations

import io
import json
import logging
import math
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

import numpy as np
import torch

from feature_store.errors import VidrecError
from feature_store.settings import SequenceSettings
from trainer.sequence_fit import State, TowerFit

log = logging.getLogger(__name__)

LENGTH = struct.Struct(">Q")
POLL_S = 0.2
"""How often a waiting refit looks whether it was asked to stop (seconds)."""


class WorkerFailed(VidrecError):
    """The refit worker died or answered nonsense (the next refit starts another)."""


def send(stream: IO[bytes], message: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    data = buffer.getvalue()
    stream.write(LENGTH.pack(len(data)) + data)
    stream.flush()


def receive(stream: IO[bytes]) -> dict[str, Any]:
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        raise EOFError("the other end closed")
    (size,) = LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other end closed mid-frame")
    message: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
    return message


def pack(views: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The users' views as (lengths, one flat array of codes)."""
    lengths = torch.tensor([len(v) for v in views], dtype=torch.int64)
    flat = torch.tensor([c for v in views for c in v], dtype=torch.int32)
    return lengths, flat


def unpack(lengths: torch.Tensor, flat: torch.Tensor) -> list[list[int]]:
    bounds = np.concatenate([[0], np.cumsum(lengths.numpy())])
    codes = flat.tolist()
    return [codes[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


class RemoteFit:
    """A :class:`~trainer.sequence_fit.Fitter` whose network lives in a child process."""

    def __init__(self, settings: SequenceSettings, seed: int = 0) -> None:
        self.settings = settings
        self.seed = seed
        self.steps = 0
        self.last_loss = math.nan
        self.warm: State | None = None
        """The newest weights returned or loaded: a restarted child goes on from them."""
        self._child: subprocess.Popen[bytes] | None = None

    def fit(self, views: Sequence[Sequence[int]], items: int,
            stop: threading.Event | None = None) -> State | None:
        self.start(views, items)
        return self.result(stop)

    def start(self, views: Sequence[Sequence[int]], items: int) -> None:
        """Send a refit to the child (started if need be); :meth:`result` waits for it."""
        child = self._running()
        lengths, flat = pack(views)
        self._send(child, {"op": "fit", "lengths": lengths, "flat": flat, "items": items})

    def result(self, stop: threading.Event | None = None) -> State | None:
        """The weights of the refit :meth:`start` sent; None when it had nothing to train
        on, or ``stop`` was set first (the child is killed)."""
        child = self._child
        if child is None:
            raise WorkerFailed("no refit under way")
        reply = self._wait(child, stop)
        if reply is None:
            return None
        self.steps, self.last_loss = int(reply["steps"]), float(reply["loss"])
        state: State = reply["state"]
        if not state:
            return None
        self.warm = state
        return state

    def load(self, state: State) -> None:
        self.warm = state
        if self._child is not None and self._child.poll() is None:
            self._send(self._child, {"op": "load", "state": state})
            self._wait(self._child, None)

    def close(self) -> None:
        """Kill the child (it may be minutes into a refit) and close its pipes."""
        child, self._child = self._child, None
        if child is None:
            return
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()

    def _running(self) -> subprocess.Popen[bytes]:
        child = self._child
        if child is not None and child.poll() is None:
            return child
        self.close()  # a child that died: its pipes
        child = self._child = subprocess.Popen(
            # -c, not -m: the package's import already loads this module (runpy warns).
            [sys.executable, "-c", "from trainer.sequence_worker import main; main()",
             self.settings.model_dump_json(), str(self.seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        if self.warm is not None:
            self._send(child, {"op": "load", "state": self.warm})
            self._wait(child, None)
        return child

    def _send(self, child: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        assert child.stdin is not None
        try:
            send(child.stdin, message)
        except OSError as exc:
            self.close()
            raise WorkerFailed(f"the refit worker failed: {exc}") from exc

    def _wait(self, child: subprocess.Popen[bytes],
              stop: threading.Event | None) -> dict[str, Any] | None:
        """The child's reply; None when ``stop`` was set first (the child is killed: it may
        be minutes into a refit)."""
        assert child.stdout is not None
        try:
            while not select.select([child.stdout], [], [], POLL_S)[0]:
                if stop is not None and stop.is_set():
                    self.close()
                    return None
                if child.poll() is not None:
                    raise WorkerFailed(f"the refit worker exited with {child.returncode}")
            return receive(child.stdout)
        except (OSError, EOFError) as exc:
            self.close()
            raise WorkerFailed(f"the refit worker failed: {exc}") from exc


def serve(settings: SequenceSettings, seed: int, inbox: IO[bytes], outbox: IO[bytes]) -> None:
    """The child's loop: answer requests until the parent closes the pipe."""
    fit = TowerFit(settings, seed)
    while True:
        try:
            message = receive(inbox)
        except EOFError:
            return
        if message["op"] == "load":
            fit.load(message["state"])
            send(outbox, {})
            continue
        state = fit.fit(unpack(message["lengths"], message["flat"]), int(message["items"]))
        send(outbox, {"state": state or {}, "steps": fit.steps, "loss": fit.last_loss})


def main() -> None:
    settings = SequenceSettings.model_validate(json.loads(sys.argv[1]))
    torch.set_num_threads(1)  # one core for refits; the trainer and the API keep theirs
    serve(settings, int(sys.argv[2]), sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
