"""``vidrec eval`` on positive-only logs and files of events: leave-one-out, added
impressions, catalogs, old timestamps, per-moment AUC and the doc section's name.

All data is generated here (small, seconds per run).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.evaluation import EvalConfig, evaluate, factorization
from app.evaluation.baselines import CoOccurrence
from app.evaluation.feed import (
    IMPRESSION_LEAD_MS,
    HeldOut,
    Sampler,
    as_feed,
    hold_out_last,
    touched_by_user,
)
from app.evaluation.metrics import moments, rank_in
from app.evaluation.report import random_ranking, text_table
from app.evaluation.results import MF_ROW, RANKER_ROW, EvalResult
from app.evaluation.runner import whole_catalog
from app.wiring import eval_trainers
from feature_store.errors import InvalidInput
from feature_store.events import Event, EventContext, EventType

T0 = 1_700_000_000_000
"""Recent enough for every limit (2023-11-14), ms."""
OLD_T0 = 830_000_000_000
"""1996-04-20, ms: before ``limits.min_ts_ms`` (2000-01-01)."""
WINDOW_MS = 60_000


def _write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_positive_log(
    directory: Path, users: int = 40, videos: int = 160, views: int = 12, t0: int = T0,
    likes: bool = False, seed: int = 0,
) -> tuple[Path, Path]:
    """A positive-only log (``finish`` rows) and its catalog, with structure.

    Videos fall in eight categories; each user watches videos of one category
    (nine in ten views), so what a user watched says what they watch next.
    Users arrive an hour apart and view one video every 10 minutes. With
    ``likes`` every third view is a ``finish`` then a ``like`` 5 s later
    (one moment, two positive samples).
    """
    rng = np.random.default_rng(seed)
    category = [i % 8 for i in range(videos)]
    rows: list[dict[str, object]] = []
    for u in range(users):
        own = u % 8
        mine = [v for v in range(videos) if category[v] == own]
        others = [v for v in range(videos) if category[v] != own]
        chosen: list[int] = []
        while len(chosen) < views:
            pool = mine if rng.random() < 0.9 else others
            v = int(pool[int(rng.integers(0, len(pool)))])
            if v not in chosen:
                chosen.append(v)
        for k, v in enumerate(chosen):
            ts = t0 + u * 3_600_000 + k * 600_000
            base = {"event_id": f"e{u}-{k}", "user_id": f"u{u}", "video_id": f"v{v}",
                    "type": "finish", "ts": ts, "watch_ms": 30_000, "duration_ms": 30_000}
            rows.append(base)
            if likes and k % 3 == 0:
                rows.append({**base, "event_id": f"e{u}-{k}-like", "type": "like",
                             "ts": ts + 5_000, "watch_ms": "", "duration_ms": ""})
    rows.sort(key=lambda r: int(r["ts"]))  # type: ignore[call-overload]
    directory.mkdir(parents=True, exist_ok=True)
    events = _write_csv(directory / "events.csv", rows)
    catalog = _write_csv(directory / "videos.csv", [
        {"video_id": f"v{v}", "creator_id": f"c{v % 7}", "category": f"k{category[v]}",
         "tags": f"k{category[v]}|t{v % 3}", "duration_ms": 30_000,
         "uploaded_at": t0 - 86_400_000}
        for v in range(videos)
    ])
    return events, catalog


def _config(path: Path, **overrides: object) -> EvalConfig:
    base: dict[str, object] = dict(
        dataset=path, windows=4, offline_epochs=1, batch_size=128, export_every=1000,
        progress=False,
    )
    return EvalConfig(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def positive_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_positive_log(tmp_path_factory.mktemp("positive"))


@pytest.fixture(scope="module")
def loo(positive_log: tuple[Path, Path]) -> EvalResult:
    events, catalog = positive_log
    return evaluate(_config(events, catalog=catalog, protocol="loo", negatives=1), eval_trainers())


# --- leave-one-out with one added negative per view, end to end ------------------


def test_loo_asks_the_service_once_per_user_among_100_candidates(loo: EvalResult) -> None:
    assert loo.protocol == "loo" and loo.k == 10
    assert loo.queries == 40  # every user has 12 views
    assert loo.candidates_per_query == 100
    assert loo.service_candidate_recall == 1.0  # every candidate ranked, none filtered
    assert not loo.service_fallbacks


def test_loo_feed_has_one_timed_out_negative_per_replayed_view(loo: EvalResult) -> None:
    replayed_views = 40 * 12 - 40  # the held-out last views are never produced
    # a finish, its impression and one unwatched impression per replayed view
    assert loo.events == 3 * replayed_views
    # the finish (positive) and the timeout (negative); the last page's negative, still
    # within its join window when the log ends, times out at the end of the replay
    assert loo.samples == 2 * replayed_views
    assert loo.positive_rate == pytest.approx(0.5, abs=0.01)


def test_loo_baselines_rank_the_same_candidates(loo: EvalResult) -> None:
    names = [m.name for m in loo.models]
    assert names[:6] == ["online Wide&Deep", RANKER_ROW, "popularity",
                         "recent popularity (7 d)", "co-occurrence", MF_ROW]
    random_hr, _ = random_ranking(100, 10)
    assert random_hr == pytest.approx(0.1)
    co = loo.model("co-occurrence")
    # Users of one category watch that category: what they watched co-occurs with it.
    assert co.recall > 3 * random_hr
    assert co.recall > loo.model("popularity").recall
    assert 0.0 < co.ndcg <= co.recall
    for model in loo.models[:6]:
        assert 0.0 <= model.ndcg <= model.recall <= 1.0
    assert np.isnan(co.auc_test)  # ranks candidates only: no sample scores


def test_matrix_factorisation_learns_what_each_user_watches(loo: EvalResult) -> None:
    """Users watch one category: factors learn it, popularity (uniform here) cannot."""
    mf, popularity = loo.model(MF_ROW), loo.model("popularity")
    random_hr, _ = random_ranking(100, 10)
    assert mf.recall > 2 * random_hr
    assert mf.recall > popularity.recall + 0.1 and mf.ndcg > popularity.ndcg
    assert np.isnan(mf.auc_test)


def test_ranker_alone_orders_the_service_candidates_by_probability(loo: EvalResult) -> None:
    ranker = loo.model(RANKER_ROW)
    random_hr, _ = random_ranking(100, 10)
    assert 0.0 < ranker.ndcg <= ranker.recall <= 1.0
    assert ranker.recall > random_hr  # the trained model, not the candidates' random order


def test_without_implicit_the_baseline_is_skipped_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, catalog = write_positive_log(tmp_path, users=8, videos=40, views=6)
    monkeypatch.setattr(factorization, "available", lambda: False)
    got = evaluate(_config(events, catalog=catalog, protocol="loo", negatives=1),
                   eval_trainers())
    assert MF_ROW not in [m.name for m in got.models]
    assert got.skipped == [factorization.MISSING]
    assert "pip install 'implicit>=0.7.2'" in text_table(got)
    assert np.isfinite(got.model(RANKER_ROW).recall)  # the rest is still there


def test_the_offline_model_in_a_second_process_gives_the_same_figures(
    tmp_path: Path, loo: EvalResult, positive_log: tuple[Path, Path]
) -> None:
    """``parallel``: the second process reads and plans the dataset again; the replay, the
    split and the offline model's seeded training are the same, so is every figure (the
    matrix-factorisation row too, its ranks worked out beside the replay by a worker)."""
    events, catalog = positive_log
    got = evaluate(_config(events, catalog=catalog, protocol="loo", negatives=1,
                           parallel=True), eval_trainers())
    assert [m.name for m in got.models] == [m.name for m in loo.models]
    for mine, theirs in zip(got.models, loo.models, strict=True):
        assert mine.auc_test == pytest.approx(theirs.auc_test, nan_ok=True)
        assert mine.recall == pytest.approx(theirs.recall, nan_ok=True)
    assert got.offline_epochs[0]["valid_auc"] == loo.offline_epochs[0]["valid_auc"]


# --- leave-one-out against the whole catalog ----------------------------------------


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[EvalResult, EvalResult]:
    """The same small log evaluated with sampled candidates and against the whole catalog."""
    events, catalog = write_positive_log(tmp_path_factory.mktemp("full"), users=24,
                                         videos=80, views=10)
    sampled = evaluate(_config(events, catalog=catalog, protocol="loo", negatives=1),
                       eval_trainers())
    return sampled, evaluate(_config(events, catalog=catalog, protocol="loo", negatives=1,
                                     full_ranking=True), eval_trainers())


def test_full_ranking_counts_against_the_whole_catalog(
    full: tuple[EvalResult, EvalResult],
) -> None:
    sampled, got = full
    # 80 videos, minus the 9 each user viewed before the held-out tenth
    assert got.full_ranking and got.candidates_per_query == 80 - 9
    assert got.queries == 24 and got.service_candidate_recall == 1.0  # every one ranked
    # the log replayed is the sampled protocol's: only the candidates differ
    assert (got.events, got.samples) == (sampled.events, sampled.samples)
    assert got.models[0].auc_test == pytest.approx(sampled.models[0].auc_test, abs=0.05)
    names = [m.name for m in got.models]
    for name in ("online Wide&Deep", RANKER_ROW, "popularity", "co-occurrence", MF_ROW):
        assert name in names
        assert 0.0 <= got.model(name).ndcg <= got.model(name).recall <= 1.0
    assert "leave-one-out, full ranking" in got.title
    table = text_table(got)
    assert "against the whole catalog: 71 candidates" in table
    assert "as published sequential-recommendation results count it" in table


def test_whole_catalog_drops_the_users_training_items_but_not_the_held_out_one() -> None:
    pool = [f"v{i}" for i in range(10)]
    held = [HeldOut("a", "v3", T0, ("v3", "v7")), HeldOut("b", "v1", T0, ("v1", "v2"))]
    touched = {"a": {"v0", "v3", "v5"}, "b": {"v1", "v2"}}  # b's held-out video: a re-watch
    got = whole_catalog(held, pool, touched, seed=0)
    assert sorted(got[0].candidates) == ["v1", "v2", "v3", "v4", "v6", "v7", "v8", "v9"]
    assert sorted(got[1].candidates) == ["v0", "v1", "v3", "v4", "v5", "v6", "v7", "v8", "v9"]
    assert [(h.user, h.video, h.ts) for h in got] == [("a", "v3", T0), ("b", "v1", T0)]
    assert whole_catalog(held, pool, touched, seed=0) == got  # seeded


def test_full_ranking_needs_leave_one_out(positive_log: tuple[Path, Path],
                                          caplog: pytest.LogCaptureFixture) -> None:
    code = main(["eval", str(positive_log[0]), "--full-ranking", "--no-progress"])
    assert code == 2
    assert "--full-ranking" in caplog.text and "--protocol loo" in caplog.text


def test_loo_report_and_doc_section_name_the_protocol(
    positive_log: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, catalog = positive_log
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Quality (MovieLens 100K)\n\nkept\n")
    code = main(["eval", str(events), "--catalog", str(catalog), "--protocol", "loo",
                 "--negatives", "1", "--queries", "8", "--epochs", "1", "--windows", "3",
                 "--plot", "", "--doc", str(doc), "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "HR@10" in out and "co-occurrence" in out and "8 users' last views" in out
    text = doc.read_text()
    assert "## Quality (MovieLens 100K)\n\nkept" in text  # another dataset's section stays
    assert "## Quality (events.csv, leave-one-out, 1 negative per view)" in text
    assert "--protocol loo --negatives 1" in text and "| co-occurrence |" in text


# --- the pieces of the protocol ---------------------------------------------------


def _finish(n: int, user: str, video: str, ts: int, kind: EventType = EventType.FINISH,
            context: EventContext | None = None) -> Event:
    return Event(event_id=f"e{n}", user_id=user, video_id=video, type=kind, ts=ts,
                 context=context or EventContext())


def test_hold_out_takes_each_users_last_view_and_never_touched_candidates() -> None:
    events = [
        _finish(1, "a", "v1", T0), _finish(2, "b", "v2", T0 + 1000),
        _finish(3, "a", "v3", T0 + 2000), _finish(4, "a", "v3", T0 + 7000, EventType.LIKE),
        _finish(5, "c", "v1", T0 + 9000),  # one view only: never held out
        _finish(6, "b", "v4", T0 + 900_000),
    ]
    pool = [f"v{i}" for i in range(1, 30)]
    kept, held = hold_out_last(events, WINDOW_MS, Sampler(pool, 0), candidates=9)
    assert [e.event_id for e in kept] == ["e1", "e2", "e5"]  # a's finish + like: one view
    assert [(h.user, h.video) for h in held] == [("a", "v3"), ("b", "v4")]
    assert held[0].ts == T0 + 2000 - IMPRESSION_LEAD_MS
    for h in held:
        touched = {e.video_id for e in events if e.user_id == h.user}
        assert len(h.candidates) == 10 and len(set(h.candidates)) == 10
        assert h.video in h.candidates
        assert not (set(h.candidates) - {h.video}) & touched


def test_feed_adds_an_impression_and_n_untouched_negatives_per_view() -> None:
    context = EventContext(device="tv")
    events = [
        _finish(1, "a", "v1", T0, context=context),
        _finish(2, "a", "v1", T0 + 3000, EventType.LIKE),  # same view
        _finish(3, "a", "v2", T0 + 600_000, context=context),
    ]
    pool = [f"v{i}" for i in range(1, 50)]
    feed = as_feed(events, 2, Sampler(pool, 1), touched_by_user(events), WINDOW_MS, 128)
    impressions = [e for e in feed if e.type == EventType.IMPRESSION]
    assert len(impressions) == 2 * 3  # two views, each: its own impression and two others
    assert [e.ts for e in feed] == sorted(e.ts for e in feed)
    for view in (events[0], events[2]):
        page = [e for e in impressions if e.ts == view.ts - IMPRESSION_LEAD_MS]
        assert len(page) == 3 and sum(e.video_id == view.video_id for e in page) == 1
        assert {e.video_id for e in page} - {view.video_id} <= set(pool) - {"v1", "v2"}
        assert all(e.context == context for e in page)  # same page, same context
    assert len({e.event_id for e in feed}) == len(feed)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_loo_refuses_a_log_that_is_not_positive_only(
    positive_log: tuple[Path, Path], tmp_path: Path
) -> None:
    rows = _rows(positive_log[0])
    rows[3]["type"] = "impression"
    path = _write_csv(tmp_path / "mixed.csv", rows)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="positive-only") as exc:
        evaluate(_config(path, protocol="loo"), eval_trainers())
    assert exc.value.field == "type" and rows[3]["event_id"] in str(exc.value)


def test_co_occurrence_counts_other_users_likes_before_the_moment() -> None:
    #          0     1     2     3     4     5
    users = ["a", "b", "b", "c", "c", "a"]
    videos = ["x", "x", "y", "x", "z", "q"]
    model = CoOccurrence(users, videos, np.ones(6, dtype=bool))
    # a liked x before index 5: b liked x and y, c liked x and z (both before 5)
    assert model.scores("a", ["y", "z", "q"], before=5).tolist() == [1.0, 1.0, 0.0]
    # at index 4, c's like of z is not yet counted
    assert model.scores("a", ["y", "z"], before=4).tolist() == [1.0, 0.0]
    # a's own like of q (index 5) never counts for a
    assert model.scores("a", ["q"], before=6).tolist() == [0.0]


def test_rank_in_breaks_ties_by_the_candidates_order() -> None:
    assert rank_in("b", ["a", "b", "c"], np.array([0.1, 0.5, 0.9])) == 2
    assert rank_in("b", ["a", "b", "c"], np.zeros(3)) == 2
    assert rank_in("b", ["b", "a", "c"], np.zeros(3)) == 1


# --- per-moment AUC ---------------------------------------------------------------


def test_moments_group_a_views_samples_and_score_it_once() -> None:
    users = ["u", "u", "v", "u"]
    videos = ["a", "a", "a", "a"]
    ts = np.array([0, 5_000, 6_000, 200_000], dtype=np.int64)  # u's last: a new moment
    first, labels = moments(users, videos, ts, np.array([1.0, 1.0, 0.0, 0.0]), WINDOW_MS)
    assert first.tolist() == [0, 2, 3]
    assert labels.tolist() == [1.0, 0.0, 0.0]


def test_per_moment_auc_counts_a_finish_and_its_like_once(tmp_path: Path) -> None:
    events, catalog = write_positive_log(tmp_path, users=24, videos=80, views=10, likes=True)
    got = evaluate(_config(events, catalog=catalog, negatives=1, queries=5), eval_trainers())
    online = got.models[0]
    assert got.test_moments < got.test_rows  # likes add samples, not moments
    assert np.isfinite(online.auc_test_moments) and np.isfinite(online.auc_test)
    assert "per moment" in text_table(got)


# --- files of events: catalog, old timestamps, bad rows, Parquet ---------------------


def test_without_a_catalog_retrieval_figures_are_not_computed(
    positive_log: tuple[Path, Path],
) -> None:
    got = evaluate(_config(positive_log[0], negatives=1), eval_trainers())
    assert not got.catalog and got.queries == 0
    assert all(np.isnan(m.recall) for m in got.models)
    table = text_table(got)
    assert "cannot be computed without the videos' catalog" in table
    assert np.isfinite(got.models[0].auc_test)


def test_with_a_catalog_the_service_is_asked(positive_log: tuple[Path, Path]) -> None:
    events, catalog = positive_log
    got = evaluate(_config(events, catalog=catalog, negatives=1, queries=10), eval_trainers())
    assert got.catalog and got.queries == 10
    assert np.isfinite(got.models[0].recall)


def test_loo_without_a_catalog_ranks_videos_known_by_id(
    positive_log: tuple[Path, Path],
) -> None:
    got = evaluate(
        _config(positive_log[0], protocol="loo", negatives=1, queries=6), eval_trainers()
    )
    assert not got.catalog
    assert got.queries == 6 and got.service_candidate_recall == 1.0  # every id scored


def test_a_log_from_1996_is_shifted_not_dropped(tmp_path: Path) -> None:
    events, catalog = write_positive_log(tmp_path, users=16, videos=60, views=8, t0=OLD_T0)
    got = evaluate(_config(events, catalog=catalog, negatives=1, queries=4), eval_trainers())
    assert got.samples == 2 * 16 * 8  # the last negative times out at the end
    assert got.shift_days > 365 * 3
    assert np.isfinite(got.models[0].auc_test)
    assert "shifted by +" in text_table(got)


def test_bad_rows_are_reported_and_the_good_ones_kept(tmp_path: Path) -> None:
    events, _ = write_positive_log(tmp_path, users=8, videos=40, views=6)
    rows = _rows(events)
    rows[2]["type"] = "watched"
    rows[5]["ts"] = "yesterday"
    rows[7]["user_id"] = "has space"
    path = _write_csv(tmp_path / "bad.csv", rows)  # type: ignore[arg-type]
    got = evaluate(_config(path, negatives=1), eval_trainers())
    assert got.rejected_rows == 3
    assert got.samples == 2 * (8 * 6 - 3)
    assert any("bad.csv:4: type:" in e for e in got.rejected_examples)  # line 4: header + 3
    assert any(": ts:" in e for e in got.rejected_examples)
    assert any(": user_id:" in e for e in got.rejected_examples)


def test_unknown_columns_are_refused(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "typo.csv", [
        {"event_id": "e1", "user_id": "u", "video_id": "v", "type": "finish",
         "timestamp": T0},
    ])
    with pytest.raises(InvalidInput, match="missing column.*ts"):
        evaluate(_config(path), eval_trainers())
    path = _write_csv(tmp_path / "extra.csv", [
        {"event_id": "e1", "user_id": "u", "video_id": "v", "type": "finish", "ts": T0,
         "score": 1},
    ])
    with pytest.raises(InvalidInput, match="unknown column.*score"):
        evaluate(_config(path), eval_trainers())


def test_catalog_as_json_lines(positive_log: tuple[Path, Path], tmp_path: Path) -> None:
    from feature_store.event_files import read_videos
    from feature_store.settings import EventLimits

    lines = [{"video_id": "v1", "creator_id": "c", "category": "k", "duration_ms": 1000,
              "tags": ["a", "b"]},
             {"video_id": "v2", "creator_id": "c", "category": "k"}]  # no duration_ms
    path = tmp_path / "videos.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    videos, rejected = read_videos(path, EventLimits(), first_event_ts=T0)
    assert [v.video_id for v in videos] == ["v1"] and videos[0].tags == ("a", "b")
    assert videos[0].uploaded_at == T0 - 86_400_000  # absent: a day before the first event
    assert rejected.count == 2 and "duration_ms" in rejected.examples[0]


def test_parquet_events_read_like_csv(positive_log: tuple[Path, Path], tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from feature_store.event_files import read_events
    from feature_store.settings import EventLimits

    rows = _rows(positive_log[0])
    table = pa.table({
        "event_id": [r["event_id"] for r in rows], "user_id": [r["user_id"] for r in rows],
        "video_id": [r["video_id"] for r in rows], "type": [r["type"] for r in rows],
        "ts": [int(r["ts"]) - (T0 - OLD_T0) for r in rows],
        "watch_ms": [int(r["watch_ms"]) for r in rows],
    })
    path = tmp_path / "events.parquet"
    pq.write_table(table, path)
    found = read_events(path, EventLimits())
    from_csv = read_events(positive_log[0], EventLimits())
    assert [e.event_id for e in found.events] == [e.event_id for e in from_csv.events]
    assert found.shift_ms > 0 and found.events[0].ts >= EventLimits().min_ts_ms
