"""Ranking heads: per-head labels, the watch target, and each head learning its own signal.

Two generated feeds. In the *planted* one, whether a shown video is skipped
depends on its category, whether it is finished on its tag, and how much of
a play is watched on its creator: each head's prequential figure must find
its own signal. In the *chance* one nothing decides any outcome, and every
head's prequential figure must stay at chance (AUC 0.5, rank correlation 0),
which also checks that no head reads its label from a feature taken after
the video was shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from feature_store.catalog.base import Video
from feature_store.events import Event, EventContext
from feature_store.runtime.resources import open_resources
from feature_store.settings import FeatureSettings, Settings, TrainerSettings
from tests.factories import BASE_TS, make_event
from trainer.labels import Joiner, LabelPolicy, Moments, Sample
from trainer.offline import OnlineReplay
from trainer.watch import BINS, WatchQuantiles

BATCH = 128
DURATION_MS = 60_000

Outcome = Callable[[np.random.Generator, int], tuple[bool, bool, float | None]]
"""(rng, video index) -> (skipped, finished, watch ratio of a play or None)."""


def policy() -> LabelPolicy:
    return LabelPolicy(
        TrainerSettings(), FeatureSettings(positive_watch_ratio=0.5, short_watch_ratio=0.1)
    )


def _observe(joiner: Joiner, events: list[Event]) -> list[Sample]:
    def moments(positions: list[int]) -> Moments:
        values = np.zeros((len(positions), 1), dtype=np.uint64)
        return Moments(values, np.full(len(positions), np.nan))

    return joiner.observe(events, [0] * len(events), {}, moments)


@pytest.mark.parametrize(
    ("kind", "watch_ms", "engagement", "watch", "negative"),
    [
        ("finish", 60_000, 1.0, None, 0.0),
        ("like", 0, 1.0, None, 0.0),
        ("skip", 0, 0.0, None, 1.0),
        ("dislike", 0, 0.0, None, 1.0),
        ("play", 45_000, 1.0, "q", 0.0),
        ("play", 20_000, None, "q", 0.0),  # ambiguous for engagement: a watch sample only
        ("play", 3_000, 0.0, "q", 0.0),
    ],
)
def test_one_event_gives_a_label_per_head_with_a_mask(
    kind: str, watch_ms: int, engagement: float | None, watch: str | None, negative: float
) -> None:
    event = make_event(type=kind, watch_ms=watch_ms, duration_ms=DURATION_MS)
    (sample,) = _observe(Joiner(policy(), 60_000, 100), [event])
    assert (sample.label if engagement is not None else None) == engagement or (
        engagement is None and math.isnan(sample.label)
    )
    assert sample.head("negative") == negative
    if watch is None:
        assert math.isnan(sample.head("watch"))
    else:  # a fresh estimate: the uniform prior ranks a ratio about where it is
        assert abs(sample.head("watch") - watch_ms / DURATION_MS) <= 1.0 / BINS


def test_timed_out_impression_is_engagement_and_negative_zero_without_watch() -> None:
    joiner = Joiner(policy(), 1_000, 100)
    shown = make_event(type="impression", ts=BASE_TS)
    later = make_event(type="impression", ts=BASE_TS + 10_000, user_id="other")
    samples = _observe(joiner, [shown, later])
    (negative,) = [s for s in samples if s.event.event_id == shown.event_id]
    assert (negative.label, negative.head("negative")) == (0.0, 0.0)
    assert math.isnan(negative.head("watch"))


def test_watch_target_ranks_within_the_duration_bucket() -> None:
    """Half of a long film is a long watch; half of a short clip is a short one."""
    quantiles = WatchQuantiles((30, 600), memory=1_000_000)
    rng = np.random.default_rng(0)
    for _ in range(2000):  # clips are mostly watched whole, films mostly a little
        quantiles.target(float(rng.uniform(0.7, 1.0)), 15_000)
        quantiles.target(float(rng.uniform(0.0, 0.3)), 3_600_000)
    clip, film = quantiles.target(0.5, 15_000), quantiles.target(0.5, 3_600_000)
    assert clip < 0.05 and film > 0.95


def test_watch_estimate_is_bounded_restored_and_ignores_other_buckets() -> None:
    quantiles = WatchQuantiles((30,), memory=200)
    for _ in range(1000):
        quantiles.target(1.0, 10_000)
    assert quantiles.counts[0].sum() < 200  # halved as it fills: bounded, follows drift
    restored = WatchQuantiles((30,), memory=200)
    restored.load_state(quantiles.state())
    assert restored.target(0.5, 10_000) == quantiles.target(0.5, 10_000)
    other = WatchQuantiles((60,), memory=200)
    other.load_state(quantiles.state())  # other buckets rank against other videos
    assert other.target(0.5, 10_000) == pytest.approx(0.51)


def test_a_retried_batch_counts_its_plays_once() -> None:
    """``observe`` is retried when reading the moments fails: the estimate must not move."""
    joiner = Joiner(policy(), 60_000, 100)
    play = make_event(type="play", watch_ms=30_000, duration_ms=DURATION_MS)
    before = joiner.policy.watch.counts.copy()

    def failing(positions: list[int]) -> Moments:
        raise ConnectionError("store down")

    with pytest.raises(ConnectionError):
        joiner.observe([play], [0], {}, failing)
    np.testing.assert_array_equal(joiner.policy.watch.counts, before)
    _observe(joiner, [play])
    assert joiner.policy.watch.counts.sum() == before.sum() + 1


# --- feeds -----------------------------------------------------------------


def feed(outcome: Outcome, users: int = 700, videos: int = 120, seed: int = 0) -> tuple[
    list[Event], list[Video]
]:
    """Sessions of impressions 2-6 s apart; each is skipped, finished, played or left."""
    rng = np.random.default_rng(seed)
    catalog = [
        Video(video_id=f"v{i}", creator_id=f"c{i % 10}", category=f"k{i % 6}",
              tags=(f"t{i % 5}",), duration_ms=DURATION_MS,
              uploaded_at=BASE_TS - 86_400_000 * 30)
        for i in range(videos)
    ]
    events: list[Event] = []
    for u in range(users):
        ts = BASE_TS + int(rng.integers(0, 1_800_000))
        for s in range(2):
            ts += int(rng.integers(600_000, 1_800_000))
            for position, v in enumerate(rng.choice(videos, size=8, replace=False).tolist()):
                ts += int(rng.integers(2_000, 6_000))
                key = f"{u}-{s}-{position}"
                context = EventContext(device="phone", surface="home", position=position)
                events.append(Event(event_id=f"i{key}", user_id=f"u{u}", video_id=f"v{v}",
                                    type="impression", ts=ts, context=context))
                skipped, finished, ratio = outcome(rng, v)
                later = ts + int(rng.integers(2_000, 10_000))
                if skipped:
                    events.append(Event(event_id=f"s{key}", user_id=f"u{u}", video_id=f"v{v}",
                                        type="skip", ts=later))
                elif finished:
                    events.append(Event(event_id=f"f{key}", user_id=f"u{u}", video_id=f"v{v}",
                                        type="finish", ts=later, watch_ms=DURATION_MS,
                                        duration_ms=DURATION_MS))
                elif ratio is not None:
                    events.append(Event(event_id=f"p{key}", user_id=f"u{u}", video_id=f"v{v}",
                                        type="play", ts=later, watch_ms=int(ratio * DURATION_MS),
                                        duration_ms=DURATION_MS))
    events.sort(key=lambda e: e.ts)
    return events, catalog


def planted(rng: np.random.Generator, v: int) -> tuple[bool, bool, float | None]:
    """Skips follow the category (k0, k1), finishes the tag (t0, t1), watch the creator."""
    if rng.random() < (0.5 if v % 6 < 2 else 0.05):
        return True, False, None
    if rng.random() < (0.5 if v % 5 < 2 else 0.05):
        return False, True, None
    if rng.random() < 0.5:
        centre = 0.15 + 0.07 * (v % 10)  # creator c0 to c9: 0.15 to 0.78
        return False, False, float(np.clip(rng.normal(centre, 0.05), 0.0, 0.95))
    return False, False, None


def chance(rng: np.random.Generator, v: int) -> tuple[bool, bool, float | None]:
    draw = rng.random()
    if draw < 0.2:
        return True, False, None
    if draw < 0.45:
        return False, True, None
    if draw < 0.75:
        return False, False, float(rng.uniform(0.0, 0.95))
    return False, False, None


def _replay(events: list[Event], catalog: list[Video], tmp: Path) -> dict[str, float]:
    settings = Settings(
        data_dir=tmp,
        trainer={"batch_size": BATCH, "export_every_s": 0, "checkpoint_every_s": 1e9,
                 "dedupe_window": 0, "metrics_window": 200_000},
    )
    with open_resources(settings) as res:
        res.catalog.upsert(catalog)
        replay = OnlineReplay(res)
        res.event_log.produce(events)
        replay.drain()
        figures = replay.loop.metrics.window()
        replay.close()
    return figures


def test_each_head_learns_its_planted_signal(tmp_path: Path) -> None:
    events, catalog = feed(planted)
    figures = _replay(events, catalog, tmp_path)
    assert figures["negative_auc"] > 0.7, figures  # skips, from the category
    assert figures["auc"] > 0.7, figures  # finishes, from the tag
    assert figures["watch_spearman"] > 0.3, figures  # watch quantile, from the creator
    assert figures["watch_samples"] > 1000


def test_a_chance_feed_keeps_every_head_at_chance(tmp_path: Path) -> None:
    events, catalog = feed(chance, seed=1)
    figures = _replay(events, catalog, tmp_path)
    assert abs(figures["auc"] - 0.5) <= 0.03, figures
    assert abs(figures["negative_auc"] - 0.5) <= 0.03, figures
    assert abs(figures["watch_spearman"]) <= 0.05, figures


def test_a_single_output_checkpoint_grows_heads_and_keeps_its_engagement() -> None:
    """A checkpoint from before heads restores: its output is the engagement head."""
    import torch

    from feature_store.features.schema import default_schema
    from trainer.export import example_inputs
    from trainer.model import WideDeep, upgrade_state_dict

    schema = default_schema()
    torch.manual_seed(0)
    old = WideDeep(schema)
    state = old.state_dict()
    last = len(old.mlp) - 1
    state[f"mlp.{last}.weight"] = state[f"mlp.{last}.weight"][:1].clone()
    state[f"mlp.{last}.bias"] = state[f"mlp.{last}.bias"][:1].clone()
    new = WideDeep(schema)
    assert upgrade_state_dict(new, state)
    new.load_state_dict(state)
    inputs = example_inputs(schema, 16, np.random.default_rng(1))
    with torch.no_grad():
        torch.testing.assert_close(new(*inputs), old(*inputs))
    assert not upgrade_state_dict(new, new.state_dict())  # already has heads: unchanged


def test_the_engagement_head_starts_where_the_single_output_model_did() -> None:
    """Same seed, same engagement start, same RNG stream after the model (what a
    comparison before/after heads needs to compare only the heads)."""
    import torch
    from torch import nn

    from feature_store.features.schema import default_schema
    from trainer.model import WideDeep

    schema = default_schema()
    torch.manual_seed(7)
    model = WideDeep(schema, hidden=(32, 16))
    after_heads = torch.rand(4)
    torch.manual_seed(7)
    old = WideDeep(schema, hidden=(32, 16))  # rebuilt as before heads: one output
    torch.manual_seed(7)
    for layer in old.mlp[:-1]:
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()
    single = nn.Linear(16, 1)
    after_single = torch.rand(4)
    torch.testing.assert_close(model.mlp[-1].weight[:1], single.weight)
    torch.testing.assert_close(model.mlp[-1].bias[:1], single.bias)
    torch.testing.assert_close(after_heads, after_single)


def test_each_head_counts_its_samples_and_the_export_records_them(tmp_path: Path) -> None:
    """Finishes only: the watch head never trains, and the version says so."""
    from feature_store.models.registry import ModelRegistry

    events, catalog = feed(lambda rng, v: (False, bool(rng.random() < 0.3), None), users=60)
    settings = Settings(data_dir=tmp_path, trainer={"batch_size": BATCH, "export_every_s": 0,
                                                    "checkpoint_every_s": 1e9})
    with open_resources(settings) as res:
        res.catalog.upsert(catalog)
        replay = OnlineReplay(res)
        res.event_log.produce(events)
        replay.drain()
        counts = dict(replay.loop.metrics.head_samples)
        version = replay.export()
        replay.loop.checkpoint()
        replay.close()
        manifest = ModelRegistry(res.registry.root).manifest(version)
    assert counts["watch"] == 0 and counts["engagement"] > 0
    assert counts["negative"] == counts["engagement"]  # every engagement sample says "no skip"
    assert manifest.extra["head_samples"] == counts
    with open_resources(settings) as res:  # restored from the checkpoint
        again = OnlineReplay(res)
        assert again.loop.metrics.head_samples == counts
        again.close()


def test_a_rare_head_starts_at_its_prior_rate() -> None:
    """The negative head's bias starts at the log-odds of a few percent, not at 50%."""
    import torch

    from feature_store.features.schema import default_schema
    from feature_store.heads import HEAD_BY_NAME, HEAD_NAMES
    from trainer.model import WideDeep

    model = WideDeep(default_schema(), hidden=(32, 16))
    bias = model.mlp[-1].bias[HEAD_NAMES.index("negative")]
    rate = HEAD_BY_NAME["negative"].prior_rate
    assert torch.sigmoid(bias).item() == pytest.approx(rate, rel=1e-5)
