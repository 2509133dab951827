"""Scale-out on one machine: two trainers, one consumer group, a 3-node Redis Cluster.

A 4-partition events topic (Tansu), two ``vidrec train`` processes in one
group with ``trainer.group_sync`` (shared progress, dense averaging), the
sparse tables and stores on a Redis Cluster, and the API (uvicorn in a
thread) reading the same cluster and the trainers' shared registry. Midway
one trainer is SIGKILLed; its partitions move to the other, which finishes
the stream, while the API keeps answering.

Counting: with Redis tables a push is durable at once, so an event counts as
trained when its ids reach a trainer's audit (written with each checkpoint)
or, for the killed trainer, its journal (batches pushed after its last
checkpoint). Each id must be trained by exactly one of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from redis.cluster import RedisCluster

with warnings.catch_warnings():
    # kafka-python's import warns from importlib's frame, past the pyproject filter.
    warnings.simplefilter("ignore", DeprecationWarning)
    import feature_store.eventlog.kafka  # noqa: F401

from app.main import create_app
from feature_store.constants import TRAINER_PROGRESS, TRAINER_SEQUENCE_VIEWS, TRAINER_STATUS
from feature_store.features.schema import default_schema
from feature_store.runtime.resources import open_resources, table_specs
from feature_store.settings import Settings
from feature_store.sim.world import SyntheticWorld
from feature_store.sparse import ClusterSparseTable, SparseTables, make_optimizer
from tests.app.conftest import serve_in_thread
from tests.services import TansuBroker
from tests.trainer.helpers import WORLD, produce, wait_for_count, wait_until

pytestmark = [
    pytest.mark.redis,
    pytest.mark.kafka,
    pytest.mark.slow,
    # Its waits are bounded by stalls, not deadlines; at load 8 on 2 cores a run takes
    # several times its unloaded minutes.
    pytest.mark.timeout(900),
]

GROUP = "scaleout"


def _env(cluster_url: str, broker: TansuBroker, namespace: str) -> dict[str, str]:
    """Settings every process shares: the cluster, the broker, the topic namespace."""
    return {
        "VIDREC_REDIS__URL": cluster_url,
        "VIDREC_REDIS__CLUSTER": "true",
        "VIDREC_SPARSE__BACKEND": "redis",
        "VIDREC_STORES__BACKEND": "redis",
        "VIDREC_EVENT_LOG__BACKEND": "kafka",
        "VIDREC_EVENT_LOG__TOPIC_NAMESPACE": namespace,
        "VIDREC_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
        "VIDREC_KAFKA__PARTITIONS": "4",
        "VIDREC_KAFKA__SESSION_TIMEOUT_MS": "2000",
        "VIDREC_KAFKA__HEARTBEAT_INTERVAL_MS": "200",
        "VIDREC_KAFKA__MAX_POLL_INTERVAL_MS": "20000",
        "VIDREC_KAFKA__REQUEST_TIMEOUT_MS": "5000",
        # Answers, not speed: on a loaded machine a scoring (Redis Cluster reads, two
        # trainers beside it) can outlast the 250 ms default and be answered degraded.
        "VIDREC_API__RECOMMEND_DEADLINE_MS": "30000",
    }


TRAINER_ENV = {
    "VIDREC_TRAINER__GROUP_ID": GROUP,
    "VIDREC_TRAINER__GROUP_SYNC": "true",
    "VIDREC_TRAINER__DENSE_SYNC_EVERY_S": "1",
    "VIDREC_TRAINER__AUDIT": "true",
    "VIDREC_TRAINER__BATCH_SIZE": "256",
    "VIDREC_TRAINER__MAX_WAIT_MS": "50",
    "VIDREC_TRAINER__CHECKPOINT_EVERY_S": "0.5",
    "VIDREC_TRAINER__METRICS_EVERY_S": "0.2",
    # Every 2 s made some 40 versions in a 150 s run at load 12, each an ONNX export and
    # a load by the API (about 0.8 s of CPU: docs/benchmarks.md, Evaluation at scale).
    # The API needs one model.
    "VIDREC_TRAINER__EXPORT_EVERY_S": "0",
    "VIDREC_TRAINER__EXPORT_EVERY_BATCHES": "10",
    "VIDREC_TRAINER__THREADS": "1",
}


def shared_views(client: Any) -> dict[str, Any]:
    """The live trainer's sequence-views counts, from its status heartbeat."""
    status = client.get(TRAINER_STATUS + GROUP)
    if not status:
        return {"read": -1, "published": 0}
    return dict(json.loads(status)["sequence"]["shared_views"])


class Trainer:
    """One ``vidrec train`` process with its own data directory (and the shared registry)."""

    def __init__(self, root: Path, registry: Path, env: dict[str, str]) -> None:
        self.data_dir = root
        root.mkdir()
        (root / "registry").symlink_to(registry, target_is_directory=True)
        self.env = {**os.environ, **env, "VIDREC_DATA_DIR": str(root)}
        self.log = root / "trainer.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def group_dir(self) -> Path:
        return self.data_dir / "trainer" / GROUP

    def start(self) -> None:
        with open(self.log, "ab") as stderr:  # the child has its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "--log-level", "WARNING", "train"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def latest_seq(self) -> int:
        try:
            return int(json.loads((self.group_dir / "LATEST").read_text())["seq"])
        except (FileNotFoundError, json.JSONDecodeError):
            return 0

    def audited(self) -> list[str]:
        """Ids of the checkpoints that became current (segments past LATEST never did)."""
        latest = self.latest_seq()
        return [
            i
            for p in sorted((self.group_dir / "audit").glob("*.ids"))
            if int(p.stem) <= latest
            for i in p.read_text().split()
        ]

    def journaled(self) -> list[str]:
        """Ids pushed since the last checkpoint (a torn last line was never finished)."""
        ids: list[str] = []
        try:
            lines = (self.group_dir / "journal.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return ids
        for line in lines:
            try:
                ids += json.loads(line)
            except json.JSONDecodeError:
                break
        return ids

    def trained(self) -> list[str]:
        """Everything this trainer pushed, each id once (the journal may overlap the last
        checkpoint's segment for the instant between the two writes)."""
        audited = self.audited()
        seen = set(audited)
        return audited + [i for i in self.journaled() if i not in seen]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class Hammer:
    """Asks the API for recommendations in a loop; records every status code."""

    def __init__(self, url: str, users: list[str]) -> None:
        self.url, self.users = url, users
        self.codes: Counter[int] = Counter()
        self.failures: list[str] = []
        self.empty: list[tuple[float, str]] = []
        """When an answer without items came, and its body (to tell why)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            n = 0
            while not self._stop.is_set():
                user = self.users[n % len(self.users)]
                n += 1
                try:
                    r = http.post("/v1/recommend", json={"user_id": user, "count": 10})
                    self.codes[r.status_code] += 1
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code} {r.text[:200]}")
                    elif not r.json()["items"]:
                        self.empty.append((time.monotonic(), f"{user}: {r.text[:400]}"))
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                time.sleep(0.1)  # steady, not flat out: the trainers share the 2 cores

    def __enter__(self) -> Hammer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def _scan_rows(cluster_url: str, settings: Settings) -> dict[str, int]:
    """Every sparse row on every primary, per table; each the right byte length."""
    specs = {spec.name: spec for spec in table_specs(default_schema(settings.features), settings)}
    state_width = {
        name: make_optimizer(spec.optimizer, settings.sparse).state_width(spec.dim)
        for name, spec in specs.items()
    }
    client = RedisCluster.from_url(cluster_url)
    counts: Counter[tuple[str, str]] = Counter()
    try:
        for node in client.get_primaries():
            conn = node.redis_connection
            assert conn is not None
            for name in conn.scan_iter(match=b"vidrec:v1:sp:*", count=2000):
                table = name.split(b"{", 1)[1].split(b"}", 1)[0].split(b":")[1].decode()
                kind = name.split(b"}:", 1)[1][:1].decode()
                counts[(table, kind)] += 1
                if kind == "c":
                    continue
                assert kind == "r", name  # one key per row: weights then state
                floats = specs[table].dim + state_width[table]
                assert conn.strlen(name) == 4 * floats, (name, conn.strlen(name))
    finally:
        client.close()
    return {table: counts[(table, "r")] for table in specs}


@pytest.mark.parametrize(
    ("dense_sync", "events_total"),
    # The kill, the takeover and the counting are the same for both exchanges; the gloo
    # run proves the all-reduce works across real processes and a kill (its rounds are
    # unit-tested in test_group_sync.py), so a shorter stream does. The redis run keeps
    # 30,000: with 20,000 the survivor's prequential AUC came to 0.704-0.743 against the
    # 0.68 asserted, too thin a margin (gloo's, 10,000: 0.744-0.771).
    [("redis", 30_000), ("gloo", 10_000)],
)
def test_two_trainers_share_a_group_and_survive_a_kill(
    dense_sync: str,
    events_total: int,
    tmp_path: Path,
    redis_cluster_url: str,
    kafka_broker: TansuBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    shared = _env(redis_cluster_url, kafka_broker, f"so{uuid.uuid4().hex[:10]}")
    for key, value in shared.items():
        monkeypatch.setenv(key, value)
    registry = tmp_path / "registry"
    registry.mkdir()
    world = SyntheticWorld(WORLD)
    events = world.events(events_total)
    settings = Settings(  # the test's own producer waits for the broker (helpers.produce)
        data_dir=tmp_path / "api",
        api={"model_poll_interval_s": 0.1},
        kafka={"produce_timeout_ms": 60_000},
    )
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "registry").symlink_to(registry, target_is_directory=True)
    third = events_total // 3
    with open_resources(settings) as resources:  # creates the topics; seeds the catalog
        resources.catalog.upsert(world.videos())
        produce(resources, events[:third])

        trainer_env = {
            **shared,
            **TRAINER_ENV,
            "VIDREC_TRAINER__DENSE_SYNC": dense_sync,
            "VIDREC_TRAINER__DENSE_SYNC_ADDRESS": "127.0.0.1",
        }
        one = Trainer(tmp_path / "one", registry, trainer_env)
        two = Trainer(tmp_path / "two", registry, trainer_env)
        try:
            one.start()
            two.start()
            wait_until(
                lambda: (
                    one.latest_seq() > 0
                    and two.latest_seq() > 0
                    and one.audited()
                    and two.audited()
                ),
                # Two processes importing torch, joining and checkpointing on 2 cores at
                # load 8: a bound, not an expectation.
                240,
                "both trainers to train and checkpoint",
            )
            # The last fifth is held back and trickled in at the kill (below): with the
            # whole stream produced, trainer one could have trained and checkpointed all of
            # its partitions before the kill, leaving nothing pushed and uncommitted.
            held_back = events_total - events_total // 5
            produce(resources, events[third:held_back])

            app = create_app(settings)
            with serve_in_thread(app) as url:
                with httpx.Client(base_url=url, timeout=10) as http:
                    wait_until(
                        lambda: http.get("/readyz").json()["degraded"] is False,
                        120,
                        "the API ready",
                    )
                users = sorted({e.user_id for e in events[:500]})
                with httpx.Client(base_url=url, timeout=10) as http:  # signal feed caught up
                    # A user without history gets trending videos only: the signal feed's
                    # (a known user may get items from the towers before the feed has any).
                    wait_until(
                        lambda: http.post(
                            "/v1/recommend", json={"user_id": "nobody-yet", "count": 10}
                        ).json()["items"],
                        120,
                        "candidates from the signal feed",
                    )
                with Hammer(url, users) as hammer:
                    wait_for_count(
                        lambda: len(one.trained()) + len(two.trained()),
                        events_total // 2,
                        60,
                        "half of the stream",
                    )
                    # Kill between checkpoints: batches pushed, not yet committed. Trickle
                    # the held-back events in until trainer one is caught in that state
                    # (each trickle gives its partitions new batches to push).
                    pending = events[held_back:]
                    trickled_at = 0.0

                    def caught_between_checkpoints() -> bool:
                        nonlocal pending, trickled_at
                        if one.journaled():
                            return True
                        if pending and time.monotonic() - trickled_at > 0.25:
                            produce(resources, pending[:25])
                            pending, trickled_at = pending[25:], time.monotonic()
                        return False

                    wait_until(caught_between_checkpoints, 120, "a journaled batch")
                    assert one.process is not None
                    one.process.send_signal(signal.SIGKILL)
                    one.process.wait(10)
                    killed_at = time.monotonic()
                    pushed_uncommitted = len(one.journaled())
                    by_one = one.trained()
                    produce(resources, pending)
                    # The survivor's pace is the machine's: fail on a stall, not a deadline
                    # (it takes the dead member's partitions after the 2 s session timeout).
                    wait_for_count(
                        lambda: len(set(by_one) | set(two.trained())),
                        events_total,
                        60,
                        "the survivor to finish the stream",
                    )
                    takeover_s = time.monotonic() - killed_at
                    time.sleep(0.5)  # a few more requests after the takeover
                # One sequence tower for the group: the survivor reads back every view of
                # the group's stream, the killed one's included (its refit thread reads
                # between refits: wait for it).
                client = resources.redis_client
                assert client is not None
                wait_until(
                    lambda: shared_views(client)["read"]
                    >= client.xlen(TRAINER_SEQUENCE_VIEWS + GROUP)
                    > shared_views(client)["published"],
                    120,
                    "the survivor to read the group's views back",
                )
                assert two.process is not None
                two.process.send_signal(signal.SIGTERM)
                assert two.process.wait(120) == 0, two.log.read_text()[-3000:]
        finally:
            one.stop()
            two.stop()

        status = resources.redis_client.get(TRAINER_STATUS + GROUP)  # type: ignore[union-attr]
        progress = resources.redis_client.hgetall(TRAINER_PROGRESS + GROUP)  # type: ignore[union-attr]

    # The API answered every request, before, during and after the takeover.
    assert hammer.codes[200] > 20 and not hammer.failures, (hammer.codes, hammer.failures[:5])
    assert not hammer.empty, f"{len(hammer.empty)} answers without items: {hammer.empty[:3]}"

    # Every event trained exactly once by the group: the killed trainer's pushes
    # (checkpointed or only journaled) and the survivor's, with no overlap.
    by_two = two.audited()
    assert len(by_one) == len(set(by_one)) and len(by_two) == len(set(by_two))
    counts = Counter(by_one + by_two)
    assert set(counts) == {e.event_id for e in events}, "an event was lost"
    assert max(counts.values()) == 1, [i for i, c in counts.items() if c > 1][:10]
    assert by_one and by_two, "both trainers trained"

    # The group's progress reached the end of every partition.
    assert {int(k) for k in progress} == {0, 1, 2, 3}
    assert sum(int(v) for v in progress.values()) == events_total

    # The survivor learned (prequential AUC, measured before each batch trains)
    # and averaged its dense network with the other while both lived.
    final = json.loads(status)
    metrics, group = final["metrics"], final["group"]
    print(
        f"killed one with {pushed_uncommitted} events pushed after its last checkpoint; "
        f"survivor skipped {group['skipped_as_trained_by_peer']} of them, took "
        f"{takeover_s:.1f} s to finish; auc {metrics['auc']:.3f} vs popularity "
        f"{metrics['baseline_auc']:.3f}; {hammer.codes[200]} recommendations served; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    assert group["dense_sync"] == dense_sync and group["dense_syncs"] > 0
    assert not final["sequence"]["shared_views"]["failures"], final["sequence"]
    # What the killed one pushed after its last commit came back to the survivor, skipped.
    assert group["skipped_as_trained_by_peer"] >= pushed_uncommitted > 0
    # Learnt beyond popularity. Not an absolute bound: the survivor's prequential AUC over
    # this short stream depends on when the kill lands (0.633-0.727 in five runs of the
    # gloo case on 2026-11-28, each 0.08-0.16 over its popularity baseline); 0.68 failed
    # one of them.
    assert metrics["auc"] > 0.6, metrics
    assert metrics["auc"] > metrics["baseline_auc"] + 0.06, metrics

    # No corrupt row: every key the right length, weights and state paired, all finite.
    rows = _scan_rows(redis_cluster_url, settings)
    assert rows["user"] > 0 and rows["video"] > 0
    with SparseTables.open(table_specs(default_schema(settings.features), settings), settings) as t:
        for name, table in t.items():
            assert isinstance(table, ClusterSparseTable)
            data = table.export()
            assert len(data.keys) == rows[name]
            assert np.isfinite(data.weights).all() and np.isfinite(data.state).all(), name
