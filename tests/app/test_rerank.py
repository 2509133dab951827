"""Rerank and cold start (issue #12): exclusions, demotion, diversity, priors, exploration.

The reranker is given the scores a model would have produced, so each test
says exactly what the model believed: in the issue's scenario, 0.92 for three
just-uploaded videos nobody has seen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from app.cold_start import DEFAULT_RATE, ColdStart, estimate
from app.rerank import Reranker
from app.scoring.video_table import VideoTable
from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.settings import RerankSettings
from feature_store.signals.feedback import FeedbackParams, MemoryFeedback, ServedBatch
from tests.factories import BASE_TS, make_event, make_video

NOW = BASE_TS + 2 * 24 * 3600 * 1000
"""The requests' clock: the generated videos were uploaded within the last two days."""
HOUR_MS = 3600 * 1000


def table_of(videos: Sequence[Video], stats: Sequence[VideoStats]) -> tuple[VideoTable, Any]:
    """A serving video table holding ``videos`` with their counters; and their rows."""
    table = VideoTable(
        coded=[], multi_lens={}, n_dense=0, describe=lambda v: ([], {}), derive=lambda n, s: s
    )
    rows = table.rows_of(videos)
    table.set_stats(rows, stats)
    return table, rows


def established(engaged: int = 60, shown: int = 200) -> VideoStats:
    return VideoStats(impressions=shown, plays=engaged, finishes=engaged // 2, last_ts=NOW)


def reranker(feedback: MemoryFeedback | None = None, seed: int = 0, **settings: Any) -> Reranker:
    s = RerankSettings(**settings)
    return Reranker(
        s, feedback or MemoryFeedback(FeedbackParams()), ColdStart(s, seed=seed)
    )


def run(
    rr: Reranker,
    videos: Sequence[Video],
    table: VideoTable,
    rows: Any,
    scores: Sequence[float],
    count: int,
    user: str = "u1",
    history: Sequence[HistoryEntry] = (),
    exclude_served: bool | None = None,
    now_ms: int = NOW,
) -> list[str]:
    """The response's video ids, best first."""
    out, order = rr.rerank(
        user, now_ms, history, exclude_served, [v.video_id for v in videos], table, rows,
        np.asarray(scores, dtype=np.float32), count,
    )
    return [videos[i].video_id for i in order.tolist()]


# --- the issue's scenario -------------------------------------------------------


def issue_scenario() -> tuple[list[Video], list[VideoStats], set[str]]:
    """40 established videos in two categories, and 3 just uploaded in a third."""
    videos, stats = [], []
    for i in range(40):
        videos.append(make_video(video_id=f"old{i}", category=("news", "sport")[i % 2],
                                 creator_id=f"c{i % 10}"))
        stats.append(established(engaged=40 + i))
    new = set()
    for i in range(3):
        videos.append(make_video(video_id=f"new{i}", category="cooking", creator_id="chef"))
        stats.append(VideoStats())
        new.add(f"new{i}")
    return videos, stats, new


def user_scores(videos: Sequence[Video], favourite: str, rng: np.random.Generator) -> list[float]:
    """What the model says: the user's category 0.5-0.8, the other 0.2-0.4, new ones 0.92."""
    out = []
    for v in videos:
        if v.video_id.startswith("new"):
            out.append(0.92)
        elif v.category == favourite:
            out.append(float(rng.uniform(0.5, 0.8)))
        else:
            out.append(float(rng.uniform(0.2, 0.4)))
    return out


def test_just_uploaded_videos_outside_the_budget_do_not_outrank_supported_ones() -> None:
    videos, stats, new = issue_scenario()
    table, rows = table_of(videos, stats)
    rng = np.random.default_rng(1)
    rr = reranker(exploration_budget=0.0)
    for user in range(22):
        favourite = ("news", "sport")[user % 2]
        scores = user_scores(videos, favourite, rng)
        ranked = run(rr, videos, table, rows, scores, count=len(videos), user=f"u{user}")
        supported = [i for i, v in enumerate(ranked) if v.startswith("old") and
                     videos[int(v[3:])].category == favourite]
        assert len(supported) == 20  # every video of the user's category...
        positions = [i for i, v in enumerate(ranked) if v in new]
        assert positions and min(positions) > max(supported)  # ...above every new one


def test_the_issue_scenario_spends_at_most_the_budget_on_new_videos() -> None:
    videos, stats, new = issue_scenario()
    table, rows = table_of(videos, stats)
    rng = np.random.default_rng(2)
    rr = reranker(exploration_budget=0.1)
    served = Counter()
    for user in range(22):
        scores = user_scores(videos, ("news", "sport")[user % 2], rng)
        ranked = run(rr, videos, table, rows, scores, count=20, user=f"u{user}")
        assert len(ranked) == 20
        served.update("new" if v in new else "old" for v in ranked)
    # Before: 66 of 440 slots. Now: the budget, 10% of 440, spent by Thompson sampling.
    assert served["new"] == 44


def test_zero_engagement_share_stays_within_the_budget_over_many_requests() -> None:
    rng = np.random.default_rng(3)
    videos, stats = [], []
    for i in range(300):
        videos.append(make_video(video_id=f"e{i}", category=f"k{i % 7}", creator_id=f"c{i}"))
        stats.append(established(engaged=int(rng.integers(10, 120))))
    for i in range(60):  # uploads nobody engaged with yet (some shown a few times)
        videos.append(make_video(video_id=f"z{i}", category=f"k{i % 7}", creator_id=f"n{i}"))
        stats.append(VideoStats(impressions=int(rng.integers(0, 5))))
    table, rows = table_of(videos, stats)
    budget = 0.1
    rr = reranker(exploration_budget=budget, seed=4)
    zero = slots = 0
    for request in range(1500):
        pick = rng.choice(len(videos), size=100, replace=False)
        chosen = [videos[i] for i in pick]
        # A model that likes empty rows: zero-engagement videos score high.
        scores = [0.95 if v.video_id.startswith("z") else float(rng.uniform(0.05, 0.9))
                  for v in chosen]
        count = int(rng.integers(1, 31))
        ranked = run(rr, chosen, table, rows[pick], scores, count, user=f"u{request % 50}")
        slots += len(ranked)
        zero += sum(v.startswith("z") for v in ranked)
    share = zero / slots
    # Slots are the budget's share rounded at random: the mean is exact, the spread small.
    assert 0.8 * budget < share <= budget + 3 * (budget * (1 - budget) / 1500) ** 0.5


def test_thompson_sampling_favours_new_videos_that_engage_early() -> None:
    videos = [make_video(video_id=f"e{i}", creator_id=f"c{i}") for i in range(30)]
    stats = [established() for _ in videos]
    videos += [make_video(video_id="liked", creator_id="x"),
               make_video(video_id="ignored", creator_id="y")]
    stats += [VideoStats(impressions=15, plays=12, finishes=10),
              VideoStats(impressions=15)]
    table, rows = table_of(videos, stats)
    rr = reranker(exploration_budget=0.1, seed=5)
    picks = Counter()
    for _ in range(400):
        ranked = run(rr, videos, table, rows, [0.5] * 30 + [0.5, 0.5], count=10)
        picks.update(v for v in ranked if v in ("liked", "ignored"))
    assert picks["liked"] > 5 * picks["ignored"]
    assert picks["liked"] + picks["ignored"] == 400  # one slot in ten, every time


# --- the calibrated prior ---------------------------------------------------------


def test_prior_is_young_videos_rate_shrunk_toward_the_category() -> None:
    videos, stats = [], []
    for _ in range(50):  # young videos in music: 10 impressions, 4 plays each
        videos.append(make_video(category="music"))
        stats.append(VideoStats(impressions=10, plays=4))
    for i in range(20):  # established videos in music and talk, rate 0.1
        videos.append(make_video(category=("music", "talk")[i % 2]))
        stats.append(VideoStats(impressions=1000, plays=100))
    videos += [make_video(video_id="fresh-music", category="music"),
               make_video(video_id="fresh-talk", category="talk")]
    stats += [VideoStats(), VideoStats()]
    table, rows = table_of(videos, stats)
    s = RerankSettings(new_video_impressions=20, category_shrinkage=100, prior_strength=10)
    rates = estimate(table, s.new_video_impressions, s.category_shrinkage)
    r_all = (50 * 4 + 20 * 100) / (50 * 10 + 20 * 1000)
    r0 = (50 * 4 + 100 * r_all) / (50 * 10 + 100)
    assert rates.overall == pytest.approx(r0)
    music = table.category_code["music"]
    talk = table.category_code["talk"]
    assert rates.by_category[music] == pytest.approx((200 + 100 * r0) / (500 + 100))
    assert rates.by_category[talk] == pytest.approx(r0)  # no young talk video: the global rate
    uploaded = np.array([v.uploaded_at for v in videos], dtype=np.float64)
    new = ColdStart(s).new_videos(table, rows, uploaded, NOW)
    assert [videos[i].video_id for i in new.positions.tolist()][-2:] == ["fresh-music",
                                                                         "fresh-talk"]
    assert new.mean[-1] == pytest.approx(r0)  # no counters of its own: the prior's mean


def test_a_new_video_the_model_scores_alike_for_everyone_scores_its_prior() -> None:
    """What the network scores a row it never trained, for this user as for anyone, is
    no evidence: the video gets its prior."""
    videos = [make_video(video_id="old"), make_video(video_id="new")]
    table, rows = table_of(videos, [established(), VideoStats()])
    rr = reranker(exploration_budget=0.0)
    scores = np.array([0.5, 0.92], dtype=np.float32)
    out, order = rr.rerank("u1", NOW, (), None, ["old", "new"], table, rows, scores, 2,
                           anonymous=lambda positions: scores[positions])
    assert order.tolist() == [0, 1]  # nothing excluded: the ranking's order
    assert out[0] == pytest.approx(0.5)  # established: the model's score
    assert out[1] == pytest.approx(0.3)  # new: the prior (every video's rate here: 60/200)


def test_the_users_own_signal_moves_a_new_video_off_its_prior() -> None:
    """Two just-uploaded videos with the same prior: the model expects this user to
    engage with one more than an anonymous user would (a category they love), with the
    other less (one they skip). The prior keeps both near the category's rate but never
    erases the difference, and the lift fades into the model's score with exposure."""
    videos = [make_video(video_id="loved"), make_video(video_id="skipped")]
    table, rows = table_of(videos, [VideoStats(), VideoStats()])
    rr = reranker(exploration_budget=0.0)
    user = np.array([0.6, 0.2], dtype=np.float32)
    anonymous = np.array([0.4, 0.4], dtype=np.float32)
    out, _ = rr.rerank("u1", NOW, (), None, ["loved", "skipped"], table, rows, user, 2,
                       anonymous=lambda positions: anonymous[positions])
    prior = DEFAULT_RATE  # no counters at all yet
    assert out[0] > prior > out[1]
    odds = (0.6 / 0.4) / (0.4 / 0.6)  # the user's lift, as an odds ratio
    assert (out[0] / (1 - out[0])) / (prior / (1 - prior)) == pytest.approx(odds, rel=1e-4)

    seen = [VideoStats(impressions=10, plays=2), VideoStats(impressions=20, plays=2)]
    table, rows = table_of(videos, seen)  # half way to established, and established
    out, _ = rr.rerank("u1", NOW, (), None, ["loved", "skipped"], table, rows, user, 2,
                       anonymous=lambda positions: anonymous[positions])
    assert out[1] == pytest.approx(0.2)  # 20 impressions: the model's own score


def test_the_users_own_history_orders_new_videos_against_the_category_priors() -> None:
    """Issue #21: a prior must never erase the user's own signal. The skipped category's
    new-video rate is four times the loved one's, and the model reads nothing of the user
    (the same score as for an anonymous user): six liked videos of the loved category and
    three skipped of the other still put the loved category's new video first."""
    videos, stats = [], []
    for i in range(40):  # young videos: "hot" engages 40%, "slow" 10%
        hot = i % 2 == 0
        videos.append(make_video(video_id=f"y{i}", category="hot" if hot else "slow"))
        stats.append(VideoStats(impressions=10, plays=4 if hot else 1))
    videos += [make_video(video_id="new-slow", category="slow", creator_id="n1"),
               make_video(video_id="new-hot", category="hot", creator_id="n2")]
    stats += [VideoStats(), VideoStats()]
    table, rows = table_of(videos, stats)
    rr = reranker(exploration_budget=0.0, category_shrinkage=10)
    ids = [v.video_id for v in videos]
    scores = np.full(len(videos), 0.3, dtype=np.float32)

    def reranked(history: Sequence[HistoryEntry]) -> tuple[float, float]:
        out, _ = rr.rerank("u1", NOW, history, None, ids, table, rows, scores, len(ids),
                           anonymous=lambda positions: scores[positions])
        return float(out[-2]), float(out[-1])  # new-slow, new-hot

    prior_slow, prior_hot = reranked(())
    assert prior_hot > 3 * prior_slow  # no events: the priors, the skipped category's higher
    lover = [HistoryEntry(video_id=f"y{i}", watch_ratio=1.0, ts=NOW - i, action="like",
                          category="slow", creator_id=f"c{i}") for i in range(1, 12, 2)]
    lover += [HistoryEntry(video_id=f"y{i}", watch_ratio=0.0, ts=NOW - i, action="skip",
                           category="hot", creator_id=f"c{i}") for i in range(0, 6, 2)]
    slow, hot = reranked(lover)
    assert slow > hot
    # One like and one skip are evidence too, short of overturning a fourfold prior.
    slow_one, hot_one = reranked(lover[:1] + lover[6:7])
    assert prior_slow < slow_one < slow and prior_hot > hot_one > hot and hot_one > slow_one


# --- feedback ---------------------------------------------------------------------


def test_a_disliked_video_never_comes_back_and_its_creator_is_demoted() -> None:
    videos = [make_video(video_id=f"v{i}", creator_id="bad" if i < 3 else f"c{i}")
              for i in range(6)]
    table, rows = table_of(videos, [established() for _ in videos])
    feedback = MemoryFeedback(FeedbackParams())
    disliked_at = NOW - 3600 * 1000
    feedback.record_events(
        [make_event(user_id="u1", video_id="v0", type="dislike", ts=disliked_at)], {"v0": "bad"}
    )
    half_life_s = 3600.0
    rr = reranker(feedback, exploration_budget=0.0, dislike_creator_penalty=0.5,
                  dislike_penalty_half_life_s=half_life_s)
    scores = [0.9, 0.8, 0.7, 0.62, 0.5, 0.45]
    ids = [v.video_id for v in videos]
    for _ in range(3):
        ranked = run(rr, videos, table, rows, scores, count=6)
        assert "v0" not in ranked
    out, _ = rr.rerank("u1", NOW, (), None, ids, table, rows,
                       np.asarray(scores, dtype=np.float32), 6)
    # One half-life after the dislike: the creator's videos keep 1 - 0.5 * 0.5 of their score.
    assert out[1] == pytest.approx(0.8 * 0.75) and out[2] == pytest.approx(0.7 * 0.75)
    assert ranked == ["v3", "v1", "v2", "v4", "v5"]
    # The demotion fades: ten half-lives on, the order is the model's again.
    later = run(rr, videos, table, rows, scores, count=6, now_ms=NOW + 9 * 3600 * 1000)
    assert later == ["v1", "v2", "v3", "v4", "v5"]
    # Other users are untouched.
    assert run(rr, videos, table, rows, scores, count=6, user="u2")[0] == "v0"


def test_exclude_served_drops_ignored_videos_within_the_window_only() -> None:
    videos = [make_video(video_id=f"v{i}", creator_id=f"c{i}") for i in range(5)]
    table, rows = table_of(videos, [established() for _ in videos])
    window_s = 600.0
    feedback = MemoryFeedback(FeedbackParams(served_window_ms=int(window_s * 1000)))
    rr = reranker(feedback, exploration_budget=0.0, served_window_s=window_s)
    scores = [0.9, 0.8, 0.7, 0.6, 0.5]
    served_at = NOW
    feedback.record_served([ServedBatch("u1", served_at, ["v0", "v1", "v2"])])
    # The user played v1 (the signal feed clears it)...
    feedback.record_events(
        [make_event(user_id="u1", video_id="v1", type="play", ts=served_at + 5000)], {}
    )
    # ...and finished v2, which the history shows before the event reached the feed.
    history = [HistoryEntry(video_id="v2", watch_ratio=1.0, ts=served_at + 6000)]
    soon = served_at + 60_000
    assert run(rr, videos, table, rows, scores, 5, history=history, now_ms=soon,
               exclude_served=True) == ["v1", "v2", "v3", "v4"]
    # Off for this request (the setting's default is off): nothing dropped.
    assert run(rr, videos, table, rows, scores, 5, history=history, now_ms=soon)[0] == "v0"
    # After the window v0 may come back.
    after = served_at + int(window_s * 1000) + 1
    assert run(rr, videos, table, rows, scores, 5, history=history, now_ms=after,
               exclude_served=True)[0] == "v0"
    # The setting gives the default.
    on = reranker(feedback, exploration_budget=0.0, served_window_s=window_s,
                  exclude_served=True)
    assert "v0" not in run(on, videos, table, rows, scores, 5, now_ms=soon)


# --- diversity --------------------------------------------------------------------


def test_diversity_cap_holds_and_keeps_score_order() -> None:
    videos = [make_video(video_id=f"v{i}", creator_id=f"c{i % 3}") for i in range(30)]
    table, rows = table_of(videos, [established() for _ in videos])
    scores = list(np.linspace(0.9, 0.1, 30))
    rr = reranker(exploration_budget=0.0, max_per_creator=2)
    ranked = run(rr, videos, table, rows, scores, count=10)
    assert ranked == ["v0", "v1", "v2", "v3", "v4", "v5"]  # strict: 3 creators x 2
    per_creator = Counter(videos[int(v[1:])].creator_id for v in ranked)
    assert max(per_creator.values()) == 2
    # Off (0): the plain top-K.
    plain = run(reranker(exploration_budget=0.0), videos, table, rows, scores, count=10)
    assert plain == [f"v{i}" for i in range(10)]


def test_only_recent_uploads_take_exploration_slots() -> None:
    old_upload = NOW - 30 * 24 * HOUR_MS  # a month ago, still short of impressions
    videos = [make_video(video_id=f"e{i}", creator_id=f"c{i}") for i in range(30)]
    stats = [established() for _ in videos]
    videos += [make_video(video_id="unpopular", uploaded_at=old_upload),
               make_video(video_id="fresh")]
    stats += [VideoStats(impressions=3, plays=3), VideoStats(impressions=3, plays=3)]
    table, rows = table_of(videos, stats)
    rr = reranker(exploration_budget=0.1, seed=6)
    picks = Counter()
    for _ in range(50):
        # The established videos score above what either new one's posterior reaches, so
        # a new video in the page got there by an exploration slot.
        ranked = run(rr, videos, table, rows, [0.7] * 30 + [0.5, 0.5], count=10)
        picks.update(v for v in ranked if v in ("unpopular", "fresh"))
    assert picks == {"fresh": 50}


def test_the_order_follows_the_ranking_bonus_after_an_exclusion() -> None:
    videos = [make_video(video_id=v) for v in ("old", "liked", "other")]
    table, rows = table_of(videos, [established() for _ in videos])
    feedback = MemoryFeedback(FeedbackParams())
    feedback.record_events([make_event(user_id="u1", video_id="old", type="dislike")], {})
    rr = reranker(feedback, exploration_budget=0.0)
    ids = [v.video_id for v in videos]
    scores = np.array([0.6, 0.5, 0.55], dtype=np.float32)
    bonus = np.array([0.0, 0.5, 0.0])  # say, "liked" was co-watched with the history
    _, order = rr.rerank("u1", NOW, (), None, ids, table, rows, scores, 3, bonus)
    assert order is not None and [ids[i] for i in order] == ["liked", "other"]
    _, order = rr.rerank("u1", NOW, (), None, ids, table, rows, scores, 3)
    assert order is not None and [ids[i] for i in order] == ["other", "liked"]


def test_rates_are_re_estimated_on_the_clock_given() -> None:
    """A replay's cold start refreshes its rates on event time (``vidrec eval``): what a
    question reads does not depend on how fast the machine replays."""
    young = [make_video(category="music") for _ in range(5)]
    table, rows = table_of(young, [VideoStats(impressions=10, plays=4) for _ in young])
    s = RerankSettings(new_video_impressions=20, prior_refresh_s=10.0)
    now = [0.0]
    cold = ColdStart(s, seed=0, clock=lambda: now[0])
    first = cold.rates(table)
    table.set_stats(rows, [VideoStats(impressions=10, plays=9) for _ in young])
    now[0] = 9.9
    assert cold.rates(table) is first  # within prior_refresh_s of the clock: kept
    now[0] = 10.0
    assert cold.rates(table).overall > first.overall  # re-estimated at the clock's 10 s
