"""``vidrec eval``: the replay through trainer and service, baselines, report and plot.

Runs on a small generated MovieLens directory (tests.factories.write_movielens);
the real ml-100k is never needed (its license forbids copying it here).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.evaluation import EvalConfig, evaluate
from app.evaluation.baselines import Popularity, prequential
from app.evaluation.metrics import recall_ndcg, windows
from app.evaluation.progress import Progress
from app.evaluation.report import replace_section
from app.evaluation.results import MF_ROW, POOL_ROW, RANKER_ROW, SEQUENCE_ROW
from app.evaluation.stream import load_stream, split_samples
from app.wiring import eval_trainers
from feature_store.errors import ConfigurationError, InvalidInput
from feature_store.models.quality import roc_auc as auc
from feature_store.models.scored import ScoredSamples
from feature_store.settings import EventLimits
from tests.factories import write_movielens

MIN_TS = 946_684_800_000


def _config(path: Path, **overrides: object) -> EvalConfig:
    base: dict[str, object] = dict(
        dataset=path,
        queries=30,
        windows=5,
        offline_epochs=3,
        batch_size=128,
        export_every=1000,
        progress=False,
    )
    return EvalConfig(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def movielens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, float]:
    directory = tmp_path_factory.mktemp("ml") / "ml-tiny"
    count = write_movielens(directory, users=60, items=60, per_user=30)
    ratings = [int(line.split("\t")[2]) for line in (directory / "u.data").read_text().splitlines()]
    return directory, count, float(np.mean([r >= 4 for r in ratings]))


@pytest.fixture(scope="module")
def result(movielens: tuple[Path, int, float]):  # type: ignore[no-untyped-def]
    # A small log: the sequence tower refits every 100 views so that its row is scored.
    return evaluate(_config(movielens[0], settings={"sequence": {"min_refit": 100}}),
                    eval_trainers())


def test_every_rating_is_one_row_labelled_rating_at_least_4(result, movielens) -> None:  # type: ignore[no-untyped-def]
    _, count, positive_rate = movielens
    assert result.samples == count
    assert result.positive_rate == pytest.approx(positive_rate)
    assert result.test_rows == round(count * 0.2)
    assert 0.3 < positive_rate < 0.7


def test_all_models_are_scored_on_the_same_last_20_percent(result) -> None:  # type: ignore[no-untyped-def]
    names = [m.name for m in result.models]
    assert names[:5] == ["online Wide&Deep", RANKER_ROW, SEQUENCE_ROW, "popularity",
                         "recent popularity (7 d)"]
    assert names[5] == MF_ROW and names[6].startswith("offline Wide&Deep")
    assert names[7:] == [POOL_ROW]
    ranks_only = (RANKER_ROW, SEQUENCE_ROW, MF_ROW, POOL_ROW)
    scored = [m for m in result.models if m.name not in ranks_only]
    assert len(scored) == 4
    for model in scored:
        assert 0.0 <= model.auc_test <= 1.0
        assert np.isfinite(model.logloss_test)
        assert len(model.window_auc) == 5
    for name in ranks_only:  # ranks only: no scores
        assert np.isnan(result.model(name).auc_test)
    # The offline model only scores the test rows: its curve is empty before them.
    assert np.isnan(result.models[6].window_auc[0])
    assert result.offline_epochs and 1 <= result.offline_best_epoch <= 3


def test_online_model_learns_users_beyond_popularity(result) -> None:  # type: ignore[no-untyped-def]
    online, popularity = result.models[0], result.model("popularity")
    # Movies are liked by half of the users each: popularity is near chance,
    # the online model learns each user's genres from their first ratings.
    assert popularity.auc_test < 0.55
    assert online.auc_test > 0.58
    assert online.auc_test > popularity.auc_test + 0.05


def test_each_head_has_its_prequential_figure_beside_a_baseline(result) -> None:  # type: ignore[no-untyped-def]
    """1 star is a skip (the negative head's label), plays' ratios the watch head's target."""
    heads = result.heads
    assert heads["watch_samples"] > 0
    for figure in ("negative_auc", "negative_baseline_auc", "watch_mae", "watch_baseline_mae"):
        assert 0 <= heads[figure] <= 1, figure
    for figure in ("watch_spearman", "watch_baseline_spearman"):
        assert -1 <= heads[figure] <= 1, figure


def test_service_is_asked_at_held_back_positives(result) -> None:  # type: ignore[no-untyped-def]
    assert result.queries == 30
    online = result.models[0]
    assert 0.0 <= online.ndcg <= online.recall <= 1.0
    for name in ("popularity", "recent popularity (7 d)", MF_ROW):
        assert 0.0 <= result.model(name).ndcg <= result.model(name).recall <= 1.0


def test_matrix_factorisation_learns_the_users_genres(result) -> None:  # type: ignore[no-untyped-def]
    """Ratings >= 4 go to each user's two liked genres: factors learn them, and retrieve
    the held-back positives that popularity (every genre liked by half the users) misses."""
    mf, popularity = result.model(MF_ROW), result.model("popularity")
    assert mf.recall > popularity.recall + 0.1 and mf.ndcg > popularity.ndcg


def test_ranker_alone_reorders_the_same_pool_as_the_service(result) -> None:  # type: ignore[no-untyped-def]
    """The pool ordered by probability alone: a hit needs the item in the pool, as the
    service's does, and its rank is a reordering of that pool."""
    ranker, pool = result.model(RANKER_ROW), result.model(POOL_ROW)
    assert 0.0 <= ranker.ndcg <= ranker.recall <= result.service_candidate_recall
    assert np.isfinite(pool.recall)


def test_pool_row_ranks_the_service_candidates_in_source_order(result) -> None:  # type: ignore[no-untyped-def]
    pool = result.model(POOL_ROW)
    assert 0.0 <= pool.ndcg <= pool.recall <= result.service_candidate_recall
    assert np.isnan(pool.auc_test)


def test_cli_prints_table_writes_plot_and_doc_section(movielens, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        "# Benchmarks\n\n## Sparse tables\n\nkept\n\n## Quality (MovieLens ml-tiny)\n\nold\n"
    )
    png = tmp_path / "auc.png"
    code = main(
        [
            "eval",
            str(movielens[0]),
            "--queries",
            "5",
            "--windows",
            "4",
            "--epochs",
            "1",
            "--limit",
            "3000",
            "--plot",
            str(png),
            "--doc",
            str(doc),
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "online Wide&Deep" in out and "AUC last 20%" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = doc.read_text()
    assert "kept" in text and "old" not in text
    assert "| online Wide&Deep |" in text and "![AUC over time](auc.png)" in text
    assert "negative (skip, dislike) AUC" in text and "watch quantile rank correlation" in text
    assert f"Command: `vidrec eval {movielens[0]} --queries 5 --windows 4 --epochs 1" in text


def test_events_csv_runs_with_the_default_label_policy(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rows = []
    for n in range(1500):
        user, video = f"u{rng.integers(0, 40)}", f"v{rng.integers(0, 30)}"
        liked = (int(user[1:]) + int(video[1:])) % 3 == 0
        rows.append(
            {
                "event_id": f"e{n}",
                "user_id": user,
                "video_id": video,
                "type": "finish" if liked else "skip",
                "ts": MIN_TS + 10**9 + n * 1000,
                "watch_ms": "",
                "duration_ms": "",
            }
        )
    path = tmp_path / "events.csv"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buf.getvalue())
    got = evaluate(_config(path, queries=5, offline_epochs=1), eval_trainers())
    assert got.samples == 1500
    assert got.test_rows == 300


def test_split_is_by_time_user_item_with_a_validation_eighth() -> None:
    n = 100
    samples = ScoredSamples(
        event_ids=[f"e{i}" for i in range(n)],
        user_ids=[f"u{i % 7}" for i in range(n)],
        video_ids=[f"v{i}" for i in range(n)],
        ts_ms=np.arange(n, dtype=np.int64)[::-1].copy(),
        labels=np.zeros(n),
        weights=np.ones(n),
        scores=np.zeros(n),
    )
    split = split_samples(samples)
    assert (len(split.train), len(split.valid), len(split.test)) == (70, 10, 20)
    assert split.test == [f"e{i}" for i in range(19, -1, -1)]  # latest times last


def test_popularity_is_prequential_and_decays() -> None:
    pop = Popularity(prior_strength=1.0)
    scores = prequential(pop, ["a", "a", "b"], [0, 1, 2], np.array([1.0, 1.0, 0.0]))
    assert scores[0] == pytest.approx(0.5)  # nothing seen yet: the prior
    assert scores[1] > scores[0]  # one positive of "a" seen before the second
    decayed = Popularity(half_life_ms=1000.0)
    decayed.update("old", 0, 1.0)
    decayed.update("new", 5000, 1.0)
    assert decayed.top(2, 5000, exclude=()) == ["new", "old"]
    assert decayed.top(2, 5000, exclude={"new"}) == ["old"]


def test_metrics() -> None:
    labels = np.array([0.0, 0.0, 1.0, 1.0])
    assert auc(np.array([0.1, 0.2, 0.3, 0.4]), labels) == 1.0
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), labels) == 0.5
    assert np.isnan(auc(np.zeros(2), np.ones(2)))
    recall, ndcg = recall_ndcg([1, 3, None, 25], k=20)
    assert recall == 0.5 and ndcg == pytest.approx((1 + 1 / np.log2(4)) / 4)
    assert windows(10, 3) == [(0, 3), (3, 6), (6, 10)]


def test_progress_line_has_rate_and_eta() -> None:
    out = io.StringIO()
    bar = Progress(1000, "replay", "events", out=out)
    bar.update(500)
    line = bar.line()
    assert "500/1,000 events" in line and "events/s" in line and "ETA" in line
    assert "50.0%" in out.getvalue()


def test_replace_section_appends_when_missing() -> None:
    doc = replace_section("# B\n\n## Other\n\nx\n", "Quality (MovieLens 100K)", "table")
    assert doc.endswith("## Quality (MovieLens 100K)\n\ntable\n") and "## Other\n\nx" in doc


def test_movielens_stream_uses_genres_and_release_decade(movielens) -> None:  # type: ignore[no-untyped-def]
    stream = load_stream(movielens[0], "auto", EventLimits())
    video = stream.videos[0]
    assert video.category in {"action", "comedy", "drama", "sci-fi"}
    assert video.creator_id.startswith("decade-")


@pytest.mark.redis
def test_redis_backends_replay_the_same_rows(movielens, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    import redis

    small = {"limit": 2500, "queries": 5, "offline_epochs": 1}
    on_redis = evaluate(
        _config(movielens[0], backend="redis", redis_url=redis_url, **small), eval_trainers()
    )
    in_memory = evaluate(_config(movielens[0], **small), eval_trainers())
    assert (on_redis.samples, on_redis.test_rows) == (in_memory.samples, in_memory.test_rows)
    # same rows, same labels
    assert on_redis.model("popularity").auc_test == in_memory.model("popularity").auc_test
    assert on_redis.models[0].auc_test == pytest.approx(in_memory.models[0].auc_test, abs=0.05)
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0  # the scratch database is left empty
        client.set("someone-elses-key", "1")
        with pytest.raises(ConfigurationError, match="scratch"):
            evaluate(
                _config(movielens[0], backend="redis", redis_url=redis_url, **small),
                eval_trainers(),
            )
        assert client.get("someone-elses-key") == b"1"
    finally:
        client.close()


def test_movielens_latest_layout_is_read(tmp_path: Path) -> None:
    directory = tmp_path / "ml-latest-small"
    directory.mkdir()
    (directory / "movies.csv").write_text(
        "movieId,title,genres\n1,Toy Story (1995),Animation|Comedy\n2,Heat (1995),Action\n"
    )
    (directory / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n1,1,4.5,964982703\n1,2,2.0,964982931\n"
    )
    stream = load_stream(directory, "auto", EventLimits())
    assert [v.category for v in stream.videos] == ["animation", "action"]
    assert stream.videos[0].tags == ("animation", "comedy")
    assert stream.videos[0].creator_id == "decade-1990s"
    assert stream.kind == "movielens" and len(stream.events) == 2 + 4  # impression + play...


def test_parquet_needs_pyarrow_or_reads_events(tmp_path: Path) -> None:
    path = tmp_path / "events.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(InvalidInput, match="pyarrow"):
            load_stream(path, "auto", EventLimits())
        return
    table = pa.table(
        {
            "event_id": ["e1"],
            "user_id": ["u"],
            "video_id": ["v"],
            "type": ["finish"],
            "ts": [MIN_TS + 10**9],
        }
    )
    pq.write_table(table, path)
    assert [e.event_id for e in load_stream(path, "auto", EventLimits()).events] == ["e1"]


def test_movielens_users_reach_the_features(movielens) -> None:  # type: ignore[no-untyped-def]
    from feature_store.features import FeatureExtractor, FeatureRow
    from feature_store.features.schema import default_schema
    from feature_store.settings import FeatureSettings

    stream = load_stream(movielens[0], "auto", EventLimits())
    first = stream.events[0]
    assert first.context == stream.users[first.user_id]
    assert first.context.gender in ("M", "F") and first.context.occupation == "student"
    schema = default_schema(FeatureSettings(user_attributes=True))
    assert {"age_group", "gender", "occupation"} <= set(schema.table_dims())
    assert schema.schema_hash() != default_schema().schema_hash()
    rows = [
        FeatureRow("u", "v", MIN_TS, context=first.context.model_copy(update={"gender": g}))
        for g in ("M", "F")
    ]
    batch = FeatureExtractor(schema).extract(rows)
    assert len(batch.table_keys["gender"]) == 2  # one row per gender, read from the context


def test_serving_features_with_user_attributes_match_training() -> None:
    from app.scoring.features import RequestFeatureExtractor
    from feature_store.activity.base import VideoStats
    from feature_store.events import EventContext
    from feature_store.features import FeatureExtractor, FeatureRow
    from feature_store.features.schema import default_schema
    from feature_store.settings import FeatureSettings
    from tests.factories import make_video
    from tests.feature_checks import assert_same_features

    schema = default_schema(FeatureSettings(user_attributes=True))
    videos = [make_video(category=f"k{i % 3}") for i in range(9)]
    stats = [VideoStats(plays=i) for i in range(9)]
    context = EventContext(country="DE", age_group="25-34", gender="F", occupation="writer")
    ts = 1_700_000_900_000
    rows = [
        FeatureRow("u1", v.video_id, ts, v, context, (), s)
        for v, s in zip(videos, stats, strict=True)
    ]
    want = FeatureExtractor(schema).extract(rows)
    extractor = RequestFeatureExtractor(schema)
    got = extractor.extract_request("u1", ts, context, [], videos, stats)
    assert_same_features(got, want, schema)


def test_ranking_weights_option_is_checked_before_the_run(movielens, caplog) -> None:  # type: ignore[no-untyped-def]
    code = main(["eval", str(movielens[0]), "--ranking-weights", '{"clicks": 1}',
                 "--no-progress"])
    assert code == 2
    assert "--ranking-weights" in caplog.text and "engagement" in caplog.text
