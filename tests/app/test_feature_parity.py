"""Training and serving compute the same features, from one declaration, for every source.

For random schemas over every declared source, random catalogs, counters,
histories and contexts:

- the request extractor (serving) and the trainer's extractor give the model
  the same inputs, and the same packed values per row;
- a response's values go through the served log (record, wire format,
  stream, the trainer's join) and come out as the values the model scored;
- every source reads only the catalog fields it declares, so the serving
  video rows' fingerprint (derived from the declarations) never goes stale.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.metrics import Metrics
from app.scoring.features import RequestFeatureExtractor
from app.served_log import Served, ServedLogWriter
from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.eventlog.memory import MemoryEventLog
from feature_store.eventlog.streams import stream_spec
from feature_store.events import Event, EventContext
from feature_store.features import (
    SOURCES,
    Attention,
    Categorical,
    Crossed,
    Dense,
    FeatureExtractor,
    FeatureRow,
    FeatureSchema,
    FeatureValues,
    MultiValued,
    layout_of,
)
from feature_store.features.dense import DenseInputs
from feature_store.features.sources import Scope
from feature_store.features.values import split_from_batch
from feature_store.recommendation_ids import RecommendationIds
from feature_store.served import decode_served, encode_served
from feature_store.settings import Settings
from tests.feature_checks import assert_same_features
from trainer.served import ServedJoin

TS = 1_763_700_000_000
REC = [RecommendationIds.for_key("parity").issue(logged=True) for _ in range(3)]
"""Ids of logged responses, as the service issues them."""
SEEDS = range(12)


def random_schema(rng: np.random.Generator) -> FeatureSchema:
    """Every declared source at least once over the seeds; shared tables and crosses."""
    columns: list[object] = []
    categorical = [n for n, s in SOURCES.items() if s.kind == "categorical"]
    chosen = ["user_id", "video_id", *rng.choice(categorical, size=6, replace=False).tolist()]
    names = []
    for source in dict.fromkeys(chosen):
        name = f"c_{source}"
        names.append(name)
        table = "video" if source == "video_id" else ""
        columns.append(Categorical(name, source, dim=int(rng.choice([2, 4])), table=table,
                                   wide=bool(rng.random() < 0.8)))
    columns.append(MultiValued("m_tags", "tags", dim=3, max_len=int(rng.integers(1, 6))))
    columns.append(MultiValued("m_title", "title_tokens", dim=2, max_len=int(rng.integers(1, 9))))
    columns.append(MultiValued("m_history", "history_videos", dim=2,
                               max_len=int(rng.integers(1, 9)), table="video"))
    if rng.random() < 0.7:  # the recent actions, attended by the candidate
        length = int(rng.integers(1, 9))
        sequence = [("s_video", "recent_videos", "video"), ("s_creator", "recent_creators", ""),
                    ("s_category", "recent_categories", ""), ("s_action", "recent_actions", "")]
        for name, source, table in sequence:
            columns.append(MultiValued(name, source, dim=2, max_len=length, table=table,
                                       pooling="attention"))
        columns.append(Attention("interest", keys=("s_video",), queries=("c_video_id",),
                                 extras=("s_creator", "s_category", "s_action"), width=4))
    for k in range(3):
        parts = rng.choice(names, size=int(rng.integers(2, 4)), replace=False).tolist()
        columns.append(Crossed(f"x{k}", tuple(parts)))
    dense = [n for n, s in SOURCES.items() if s.kind == "dense"]
    for source in rng.choice(dense, size=int(rng.integers(1, len(dense) + 1)), replace=False):
        columns.append(Dense(f"d_{source}", str(source)))
    # The video table holds the video ids and the history: one dim.
    fixed = [
        Categorical(c.name, c.source, 2, c.table, c.key_space, c.wide)
        if isinstance(c, Categorical) and c.table == "video" else c
        for c in columns
    ]
    return FeatureSchema(  # type: ignore[arg-type]
        columns=tuple(fixed), history_len=int(rng.integers(1, 15))
    )


def random_world(
    rng: np.random.Generator, n: int = 40
) -> tuple[list[Video], list[VideoStats], list[HistoryEntry], EventContext]:
    videos = [
        Video(
            video_id=f"v{i}",
            creator_id=f"c{rng.integers(0, 6)}",
            category=f"k{rng.integers(0, 4)}",
            tags=tuple(f"t{t}" for t in rng.choice(9, size=int(rng.integers(0, 6)),
                                                   replace=False)),
            duration_ms=int(rng.integers(1_000, 3_600_000)),
            uploaded_at=TS - int(rng.integers(0, 10**10)),
            title=" ".join(f"w{w}" for w in rng.choice(12, size=int(rng.integers(0, 6)))),
            description="Über Café w3" if rng.random() < 0.3 else "",
        )
        for i in range(n)
    ]
    stats = [
        VideoStats(**{k: int(rng.integers(0, 50)) for k in
                      ("impressions", "plays", "finishes", "likes", "shares", "skips",
                       "dislikes")},
                   last_ts=int(TS - rng.integers(0, 10**9)) if rng.random() < 0.8 else 0)
        for _ in range(n)
    ]
    actions = ["play", "finish", "like", "share", "skip", "short", "dislike"]
    history = [
        HistoryEntry(video_id=f"v{int(rng.integers(0, 2 * n))}", watch_ratio=1.0,
                     ts=TS - int(rng.integers(0, 10**8)), action=str(rng.choice(actions)),
                     creator_id=f"c{rng.integers(0, 7)}" if rng.random() < 0.9 else "",
                     category=f"k{rng.integers(0, 5)}" if rng.random() < 0.9 else "")
        for k in range(int(rng.integers(0, 20)))
    ]
    fields = {"device": "tv", "os": "ios", "country": "FR", "surface": "home",
              "age_group": "25-34", "gender": "f", "occupation": "chef"}
    context = EventContext(
        **{k: v for k, v in fields.items() if rng.random() < 0.6},
        position=int(rng.integers(0, 60)) if rng.random() < 0.5 else None,
    )
    return videos, stats, history, context


@pytest.mark.parametrize("seed", SEEDS)
def test_both_extractors_agree_on_random_schemas(seed: int) -> None:
    rng = np.random.default_rng(seed)
    schema = random_schema(rng)
    videos, stats, history, context = random_world(rng)
    model_history = tuple(history[: schema.history_len])  # what the trainer's moments hold
    rows = [FeatureRow("u1", v.video_id, TS, v, context, model_history, s)
            for v, s in zip(videos, stats, strict=True)]
    trainer = FeatureExtractor(schema)
    serving = RequestFeatureExtractor(schema)
    scored = serving.extract_request("u1", TS, context, history, videos, stats)
    assert_same_features(scored, trainer.extract(rows), schema)
    layout = layout_of(schema)
    per_row = FeatureValues.from_batch(layout, scored, np.arange(scored.batch_size))
    np.testing.assert_array_equal(per_row.packed, trainer.values(rows).packed)
    some = rng.permutation(scored.batch_size)[:7]  # what the served log packs, in parts
    request, items = split_from_batch(layout, scored, some)
    np.testing.assert_array_equal(request, per_row.packed[some[0], layout.request_slots])
    np.testing.assert_array_equal(items, per_row.packed[some][:, layout.item_slots])


def test_every_declared_source_is_in_some_random_schema() -> None:
    used = set()
    for seed in SEEDS:
        schema = random_schema(np.random.default_rng(seed))
        used |= {c.source for c in schema.columns if not isinstance(c, Crossed | Attention)}
    assert used == set(SOURCES)


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_the_served_log_carries_the_values_scored(seed: int) -> None:
    """Response -> record -> wire -> served stream -> trainer's join: the values scored
    (and, where the request named no position, the position each item was served at)."""
    rng = np.random.default_rng(seed)
    schema = random_schema(rng)
    videos, stats, history, context = random_world(rng)
    settings = Settings(served_log={"max_items": 15})
    serving = RequestFeatureExtractor(schema)
    scored = serving.extract_request("u1", TS, context, history, videos, stats)
    scores = rng.random(len(videos))
    order = np.argsort(-scores)
    writer = ServedLogWriter(None, settings.served_log, layout_of(schema), Metrics())  # type: ignore[arg-type]
    version = "main-20260101T000000-00000"  # the trainer's family: its score is the prediction
    served = Served(REC[0], "u1", TS, version, context, [v.video_id for v in videos],
                    ["covisit"] * len(videos), scores, order, scored)
    record = writer.to_record(served)
    wire = decode_served(encode_served(record), 128)  # the trainer reads what the wire holds
    assert wire.items == record.items

    with MemoryEventLog(settings, stream=stream_spec(settings, "served")) as log:
        log.produce([wire])
        join = ServedJoin(log, settings.served_log, FeatureExtractor(schema))
        shown = [  # the client shows the items and reports them with the request's context
            Event(event_id=f"i{k}", user_id="u1", video_id=videos[r].video_id,
                  type="impression", ts=TS + 1, recommendation_id=REC[0], context=context)
            for k, r in enumerate(order[:15].tolist())
        ]
        found, values, served_scores = join.moments(shown)
        join.close()
    assert found == list(range(15)) and join.counts["joined"] == 15
    shown_at = [
        context if context.position is not None else context.model_copy(update={"position": k})
        for k in range(15)
    ]
    want = FeatureExtractor(schema).values([
        FeatureRow("u1", videos[r].video_id, TS, videos[r], at,
                   tuple(history[: schema.history_len]), stats[r])
        for r, at in zip(order[:15].tolist(), shown_at, strict=True)
    ])
    np.testing.assert_array_equal(values, want.packed)
    np.testing.assert_allclose(served_scores, scores[order[:15]])


def test_a_joined_impression_adds_the_position_it_was_shown_at() -> None:
    """The service scores before it knows positions; the impression (or the record) knows."""
    rng = np.random.default_rng(0)
    schema = FeatureSchema(columns=(
        Categorical("user", "user_id", 2), Categorical("video", "video_id", 2),
        Categorical("position", "position_bucket", 2), Categorical("device", "device", 2),
    ))
    videos, stats, history, _ = random_world(rng, n=5)
    request = EventContext(device="tv")
    settings = Settings(served_log={"join_lookahead_ms": 0})
    serving = RequestFeatureExtractor(schema)
    scored = serving.extract_request("u1", TS, request, history, videos, stats)
    writer = ServedLogWriter(None, settings.served_log, layout_of(schema), Metrics())  # type: ignore[arg-type]
    record = writer.to_record(Served(REC[1], "u1", TS, "m1", request, [v.video_id for v in videos],
                                     ["fresh"] * 5, np.linspace(1, 0, 5), np.arange(5), scored))
    with MemoryEventLog(settings, stream=stream_spec(settings, "served")) as log:
        log.produce([record])
        join = ServedJoin(log, settings.served_log, FeatureExtractor(schema))
        events = [
            Event(event_id="a", user_id="u1", video_id="v3", type="impression", ts=TS,
                  recommendation_id=REC[1]),  # no context: the served position, 3
            Event(event_id="b", user_id="u1", video_id="v1", type="impression", ts=TS,
                  recommendation_id=REC[1], context=EventContext(position=12, device="phone")),
            Event(event_id="c", user_id="u2", video_id="v1", type="impression", ts=TS,
                  recommendation_id=REC[1]),  # another user's record: not trusted
            Event(event_id="d", user_id="u1", video_id="v1", type="impression", ts=TS,
                  recommendation_id=REC[2]),
        ]
        found, values, _ = join.moments(events)
        join.close()
    assert found == [0, 1] and (join.counts["unknown"], join.counts["missing"]) == (1, 1)
    extractor = FeatureExtractor(schema)
    want = extractor.values([
        FeatureRow("u1", "v3", TS, videos[3], EventContext(device="tv", position=3)),
        FeatureRow("u1", "v1", TS, videos[1], EventContext(device="phone", position=12)),
    ])
    np.testing.assert_array_equal(values[:, :4], want.categorical)


@pytest.mark.parametrize("name", sorted(n for n, s in SOURCES.items() if Scope.VIDEO in s.reads))
def test_sources_read_only_the_catalog_fields_they_declare(name: str) -> None:
    source = SOURCES[name]
    base = Video(video_id="v1", creator_id="c1", category="k1", tags=("a", "b"),
                 duration_ms=90_000, uploaded_at=TS - 3_600_000)
    changes = {"video_id": "v2", "creator_id": "c2", "category": "k2", "tags": ("z",),
               "duration_ms": 5_000, "uploaded_at": TS - 9, "hidden": True,
               "title": "Another one", "description": "and more"}
    for field, value in changes.items():
        if field in source.fields:
            continue
        other = base.model_copy(update={field: value})
        if source.kind == "dense":
            inputs = [
                DenseInputs(np.array([float(TS)]),
                            {f: np.array([float(getattr(v, f))]) for f in source.fields},
                            np.zeros((1, 8)), np.zeros(1))
                for v in (base, other)
            ]
            got = [source.compute(x) for x in inputs]
        else:
            got = [source.compute(FeatureRow("u", "v1", TS, v)) for v in (base, other)]
        assert np.array_equal(got[0], got[1]), f"{name} reads {field} without declaring it"
