"""No sample learns from the future: a feed whose engagement is chance trains to AUC 0.5.

The feed: sessions of impressions a few seconds apart; each is finished a few
seconds later with a probability that depends on nothing; the rest time out
into negatives a minute later. If any feature were read after the moment the
video was shown (the impression itself recorded, the user's later watches),
it would separate the timed-out negatives from the positives; the brief's
check is that the prequential AUC stays at chance, and so does every single
feature.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from feature_store.catalog.base import Video
from feature_store.events import Event, EventContext
from feature_store.features import default_schema
from feature_store.models.quality import roc_auc
from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings
from tests.factories import BASE_TS
from trainer.offline import OnlineReplay, build_samples

FINISH_RATE = 0.3
BATCH = 128


def chance_feed(
    users: int = 2000, videos: int = 200, sessions: int = 3, per_session: int = 8, seed: int = 0
) -> tuple[list[Event], list[Video]]:
    """Sessions of impressions 2-6 s apart; a finish 3-20 s after one with probability 0.3.

    Videos are shown with Zipf popularity (so counters differ a lot between
    videos), each user has a few sessions 10-30 minutes apart (so histories
    grow), and the users overlap in time, about 12 events a second: a
    trainer batch spans less than the one-minute join window, as on a busy
    service, so a negative that timed out is trained after its impression and
    the user's next watches were recorded. Everything a model could use
    varies, but nothing says whether a shown video is finished.
    """
    rng = np.random.default_rng(seed)
    catalog = [
        Video(video_id=f"v{i}", creator_id=f"c{i % 40}", category=f"k{i % 7}",
              tags=(f"t{i % 11}",), duration_ms=30_000, uploaded_at=BASE_TS - 86_400_000 * 30)
        for i in range(videos)
    ]
    weights = 1.0 / np.arange(1, videos + 1) ** 0.9
    weights /= weights.sum()
    events: list[Event] = []
    for u in range(users):
        ts = BASE_TS + int(rng.integers(0, 3_600_000))
        for s in range(sessions):
            ts += int(rng.integers(600_000, 1_800_000))
            shown = rng.choice(videos, size=per_session, replace=False, p=weights)
            for position, v in enumerate(shown.tolist()):
                ts += int(rng.integers(2_000, 6_000))
                context = EventContext(device="phone", surface="home", position=position)
                events.append(Event(event_id=f"i{u}-{s}-{position}", user_id=f"u{u}",
                                    video_id=f"v{v}", type="impression", ts=ts, context=context))
                if rng.random() < FINISH_RATE:
                    events.append(Event(
                        event_id=f"f{u}-{s}-{position}", user_id=f"u{u}", video_id=f"v{v}",
                        type="finish", ts=ts + int(rng.integers(3_000, 20_000)),
                        watch_ms=30_000, duration_ms=30_000,
                    ))
    events.sort(key=lambda e: e.ts)
    return events, catalog


def _settings(tmp: Path) -> Settings:
    return Settings(
        data_dir=tmp,
        trainer={"batch_size": BATCH, "export_every_s": 0, "checkpoint_every_s": 1e9,
                 "dedupe_window": 0},
    )


@pytest.fixture(scope="module")
def feed() -> tuple[list[Event], list[Video]]:
    return chance_feed()


def test_prequential_auc_of_a_chance_feed_is_chance(feed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    events, catalog = feed
    with open_resources(_settings(tmp_path)) as res:
        res.catalog.upsert(catalog)
        replay = OnlineReplay(res)
        res.event_log.produce(events)
        scored = replay.drain()
        replay.close()
    # Every finish is a positive; every unfinished impression but the last
    # minute's (still pending at the end) timed out into a negative.
    assert scored.labels.sum() == sum(e.type == "finish" for e in events)
    pending = sum(e.type == "impression" for e in events) - len(scored.labels)
    assert 0 < pending < len(scored.labels) / 100
    auc = roc_auc(scored.scores, scored.labels)
    assert abs(auc - 0.5) <= 0.03, f"prequential AUC {auc:.4f} on a chance feed"


def test_the_impressions_pending_at_the_end_of_a_replay_resolve(  # type: ignore[no-untyped-def]
    feed, tmp_path: Path
) -> None:
    """As the online loop's idle batch does: an idle spell past the join window resolves
    what waited for a response, into negatives the replay trains and scores."""
    events, catalog = feed
    with open_resources(_settings(tmp_path)) as res:
        res.catalog.upsert(catalog)
        replay = OnlineReplay(res)
        res.event_log.produce(events)
        scored = replay.drain()
        joiner = replay.loop.stages.join.joiner
        assert len(joiner) > 0  # the last minute's impressions wait at the stream's time
        later = replay.drain(now_ms=events[-1].ts + res.settings.trainer.join_window_ms + 1)
        assert len(joiner) == 0
        samples_total = replay.loop.metrics.samples_total
        replay.close()
    assert len(later.labels) > 0 and later.labels.sum() == 0  # timed out: negatives
    assert not np.isnan(later.scores).any()
    assert len(scored.labels) + len(later.labels) == sum(e.type == "impression" for e in events)
    assert samples_total == len(scored.labels) + len(later.labels)


def test_no_feature_of_a_chance_feed_separates_the_labels(feed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The leak this replaces: recency alone gave AUC 1.0, history length 0.0."""
    events, catalog = feed
    schema = default_schema()
    with open_resources(_settings(tmp_path)) as res:
        res.catalog.upsert(catalog)
        samples, values = build_samples(res, events, BATCH)
    labels = np.array([s.label for s in samples])
    assert 0.2 < labels.mean() < 0.4
    dense = values.dense
    for j, col in enumerate(schema.dense):
        auc = roc_auc(dense[:, j].astype(np.float64), labels)
        assert abs(auc - 0.5) <= 0.03, f"{col.name} alone: AUC {auc:.4f}"
    _, history = values.multi("history")
    assert abs(roc_auc(history.astype(np.float64), labels) - 0.5) <= 0.03


def _feature_aucs(samples: list, values, schema) -> dict[str, float]:  # type: ignore[no-untyped-def]
    labels = np.array([s.label for s in samples])
    aucs = {
        col.name: roc_auc(values.dense[:, j].astype(np.float64), labels)
        for j, col in enumerate(schema.dense)
    }
    _, history = values.multi("history")
    aucs["history"] = roc_auc(history.astype(np.float64), labels)
    return aucs


def test_serving_state_running_ahead_of_the_trainer_does_not_leak(  # type: ignore[no-untyped-def]
    feed, tmp_path: Path
) -> None:
    """The signal feed writes serving's histories and counters as events arrive, ahead of
    the trainer (issue #22); the trainer reads its own copy, so its features stay at chance.
    Read from serving's copy instead, the same samples would learn from the future."""
    events, catalog = feed
    schema = default_schema()
    by_id = {v.video_id: v for v in catalog}
    with open_resources(_settings(tmp_path / "own")) as res:
        res.catalog.upsert(catalog)
        res.activity.record(events, by_id)  # serving's copy: the whole feed already
        samples, values = build_samples(res, events, BATCH)
        own = _feature_aucs(samples, values, schema)
    with open_resources(_settings(tmp_path / "shared")) as res:
        res.catalog.upsert(catalog)
        res.activity.record(events, by_id)
        shared = dataclasses.replace(res, training_activity=res.activity)
        samples, values = build_samples(shared, events, BATCH)
        leaked = _feature_aucs(samples, values, schema)
    print(f"own copy: {own}\nserving's copy: {leaked}")
    assert all(abs(auc - 0.5) <= 0.03 for auc in own.values()), own
    assert max(abs(auc - 0.5) for auc in leaked.values()) > 0.1, leaked
