"""The video index: recall against exact search, hidden videos, determinism, persistence."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from app.candidates import ann
from app.candidates.ann import VideoIndex
from app.candidates.ann_rebuild import LiveIndex
from feature_store.errors import Conflict, InvalidInput
from feature_store.settings import AnnSettings, Settings
from tests.factories import clustered_vectors

N = 6000
SETTINGS = AnnSettings(exact_below=1000)
"""Small enough to build in well under a second, large enough to be an IVF index."""


@pytest.fixture(scope="module")
def data() -> tuple[list[str], np.ndarray]:
    return clustered_vectors(N, seed=1)


@pytest.fixture(scope="module")
def queries(data: tuple[list[str], np.ndarray]) -> np.ndarray:
    """Users near what they like: videos' vectors moved by noise of norm about 1."""
    _, vectors = data
    rng = np.random.default_rng(2)
    q = vectors[rng.choice(N, 50)] + rng.standard_normal((50, 32)).astype(np.float32) / 32**0.5
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def built(data: tuple[list[str], np.ndarray]) -> VideoIndex:
    return VideoIndex.build(*data, SETTINGS)


def exact(ids: list[str], vectors: np.ndarray, q: np.ndarray, k: int) -> list[str]:
    scores = vectors @ q
    return [ids[i] for i in np.argsort(-scores, kind="stable")[:k]]


def test_approximate_recall_against_exact_search(data, queries, built) -> None:
    ids, vectors = data
    assert built.kind == "ivf-flat" and built.size == N
    hits = 0
    for q in queries:
        got, scores = built.search(q, 100)
        assert len(got) == 100
        assert np.all(np.diff(scores) <= 0), "best first"
        hits += len(set(got) & set(exact(ids, vectors, q, 100)))
    assert hits / (100 * len(queries)) >= 0.95


def test_below_the_threshold_the_index_is_exact(data, queries) -> None:
    ids, vectors = data
    small = VideoIndex.build(ids[:500], vectors[:500], SETTINGS)
    assert small.kind == "exact"
    for q in queries[:10]:
        got, scores = small.search(q, 20)
        assert got == exact(ids[:500], vectors[:500], q, 20)
        np.testing.assert_allclose(scores, np.sort(vectors[:500] @ q)[::-1][:20], rtol=1e-5)


def test_exclude_and_fewer_than_k(data, queries, built) -> None:
    got, _ = built.search(queries[0], 10)
    again, _ = built.search(queries[0], 10, exclude=set(got[:3]))
    assert not set(got[:3]) & set(again)
    assert again[:7] == got[3:]
    ids, vectors = data
    tiny = VideoIndex.build(ids[:5], vectors[:5], SETTINGS)
    assert sorted(tiny.search(queries[0], 100)[0]) == ids[:5]


def test_two_builds_are_identical_whatever_the_input_order(data, queries, built) -> None:
    ids, vectors = data
    order = np.random.default_rng(3).permutation(N)
    other = VideoIndex.build([ids[i] for i in order], vectors[order], SETTINGS)
    assert other.centroids is not None and built.centroids is not None
    assert np.array_equal(other.centroids, built.centroids)
    for q in queries:
        a_ids, a_scores = built.search(q, 100)
        b_ids, b_scores = other.search(q, 100)
        assert a_ids == b_ids
        assert np.array_equal(a_scores, b_scores)


def hidden_everywhere(index: VideoIndex | LiveIndex, hidden: set[str], queries) -> None:
    """No query returns a hidden video, even when asking for as many as there are videos."""
    for q in queries[:10]:
        got, _ = index.search(q, N)
        assert not hidden & set(got)


def test_removed_videos_never_come_back(data, queries, tmp_path: Path) -> None:
    index = VideoIndex.build(*data, SETTINGS)
    hidden = set(index.search(queries[0], 5)[0]) | {"v0000001"}
    index.upsert(["fresh"], queries[0][None, :])
    hidden.add("fresh")
    assert index.remove(hidden) == len(hidden)
    assert index.remove(hidden) == 0
    assert index.size == N + 1 - len(hidden)
    hidden_everywhere(index, hidden, queries)

    index.save(tmp_path)
    restored = VideoIndex.load(tmp_path, SETTINGS)
    hidden_everywhere(restored, hidden, queries)
    assert restored.search(queries[1], 50)[0] == index.search(queries[1], 50)[0]

    rebuilt = VideoIndex.build(*index.items(), SETTINGS)
    assert rebuilt.size == index.size and not hidden & set(rebuilt.items()[0])
    hidden_everywhere(rebuilt, hidden, queries)


def test_incremental_add_and_update_are_searchable_at_once(data, queries) -> None:
    ids, vectors = data
    index = VideoIndex.build(ids, vectors, SETTINGS)
    q = queries[4]
    index.upsert(["brand-new"], q[None, :])
    got, scores = index.search(q, 5)
    assert got[0] == "brand-new" and scores[0] == pytest.approx(1.0, abs=1e-5)
    # Move an existing video onto the query: it leads, and only once.
    far = exact(ids, vectors, -q, 1)[0]
    index.upsert([far, "brand-new"], np.stack([q, -q]))
    got, _ = index.search(q, 100)
    assert got[0] == far and got.count(far) == 1 and "brand-new" not in got
    assert index.pending == 2 and index.changes == 3
    assert far in index and "nobody" not in index


def test_save_and_load_restore_the_same_index(data, queries, tmp_path: Path) -> None:
    index = VideoIndex.build(*data, SETTINGS, version="r1", built_at=1000.0)
    index.upsert(["x1"], queries[0][None, :])
    index.save(tmp_path)
    index.save(tmp_path)  # a second save replaces the first generation's files
    assert len(list(tmp_path.glob("*.npy"))) == 6
    restored = VideoIndex.load(tmp_path, SETTINGS)
    assert (restored.kind, restored.version, restored.built_at) == ("ivf-flat", "r1", 1000.0)
    assert restored.size == index.size and restored.changes == index.changes
    for q in queries[:10]:
        assert restored.search(q, 100)[0] == index.search(q, 100)[0]
    assert restored.age_s(now=1010.0) == 10.0


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda root: (root / "index.json").unlink(), "index.json"),
        (lambda root: (root / "index.json").write_text("{nope"), "index.json"),
        (lambda root: _edit_header(root, format=99), "index.json.format"),
        (lambda root: _edit_header(root, dim="32"), "index.json.dim"),
        (lambda root: _edit_header(root, built=7), "index.json.built"),
        (lambda root: [p.write_bytes(b"junk") for p in root.glob("vectors-*")], "files.vectors"),
    ],
)
def test_a_damaged_save_is_refused_with_the_field(data, tmp_path: Path, damage, field) -> None:
    ids, vectors = data
    VideoIndex.build(ids[:100], vectors[:100], SETTINGS).save(tmp_path)
    damage(tmp_path)
    with pytest.raises(InvalidInput) as caught:
        VideoIndex.load(tmp_path, SETTINGS)
    assert field in caught.value.field


def _edit_header(root: Path, **changes: object) -> None:
    header = json.loads((root / "index.json").read_text())
    header.update(changes)
    (root / "index.json").write_text(json.dumps(header))


def test_bad_input_is_refused_naming_the_field(data, built) -> None:
    ids, vectors = data
    cases = [
        (
            lambda: VideoIndex.build(ids[:10], vectors[:10, :16], SETTINGS).upsert(
                ["a"], vectors[:1]
            ),
            "vectors",
        ),
        (lambda: built.upsert(["a"], np.ones((1, 16), np.float32)), "vectors"),
        (lambda: built.upsert(["a", "b"], np.full((2, 32), np.nan, np.float32)), "vectors[0]"),
        (lambda: VideoIndex.build(["a", "b"], [[1.0, np.inf], [0.0, 1.0]], SETTINGS), "vectors[0]"),
        (lambda: VideoIndex.build(["a", "a"], np.eye(2), SETTINGS), "ids"),
        (lambda: VideoIndex.build(["a"], np.eye(2), SETTINGS), "ids"),
        (lambda: VideoIndex.build(["a", ""], np.eye(2), SETTINGS), "ids[1]"),
        (lambda: VideoIndex.build(["a"], "text", SETTINGS), "vectors"),
        (lambda: built.search(np.ones(31), 5), "query"),
        (lambda: built.search(np.full(32, np.nan), 5), "query"),
        (lambda: built.search(np.ones(32), 0), "k"),
    ]
    for call, field in cases:
        with pytest.raises(InvalidInput) as caught:
            call()
        assert caught.value.field == field
    assert built.size == N, "a refused change changes nothing"


def test_settings_tree_holds_the_index_section() -> None:
    settings = Settings(ann={"nprobe": 64})
    assert settings.ann.nprobe == 64 and settings.ann.exact_below > 0
    with pytest.raises(ValueError, match="nprob"):
        Settings(ann={"nprob": 64})


# -- the live index: background builds ---------------------------------------------------


def test_live_index_publishes_rebuilds_and_restores(data, queries, tmp_path: Path) -> None:
    ids, vectors = data
    with LiveIndex(SETTINGS, directory=tmp_path) as live:
        nothing, no_scores = live.search(queries[0], 5)
        assert nothing == [] and len(no_scores) == 0
        with pytest.raises(Conflict):
            live.upsert(["a"], vectors[:1])
        assert live.publish(ids, vectors, version="r1")
        assert live.wait(60)
        assert live.status()["kind"] == "ivf-flat" and live.status()["version"] == "r1"
        assert not live.publish(ids, vectors, version="r1"), "the same version is not rebuilt"
        hidden = set(live.search(queries[0], 3)[0])
        live.remove(hidden)
        hidden_everywhere(live, hidden, queries)
        # A new version that still carries the hidden videos does not bring them back.
        assert live.publish(ids, vectors * 1.0, version="r2", wait=True)
        assert live.status()["version"] == "r2" and live.status()["size"] == N - 3
        hidden_everywhere(live, hidden, queries)
        before = live.search(queries[1], 100)
    with LiveIndex(SETTINGS, directory=tmp_path) as restarted:
        assert restarted.status()["version"] == "r2" and restarted.builds == 0
        assert restarted.search(queries[1], 100)[0] == before[0]
        hidden_everywhere(restarted, hidden, queries)


def test_enough_changes_trigger_a_rebuild_that_folds_them_in(data, queries) -> None:
    ids, vectors = data
    live = LiveIndex(AnnSettings(exact_below=1000, rebuild_changed_fraction=0.01))
    live.publish(ids, vectors)
    assert live.wait(60)
    first = live.index
    live.upsert([f"new{i}" for i in range(10)], vectors[:10])  # below 1 %: no rebuild
    assert live.wait(60) and live.index is first and first is not None and first.pending == 10
    live.upsert([f"new{i}" for i in range(10, 70)], vectors[10:70])
    assert live.wait(60)
    assert live.index is not first and live.index is not None
    assert live.index.pending == 0 and live.index.size == N + 70 and live.builds == 2
    assert "new69" in live.index


def test_searches_never_wait_for_a_build_and_changes_during_it_survive(
    data, queries, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, vectors = data
    live = LiveIndex(SETTINGS)
    live.publish(ids, vectors, version="r1")
    assert live.wait(60)
    old = live.index
    release = threading.Event()
    started = threading.Event()
    real_build = VideoIndex.build.__func__  # type: ignore[attr-defined]

    def slow_build(cls, *args, **kwargs):
        started.set()
        assert release.wait(60)
        return real_build(cls, *args, **kwargs)

    monkeypatch.setattr(VideoIndex, "build", classmethod(slow_build))
    live.publish(ids, vectors, version="r2")
    assert started.wait(60) and live.rebuilding
    # The build is stuck: searches are answered by the old index meanwhile.
    got, _ = live.search(queries[0], 10)
    assert len(got) == 10 and live.index is old
    live.upsert(["during"], queries[0][None, :])
    live.remove([got[1]])
    release.set()
    assert live.wait(60)
    assert live.index is not old and live.status()["version"] == "r2"
    after, _ = live.search(queries[0], 10)
    assert after[0] == "during" and got[1] not in after


def test_a_failed_build_keeps_the_previous_index(data, queries, monkeypatch) -> None:
    ids, vectors = data
    live = LiveIndex(SETTINGS)
    live.publish(ids, vectors, version="r1")
    assert live.wait(60)

    def broken(*args, **kwargs):
        raise RuntimeError("faiss said no")

    monkeypatch.setattr(ann.VideoIndex, "build", broken)
    live.publish(ids, vectors, version="r2")
    assert live.wait(60)
    assert live.status()["version"] == "r1" and "faiss said no" in live.status()["last_error"]
    assert len(live.search(queries[0], 10)[0]) == 10


def test_a_damaged_save_is_not_fatal_at_start(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text("{}")
    live = LiveIndex(SETTINGS, directory=tmp_path)
    assert live.index is None and "index.json.format" in live.status()["last_error"]
