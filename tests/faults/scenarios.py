"""The outage scenarios of issue #13, run by ``tests/faults`` (short) and the benchmark (long).

Each returns the client's record (:class:`~tests.faults.harness.Load`) with
the outage's times and what the trainer trained; :func:`redis_figures` and
:func:`broker_figures` reduce them to the numbers the tests assert and the
benchmark prints.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feature_store.constants import events_topic
from tests.faults.harness import GROUP, Load, Stack, quantile, running_stack, seed_catalog, stop
from tests.faults.harness import wait_until as wait


@dataclass
class Outage:
    """One dependency down from ``down_at`` to ``up_at`` (``time.monotonic()``): from when
    its process was gone to when it listened again."""

    down_at: float
    up_at: float
    starting_at: float | None = None
    """When its start was begun: requests sent between this and ``up_at`` may find it
    listening already, so only those sent before count as sent while it was down."""


@dataclass
class Run:
    loads: list[Load]
    outages: list[Outage]
    trained: Counter[str] = field(default_factory=Counter)
    """Event id -> times the trainer trained it (its audit)."""
    in_topic: Counter[str] = field(default_factory=Counter)
    """Event id -> copies of it in the events topic (producer retries may store two)."""
    trainer_exit: int | None = None


def _warm(stack: Stack, videos: list[str]) -> None:
    """Until the trainer has joined its group and trained a first batch."""
    warm = Load(stack.url, recommend_per_s=2, posts_per_s=5, batch=10, events_total=20,
                videos=videos).start()
    wait(lambda: warm.done, 60, "the warm-up events to be accepted")
    warm.stop()
    wait(lambda: stack.trainer_status().get("events_total", 0) >= 20, 180,
         "the trainer to train the warm-up events")


def _finish(stack: Stack, run: Run, timeout_s: float = 120) -> Run:
    """Wait (at most ``timeout_s``) until the trainer's audit holds every acknowledged
    event, stop it (its last checkpoint adds the rest of its audit), count; and read
    the topic, to tell a record the broker lost from one the trainer missed."""
    acked = {i for load in run.loads for i in load.acked}
    try:
        wait(lambda: acked <= set(stack.audited()), timeout_s, "the trainer to train every event")
    except AssertionError:
        pass  # counted below as lost
    assert stack.train is not None
    run.trainer_exit = stop(stack.train)
    stack.train = None
    run.trained = stack.audited()
    run.in_topic = topic_ids(stack)
    return run


def topic_ids(stack: Stack) -> Counter[str]:
    """Event id -> copies in the events topic (read from the start, no group)."""
    from kafka import KafkaConsumer, TopicPartition

    topic = events_topic(stack.env["VIDREC_EVENT_LOG__TOPIC_NAMESPACE"])
    reader = KafkaConsumer(bootstrap_servers=stack.broker.bootstrap, enable_auto_commit=False,
                           auto_offset_reset="earliest")
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(reader.partitions_for_topic(topic))]
        reader.assign(partitions)
        reader.seek_to_beginning(*partitions)
        ends = reader.end_offsets(partitions)  # may stop short of the last batch on Tansu
        found: Counter[str] = Counter()
        deadline = time.monotonic() + 60
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            batches = reader.poll(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    found[json.loads(record.value)["event_id"]] += 1
            if batches:
                idle_since = time.monotonic()
            caught_up = all(reader.position(tp) >= ends[tp] for tp in partitions)
            if caught_up and time.monotonic() - idle_since > 2.0:
                break
        return found
    finally:
        reader.close()


def redis_outage(tmp: Path, outage_s: float, before_s: float = 3, after_s: float = 4) -> Run:
    """Redis stopped for ``outage_s`` under 20 recommend/s and 5 event posts/s, then back."""
    with running_stack(tmp) as stack:
        videos = seed_catalog(stack.url)
        _warm(stack, videos)
        load = Load(stack.url, videos=videos).start()
        time.sleep(before_s)
        stack.redis.stop()  # SIGTERM; returns once the process is gone
        down_at = time.monotonic()
        time.sleep(outage_s)
        starting_at = time.monotonic()
        stack.redis.start()  # same port and directory: it reloads its AOF
        up_at = time.monotonic()
        time.sleep(after_s)
        load.stop()
        return _finish(stack, Run([load], [Outage(down_at, up_at, starting_at)]))


def broker_restarts(
    tmp: Path, runs: int, events: int, outage_s: float, batch: int = 50, posts_per_s: float = 5
) -> Run:
    """``runs`` times: post ``events`` events; a third of the way SIGKILL the broker,
    restart it ``outage_s`` later on its storage; recommendations keep going."""
    with running_stack(tmp) as stack:
        videos = seed_catalog(stack.url)
        _warm(stack, videos)
        run = Run([], [])
        for _ in range(runs):
            load = Load(stack.url, recommend_per_s=5, posts_per_s=posts_per_s, batch=batch,
                        events_total=events, videos=videos).start()
            run.loads.append(load)
            wait(lambda load=load: len(load.acked) >= events // 3, 120, "a third of the events")
            stack.broker.kill()
            down_at = time.monotonic()
            time.sleep(outage_s)
            stack.broker.start()
            run.outages.append(Outage(down_at, time.monotonic()))
            wait(lambda load=load: load.done, 300, "every event of the run to be accepted")
            load.stop()
        return _finish(stack, run)


def _answers(run: Run, kind: str) -> list[Any]:
    return [a for load in run.loads for a in getattr(load, kind)]


def common_figures(run: Run) -> dict[str, Any]:
    """What every scenario must show: answers, latencies, health, and the trainer's count."""
    recommends, posts, health = (_answers(run, k) for k in ("recommends", "posts", "health"))
    acked = [i for load in run.loads for i in load.acked]
    acked_set = set(acked)
    return {
        "recommends": len(recommends),
        "recommend_5xx": sum(a.status >= 500 or a.status == 0 for a in recommends),
        "recommend_over_1s": sum(a.seconds > 1.0 for a in recommends),
        "recommend_p99_ms": 1000 * quantile([a.seconds for a in recommends], 0.99),
        "recommend_max_ms": 1000 * max((a.seconds for a in recommends), default=0.0),
        "health_checks": len(health),
        "health_not_200": sum(a.status != 200 for a in health),
        "health_max_ms": 1000 * max((a.seconds for a in health), default=0.0),
        "posts": len(posts),
        "posts_200": sum(a.status == 200 for a in posts),
        "posts_503": sum(a.status == 503 for a in posts),
        "posts_other": sum(a.status not in (200, 503) for a in posts),
        "post_over_1s": sum(a.seconds > 1.0 for a in posts),
        "post_max_ms": 1000 * max((a.seconds for a in posts), default=0.0),
        "events_acked": len(acked),
        "acked_lost": len(acked_set - set(run.trained)),
        "acked_not_in_topic": len(acked_set - set(run.in_topic)),
        "stored_twice": sum(1 for c in run.in_topic.values() if c > 1),
        "trained_twice": sum(1 for c in run.trained.values() if c > 1),
        "trainer_exit": run.trainer_exit,
        "client_errors": [e for load in run.loads for e in load.errors],
    }


def redis_figures(run: Run) -> dict[str, Any]:
    out = common_figures(run)
    outage = run.outages[0]
    down_until = outage.up_at if outage.starting_at is None else outage.starting_at
    during = [a for a in _answers(run, "recommends") if outage.down_at < a.at < down_until]
    after = [a for a in _answers(run, "recommends") if a.at > outage.up_at]
    first_normal = next((a.at + a.seconds for a in after if not a.degraded), None)
    out.update(
        outage_s=round(outage.up_at - outage.down_at, 1),
        degraded_during=sum(a.degraded for a in during),
        answered_during=len(during),
        normal_after_s=None if first_normal is None else round(first_normal - outage.up_at, 3),
        degraded_after_1s=sum(a.degraded for a in after if a.at > outage.up_at + 1.0),
    )
    return out


def broker_figures(run: Run) -> dict[str, Any]:
    out = common_figures(run)
    out.update(
        restarts=len(run.outages),
        outage_s=[round(o.up_at - o.down_at, 1) for o in run.outages],
        per_run=[
            {"acked": len(load.acked), "lost": len(set(load.acked) - set(run.trained))}
            for load in run.loads
        ],
        group=GROUP,
    )
    return out


def embedded_kill(
    tmp: Path, batches: int = 20, per_batch: int = 10, hides: int = 20
) -> dict[str, Any]:
    """``vidrec up``: ``batches`` catalog upserts and ``hides`` hides, SIGKILL right after
    the last answer, restart; how many acknowledged writes and hides are there."""
    import signal

    import httpx

    from tests.faults.harness import KEY, start_embedded
    from tests.services import free_port

    data_dir, log = tmp / "data", tmp / "up.log"
    now = int(time.time() * 1000)
    written: list[str] = []
    hidden: list[str] = []
    process = start_embedded(data_dir, free_port(), log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{_port(process)}", timeout=30) as http:
            for b in range(batches):
                videos = [
                    {"video_id": f"kv{b}-{i}", "creator_id": f"kc{i}", "category": "news",
                     "tags": [], "duration_ms": 60_000, "uploaded_at": now - i}
                    for i in range(per_batch)
                ]
                if http.put("/v1/videos", json={"videos": videos}, headers=KEY).status_code == 200:
                    written += [str(v["video_id"]) for v in videos]
            for video_id in written[:hides]:
                if http.post(f"/v1/videos/{video_id}/hide", headers=KEY).status_code == 200:
                    hidden.append(video_id)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    finally:
        stop(process)
    port = free_port()
    process = start_embedded(data_dir, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            found = {v: http.get(f"/v1/videos/{v}", headers=KEY) for v in written}
    finally:
        stop(process)
    present = [v for v, r in found.items() if r.status_code == 200]
    still_hidden = [v for v in hidden if found[v].status_code == 200 and found[v].json()["hidden"]]
    return {
        "writes_acked": len(written), "writes_present": len(present),
        "hides_acked": len(hidden), "hides_present": len(still_hidden),
    }


def _port(process: Any) -> int:
    """The ``--port`` a ``vidrec`` subprocess was started with."""
    args = list(process.args)
    return int(args[args.index("--port") + 1])
