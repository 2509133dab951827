"""Several trainers in one consumer group: shared progress, one exporter, dense averaging.

Scale-out splits the events topic's partitions among the trainers of one
consumer group (Kafka does the split and moves a partition when its
trainer dies or a new one joins). Everything sparse is already shared: the
tables live in Redis (or Redis Cluster) and every push is durable at once.
Three things are not, and this module adds them. The first two are on for
every trainer with Redis sparse tables, alone or not, so that adding a
second trainer to a running one is safe whatever it was started with; the
third is ``trainer.group_sync``:

**Progress and claims** (``TRAINER_PROGRESS{group}``, a hash partition -> next
offset, and beside it, in the same slot, the claims hash ``{<progress key>}:claims``,
partition -> ``"<expiry ms> <member>"``). Kafka moves a partition from the offset
its last owner *committed*, and a trainer commits only with a checkpoint, every
``checkpoint_every_s``; what the old owner pushed after that is durable in Redis
already. So every batch of every trainer with Redis tables goes through three
steps on these keys (one Lua script each, atomic, no extra round trip over the
read and the write the progress always cost):

1. **claim** (decode stage, :meth:`GroupSync.claim`): for each partition of the
   batch, take its claim (free, released, expired, or already this member's) and
   read its progress, in one script; records below the progress were trained by
   whoever owned the partition before and are dropped. A partition another member
   holds a live claim on is *busy*: its records are given back (the consumer seeks
   back to them, so they are polled again) and the rest of the batch trains; when
   every partition is busy the loop retries the claim with its backoff
   (:class:`PartitionsBusy`) instead of polling in a spin.
2. **fence** (rank stage, before the first write of the batch: the sparse push,
   the activity counters; :meth:`GroupSync.fence`): a claim lasts
   ``claim_ttl_s`` (``trainer.heartbeat_ttl_s``) so that one held by a SIGKILLed
   member frees itself. A member whose claim is older than a third of that
   renews it first, in a script that refuses when the claim is no longer its own
   (it expired and another member took it: this one was paused or starved past
   the TTL). Refused, the batch is dropped before writing anything and given
   back; the claimant trains it.
3. **finish** (record stage, after the pushes landed and the journal line,
   :meth:`GroupSync.finish`): raise each claimed partition's progress past the
   batch and release the claim (expiry 0, still naming the member, so a retry of
   the same call after a lost reply is recognised), in one script that refuses a
   partition whose claim is no longer this member's. Refused there means the
   batch was written by two members: counted (``fenced_late``) and logged as an
   error; it can only happen to a member that stalled past two thirds of the TTL
   between its fence and its push.

Why claims, and not a fencing token checked by the writes themselves: a batch
writes to many keys of many tables (on Redis Cluster, of every slot) through
pipelined rounds that start in the training step, plus the activity store; no
single script or ``MULTI`` can make all of them conditional on a token. What
can be atomic is the decision of *who* trains a range: the claim makes the
progress read and the training of the records after it exclusive, so a member
that loses its partition in a rebalance (a Kafka session expiry while it is
busy: the heartbeat starved on a loaded host) while training a batch finishes
that batch under its claim and the new owner waits for it, then skips what it
trained. Before this, the new owner read the old progress and trained the same
records beside it (issue #22, 7 and 12 events twice at load 12-20).

What is left: a member killed between a batch's first write and its finish
leaves its claim to expire, and the next claimant trains the batch again from
the progress (at least once: a batch the dead member had partly pushed gets
part of its gradient twice, and its journal line, if written, counts it once
more). That is the single-trainer journal's gap, one batch, milliseconds wide.
A claim also never outlives what Redis keeps: the hash outlives the group's
committed offsets, so reset both (``DEL``) together with those offsets when
replaying a group on purpose. Every trainer of a group must speak this protocol:
one still on the old read-then-advance would not see the claims.

A trainer also drops the records of partitions taken from it while it
gathered a batch (a rebalance inside one of its polls): their new owner
reads them from the last commit, and the progress says what was trained.

**One exporter** (``TRAINER_EXPORTER{group}``, a lease: the member's name
with a TTL of ``trainer.heartbeat_ttl_s``, renewed every third of it).
Only the member holding it exports (on its timer, and for the dashboard's
*Export now*: the others do not answer that command) and activates, so the
versions served come from one trainer and the active one never alternates
between trainers' networks. A graceful stop releases it; after a SIGKILL
it expires and the next member to ask takes it.

**Dense parameters** (``TRAINER_DENSE{group}``, a hash member -> parameters;
``trainer.group_sync``). The deep networks are small (tens of thousands of
floats: the ranker, and the two towers of retrieval, averaged together as
one list of tensors) and each trainer trains its own copy on its own
partitions. Every ``dense_sync_every_s``
seconds a trainer writes its parameters (float32, with the time and its
sample count) under its member name and replaces its own by the plain mean
of its own and every peer's latest copy younger than ``3 ×
dense_sync_every_s`` (periodic model averaging, as in local SGD; each keeps
its own Adam moments). Staleness: a peer's copy is at most one period old
when averaged, so two trainers' networks never drift apart for more than
about one period of training, and an export is at most one period of the
other trainers' learning behind. A dead trainer's copy stops being refreshed
and drops out of the mean after three periods (then its field is deleted);
there is no collective to join, so a death never blocks the others, and a
trainer that joins late is pulled to the group's mean at its first sync.

Why Redis by default and ``torch.distributed`` only as an option
(``trainer.dense_sync = "gloo"``, :class:`GlooAveraging`): an all-reduce needs
every member of a fixed-size group to reach the same call. Trainers consume
different partitions at different rates (a per-step gradient all-reduce
runs at the pace of the slowest), and a SIGKILLed member leaves the others
blocked until a timeout and unable to go on without re-forming the group.
The gloo option therefore all-reduces parameter snapshots once per period
in a background thread, with the membership of each round fixed through
Redis, so the loop never waits and a dead member only fails rounds for
three periods; the Redis exchange does the same with fewer moving parts
(no rendezvous stores, no ports between trainers). Both average
parameters, not gradients: between rounds the copies differ (by at most a
period of training), which model averaging tolerates for a network this
size; shorten the period to tighten it. NCCL is not offered: the dense
network is tens of thousands of floats on the CPU.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from torch import nn

from feature_store.constants import TRAINER_DENSE, TRAINER_EXPORTER, TRAINER_PROGRESS
from feature_store.errors import BackendUnavailable, ConfigurationError, StoreUnavailable
from feature_store.eventlog.base import ConsumedEvent
from feature_store.redis_errors import REDIS_FAILURES, redis_errors
from feature_store.runtime.log_summary import LogSummary
from feature_store.runtime.resources import Resources

log = logging.getLogger(__name__)

_HOLDER = """
local function holder(claim)
  if not claim then return nil end
  return string.sub(claim, string.find(claim, ' ', 1, true) + 1)
end
"""
"""A claim is ``"<expiry ms> <member>"``; its member, or nil when there is none."""

_CLAIM = _HOLDER + """
local now = tonumber(ARGV[2])
local out = {}
for i = 4, #ARGV do
  local claim = redis.call('HGET', KEYS[2], ARGV[i])
  local free = (not claim) or holder(claim) == ARGV[1]
  if not free then
    free = tonumber(string.sub(claim, 1, string.find(claim, ' ', 1, true) - 1)) <= now
  end
  if free then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[3] .. ' ' .. ARGV[1])
    out[#out + 1] = redis.call('HGET', KEYS[1], ARGV[i]) or '-1'
  else
    out[#out + 1] = 'busy'
  end
end
return out
"""
"""KEYS: progress, claims; ARGV: member, now (ms), expiry (ms), partitions. Per partition:
its progress ('-1': none) once claimed, or 'busy' (another member's live claim)."""

_RENEW = _HOLDER + """
for i = 3, #ARGV do
  if holder(redis.call('HGET', KEYS[1], ARGV[i])) ~= ARGV[1] then return 0 end
end
for i = 3, #ARGV do redis.call('HSET', KEYS[1], ARGV[i], ARGV[2] .. ' ' .. ARGV[1]) end
return 1
"""
"""KEYS: claims; ARGV: member, new expiry (ms), partitions. 1: all still this member's
(an expired one nobody took is: nobody read the progress after it), renewed; 0: none."""

_FINISH = _HOLDER + """
local refused = {}
for i = 2, #ARGV, 2 do
  if holder(redis.call('HGET', KEYS[2], ARGV[i])) == ARGV[1] then
    local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
    if tonumber(ARGV[i + 1]) > current then
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    end
    redis.call('HSET', KEYS[2], ARGV[i], '0 ' .. ARGV[1])
  else
    refused[#refused + 1] = ARGV[i]
  end
end
return refused
"""
"""KEYS: progress, claims; ARGV: member, then partition, next offset pairs. Raises the
progress (never lowers it) and releases the claim of each partition still claimed by
this member; returns the others (claimed by another member meanwhile: refused)."""

_LEASE = """
local holder = redis.call('GET', KEYS[1])
if not holder or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
"""KEYS[1]: the exporter lease; ARGV: this member, TTL in ms. Take it if free, else renew it
if ours; 1 when this member holds it."""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_HEADER = struct.Struct("<qqq")
"""Published time (ms), samples trained by that member, float count; then the floats."""

STALE_PERIODS = 3
"""A peer's parameters older than this many sync periods are ignored, then deleted."""


def dense_tensors(model: nn.Module) -> list[torch.Tensor]:
    """What is averaged: every parameter and floating-point buffer, in a fixed order."""
    tensors = list(model.parameters())
    return tensors + [b for b in model.buffers() if b.is_floating_point()]


class PartitionsBusy(BackendUnavailable):
    """Every partition of a batch is claimed by another member, training it now: the
    loop's retry asks again after its backoff (the claim is released at the end of that
    member's batch, or expires with it)."""


@dataclass(frozen=True)
class Claimed:
    """What :meth:`GroupSync.claim` left of a batch."""

    kept: list[int]
    """Indices of the records to train (claimed, not trained by anyone yet)."""
    busy: set[int]
    """Partitions another member is training: their records are to be given back."""


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GroupSync:
    """One trainer's view of its group: claims and progress, the exporter lease, dense
    averaging (module doc).

    ``client`` is the process's Redis (or Redis Cluster) client; every key is a
    single hash or string, and the two the claim scripts touch together share a
    slot (the claims key's hash tag is the progress key), so cluster or not,
    each command or script is on one slot.
    """

    def __init__(
        self,
        client: Any,
        group_id: str,
        *,
        every_s: float = 5.0,
        member: str | None = None,
        clock: Callable[[], float] = time.time,
        gloo_address: str | None = None,
        averaging: bool = True,
        lease_ttl_s: float = 15.0,
        claim_ttl_s: float = 15.0,
    ) -> None:
        self.client = client
        self.progress_key = TRAINER_PROGRESS + group_id
        self.claims_key = "{" + self.progress_key + "}:claims"
        """The claims hash: its hash tag is the progress key, so both share a slot on a
        cluster and one script reads and writes both."""
        self.claim_ttl_s = claim_ttl_s
        """Seconds a claim lasts unless renewed (a SIGKILLed member's frees itself)."""
        self._held: dict[int, int] = {}
        """Partitions claimed for the batch in flight (to fence, finish or abandon)."""
        self._claimed_at = 0.0
        self.dense_key = TRAINER_DENSE + group_id
        self.lease_key = TRAINER_EXPORTER + group_id
        self.member = member or f"{socket.gethostname()}-{os.getpid()}"
        self.averaging = averaging
        """Whether dense parameters are averaged (``trainer.group_sync``)."""
        self.lease_ttl_s = lease_ttl_s
        self._lease_until = 0.0
        """Clock time until which this member knows it holds the lease (renewed before)."""
        self._lease_checked = float("-inf")
        self.exporter = False
        """Whether this member held the exporter lease when it last asked."""
        self.every_s = every_s
        self.stale_s = STALE_PERIODS * every_s
        self._clock = clock
        self._last_sync = clock()
        self.syncs = 0
        """Averaging rounds done by this member."""
        self.last_peers = 0
        """Live peers averaged with in the last round."""
        self.skipped = 0
        """Records dropped because another member had trained them."""
        self.given_back = 0
        """Partitions whose records were given back, another member's claim on them live."""
        self.busy_waits = 0
        """Claims refused whole (every partition busy): the loop waited and asked again."""
        self.fenced = 0
        """Batches dropped before writing: their claim had expired and was taken."""
        self.fenced_late = 0
        """Partitions whose finish was refused: written by two members (should stay 0)."""
        self.gloo = (
            None
            if gloo_address is None
            else GlooAveraging(client, group_id, self.member, gloo_address, every_s, clock)
        )
        """``trainer.dense_sync == "gloo"``: averaging by torch.distributed instead."""

    # --- progress and claims (module doc) ---------------------------------------

    def claim(self, records: Sequence[ConsumedEvent], chosen: list[int]) -> Claimed:
        """Claim the partitions of ``chosen`` (indices into ``records``) for this batch and
        keep those of their records no member has trained yet.

        Raises :class:`PartitionsBusy` when every partition is claimed by another member
        (nothing is claimed then: the loop's retry asks again after its backoff).
        """
        partitions = sorted({records[i].partition for i in chosen})
        if not partitions:
            return Claimed(chosen, set())
        started = self._clock()
        now_ms = int(started * 1000)
        expiry = now_ms + int(self.claim_ttl_s * 1000)
        with _errors("claim"):
            raw = self.client.eval(
                _CLAIM, 2, self.progress_key, self.claims_key,
                self.member, now_ms, expiry, *partitions,
            )
        answers = dict(zip(partitions, (_text(v) for v in raw), strict=True))
        busy = {p for p, v in answers.items() if v == "busy"}
        if len(busy) == len(partitions):
            self.busy_waits += 1
            raise PartitionsBusy(
                f"partitions {sorted(busy)} are being trained by another member of the group"
            )
        self._held = {p: -1 for p in partitions if p not in busy}
        self._claimed_at = started
        done = {p: int(v) for p, v in answers.items() if p not in busy}
        kept = [
            i for i in chosen
            if records[i].partition not in busy
            and records[i].offset >= done[records[i].partition]
        ]
        self.skipped += sum(1 for i in chosen if records[i].partition not in busy) - len(kept)
        self.given_back += len(busy)
        return Claimed(kept, busy)

    def fence(self) -> bool:
        """Whether this member still holds the claims of its batch, checked before the
        batch's first write: free while the claims are younger than a third of their TTL
        (they cannot have expired), else one script renewing them if still this member's.
        False: another member took a claim after it expired; drop the batch (:meth:`abandon`).
        """
        if not self._held:
            return True
        now = self._clock()
        if now - self._claimed_at < self.claim_ttl_s / 3:
            return True
        expiry = int(now * 1000) + int(self.claim_ttl_s * 1000)
        with _errors("claim renewal"):
            held = self.client.eval(
                _RENEW, 1, self.claims_key, self.member, expiry, *sorted(self._held)
            )
        if held:
            self._claimed_at = now
            return True
        self.fenced += 1
        log.warning(
            "group %s: the claim of partitions %s expired and another member took it; "
            "this batch is dropped (%.1f s after claiming)",
            self.progress_key, sorted(self._held), now - self._claimed_at,
        )
        return False

    def finish(self, records: Sequence[ConsumedEvent]) -> list[int]:
        """Raise the group's offset of each claimed partition past ``records`` and release
        its claim; returns the partitions refused (another member claimed them meanwhile)."""
        nexts = dict(self._held)
        for r in records:
            if r.partition in nexts:
                nexts[r.partition] = max(nexts[r.partition], r.offset + 1)
        if not nexts:
            return []
        args = [x for p, o in sorted(nexts.items()) for x in (p, o)]
        with _errors("progress write"):
            answer = self.client.eval(
                _FINISH, 2, self.progress_key, self.claims_key, self.member, *args
            )
        self._held = {}
        refused = sorted(int(_text(p)) for p in answer)
        if refused:
            self.fenced_late += len(refused)
            log.error(
                "group %s: partitions %s were claimed by another member while this one "
                "wrote its batch (it stalled past the claim's TTL): trained twice",
                self.progress_key, refused,
            )
        return refused

    def abandon(self) -> None:
        """Release this member's claims without raising the progress (a dropped batch)."""
        held, self._held = self._held, {}
        if held:
            args = [x for p in sorted(held) for x in (p, -1)]
            with _errors("claim release"):
                self.client.eval(
                    _FINISH, 2, self.progress_key, self.claims_key, self.member, *args
                )

    # --- the exporter lease ---------------------------------------------------------

    def leads(self) -> bool:
        """Whether this member is the group's exporter: takes the lease if free, renews it
        if held (one Redis call every third of the TTL, none in between)."""
        now = self._clock()
        if now - self._lease_checked < self.lease_ttl_s / 3:
            return self.exporter and now < self._lease_until
        with _errors("exporter lease"):
            held = self.client.eval(
                _LEASE, 1, self.lease_key, self.member, int(self.lease_ttl_s * 1000)
            )
        self._lease_checked = now
        self.exporter = bool(held)
        self._lease_until = now + self.lease_ttl_s if held else 0.0
        return self.exporter

    def release(self) -> None:
        """Give the lease up (a graceful stop: another member exports at its next ask)."""
        self.exporter = False
        try:
            self.client.eval(_RELEASE, 1, self.lease_key, self.member)
        except REDIS_FAILURES as exc:
            log.warning("exporter lease not released (it expires by itself): %s", exc)

    # --- dense averaging --------------------------------------------------------

    def due(self) -> bool:
        if not self.averaging:
            return False
        if self.gloo is not None:
            return self.gloo.due()
        return self._clock() - self._last_sync >= self.every_s

    def average(self, model: nn.Module, samples: int) -> int:
        """Publish ``model``'s parameters and replace them by the group's mean.

        Returns the number of live peers averaged with (0: alone, nothing
        changed). Stale peers' fields are deleted.
        """
        if self.gloo is not None:
            joined = self.gloo.step(model)
            self.syncs, self.last_peers = self.gloo.rounds, joined
            return joined
        self._last_sync = now = self._clock()
        tensors = dense_tensors(model)
        with torch.no_grad():
            mine = torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors]).numpy()
        blob = _HEADER.pack(int(now * 1000), samples, mine.size) + mine.astype("<f4").tobytes()
        with _errors("dense publish"):
            self.client.hset(self.dense_key, self.member, blob)
            entries: dict[bytes | str, bytes] = self.client.hgetall(self.dense_key)
        peers, stale = [], []
        for name, value in entries.items():
            name = name.decode() if isinstance(name, bytes) else name
            if name == self.member:
                continue
            published_ms, _, count = _HEADER.unpack_from(value)
            if now - published_ms / 1000.0 > self.stale_s:
                stale.append(name)
            elif count != mine.size or len(value) != _HEADER.size + 4 * count:
                log.warning("dense sync: peer %s has another network shape; ignored", name)
            else:
                peers.append(np.frombuffer(value, dtype="<f4", offset=_HEADER.size))
        if stale:
            with _errors("dense prune"):
                self.client.hdel(self.dense_key, *stale)
        self.syncs += 1
        self.last_peers = len(peers)
        if not peers:
            return 0
        mean = (mine.astype(np.float64) + np.sum(peers, axis=0, dtype=np.float64)) / (
            1 + len(peers)
        )
        _load_flat(tensors, torch.from_numpy(mean.astype(np.float32)))
        return len(peers)

    def leave(self) -> None:
        """Remove this member's parameters, lease and claims (a graceful stop; a dead one's
        go stale and expire)."""
        if self.exporter:
            self.release()
        try:
            self.abandon()
        except StoreUnavailable as exc:
            log.warning("group claims not released (they expire by themselves): %s", exc)
        if self.gloo is not None:
            self.gloo.leave()
        try:
            self.client.hdel(self.dense_key, self.member)
        except REDIS_FAILURES as exc:
            log.warning("dense sync: could not leave the group: %s", exc)

    def status(self) -> dict[str, Any]:
        return {
            "member": self.member,
            "exporter": self.exporter,
            "dense_sync": ("redis" if self.gloo is None else "gloo") if self.averaging else None,
            "dense_syncs": self.syncs,
            "dense_peers": self.last_peers,
            "skipped_as_trained_by_peer": self.skipped,
            "given_back_busy": self.given_back,
            "fenced": self.fenced,
            "fenced_late": self.fenced_late,
        }


def _load_flat(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
            offset += n


def _errors(operation: str) -> AbstractContextManager[None]:
    """Redis failures as :class:`StoreUnavailable` (the loop retries those)."""
    return redis_errors(StoreUnavailable, f"trainer group sync {operation}")


def open_group_sync(resources: Resources) -> GroupSync | None:
    """The group's progress, exporter lease and (``trainer.group_sync``) dense averaging, for
    a trainer with Redis sparse tables; None with in-process tables.

    In-process tables are one trainer's alone, and a crash rolls them back to
    the checkpoint: a shared progress would then skip events the restored
    state never saw. So ``trainer.group_sync`` needs the Redis tables.
    """
    cfg = resources.settings.trainer
    redis_tables = resources.settings.sparse.backend == "redis"
    if cfg.group_sync and (not redis_tables or resources.redis_client is None):
        raise ConfigurationError(
            "trainer.group_sync: several trainers need the Redis sparse tables (sparse.backend)"
        )
    if not redis_tables or resources.redis_client is None:
        return None
    address = None
    if cfg.group_sync and cfg.dense_sync == "gloo":
        address = cfg.dense_sync_address or socket.gethostbyname(socket.gethostname())
    return GroupSync(
        resources.redis_client,
        cfg.group_id,
        every_s=cfg.dense_sync_every_s,
        gloo_address=address,
        averaging=cfg.group_sync,
        lease_ttl_s=cfg.heartbeat_ttl_s,
        claim_ttl_s=cfg.heartbeat_ttl_s,
    )


class GlooAveraging:
    """Periodic averaging by a gloo all-reduce (``trainer.dense_sync = "gloo"``).

    The alternative to the Redis exchange above, for those who want the
    average computed by ``torch.distributed``; Redis still does what a
    collective cannot: membership. Rounds are wall-clock aligned (round ``r``
    = ``time // every_s``). At a new round the loop snapshots the parameters
    and a background thread runs the round, so training never waits on the
    others:

    1. every member keeps a registration (its rendezvous address, its last
       round's time) in ``TRAINER_DENSE{group}:gloo``; the members of round
       ``r`` are those registered within three periods, fixed by whoever
       writes ``...:round:<r>`` first (``SET NX``), so all agree;
    2. the first of them hosts the round's ``TCPStore`` (each member runs
       one, on ``address`` and a free port); all form a ``ProcessGroupGloo``
       under the round's prefix and all-reduce the flattened snapshot with a
       timeout of one period;
    3. at its next round the loop applies the result as ``current + (mean -
       snapshot)``, keeping what it learned while the round ran.

    Staleness: the average is of snapshots one period old when applied.
    A member that dies makes the rounds that still count it fail (at once
    when its connections close, else at the timeout) until its registration
    is three periods old; the others just train on without averaging
    meanwhile. Nothing ever blocks the training loop.
    """

    def __init__(
        self,
        client: Any,
        group_id: str,
        member: str,
        address: str,
        every_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from torch.distributed import TCPStore

        self.client = client
        self.group_id = group_id
        self.member = member
        self.every_s = every_s
        self.members_key = f"{TRAINER_DENSE}{group_id}:gloo"
        self.round_prefix = f"{TRAINER_DENSE}{group_id}:round:"
        self._clock = clock
        self._timeout = timedelta(seconds=max(1.0, every_s))
        self._store = TCPStore(
            address, 0, is_master=True, wait_for_workers=False, timeout=self._timeout
        )
        self.address = f"{address}:{self._store.port}"
        self._round = int(clock() // every_s)
        self._thread: threading.Thread | None = None
        self._result: tuple[np.ndarray, np.ndarray, int] | None = None
        self.rounds = 0
        """Rounds whose average was applied."""
        self.failures = 0
        """Rounds that failed (a member gone, a timeout); training went on."""

    def due(self) -> bool:
        return int(self._clock() // self.every_s) != self._round

    def step(self, model: nn.Module) -> int:
        """Apply the finished round, if any, and start this one; peers of the applied one."""
        peers = 0
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            if self._result is not None:
                snapshot, mean, peers = self._result
                self._result = None
                tensors = dense_tensors(model)
                current = _flat(tensors)
                _load_flat(tensors, torch.from_numpy(current + (mean - snapshot)))
                self.rounds += 1
        self._round = int(self._clock() // self.every_s)
        if self._thread is None:
            snapshot = _flat(dense_tensors(model))
            self._thread = threading.Thread(
                target=self._run, args=(self._round, snapshot), daemon=True, name="vidrec-gloo"
            )
            self._thread.start()
        return peers

    def _run(self, round_no: int, snapshot: np.ndarray) -> None:
        try:
            self._result = self._all_reduce(round_no, snapshot)
        except Exception as exc:  # noqa: BLE001 - a failed round is skipped, never fatal
            self.failures += 1
            log.warning("dense sync (gloo) round %d failed: %s", round_no, exc)

    def _all_reduce(
        self, round_no: int, snapshot: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

        now = self._clock()
        entry = json.dumps({"address": self.address, "at": now})
        self.client.hset(self.members_key, self.member, entry)
        live = {}
        for name, raw in self.client.hgetall(self.members_key).items():
            info = json.loads(raw)
            if now - float(info["at"]) <= STALE_PERIODS * self.every_s:
                live[name.decode() if isinstance(name, bytes) else name] = info["address"]
        key = f"{self.round_prefix}{round_no}"
        ttl_ms = int(10 * self.every_s * 1000)
        self.client.set(key, json.dumps(sorted(live)), nx=True, px=ttl_ms)
        members = json.loads(self.client.get(key))
        if self.member not in members or len(members) == 1:
            return snapshot, snapshot, 0
        rank = members.index(self.member)
        if rank == 0:
            store = self._store
            self._prune(round_no)
        else:
            host, port = live[members[0]].rsplit(":", 1)
            store = TCPStore(host, int(port), is_master=False, timeout=self._timeout)
        group = ProcessGroupGloo(
            PrefixStore(f"{self.group_id}/{round_no}", store), rank, len(members), self._timeout
        )
        total = torch.from_numpy(snapshot.copy())
        group.allreduce([total]).wait()  # type: ignore[attr-defined]
        return snapshot, total.numpy() / len(members), len(members) - 1

    def _prune(self, round_no: int) -> None:
        """Drop the rendezvous keys of rounds before the previous one from this store."""
        head = f"{self.group_id}/"
        for key in self._store.list_keys():
            parts = key.lstrip("/")[len(head) :].split("/", 1)
            if key.lstrip("/").startswith(head) and parts[0].isdigit():
                if int(parts[0]) < round_no - 1:
                    self._store.delete_key(key)

    def leave(self) -> None:
        try:
            self.client.hdel(self.members_key, self.member)
        except REDIS_FAILURES as exc:
            log.warning("dense sync (gloo): could not leave the group: %s", exc)


def _flat(tensors: list[torch.Tensor]) -> np.ndarray:
    with torch.no_grad():
        return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors]).numpy().copy()


LEASE_WARNINGS = LogSummary(log, every_s=30.0)
"""While Redis is down, :func:`exports` says so once, then a count every 30 s (it is
asked every second)."""


def exports(group: GroupSync | None) -> bool:
    """Whether a trainer in ``group`` (None: alone) is the one that exports and refits the
    sequence tower: alone it always is; in a group, the holder of the exporter lease
    (none while Redis is down: nobody exports meanwhile; said through
    :data:`LEASE_WARNINGS`)."""
    if group is None:
        return True
    try:
        return group.leads()
    except BackendUnavailable as exc:
        LEASE_WARNINGS.record("exporter lease unavailable", exc)
        return False
