"""Serving a model family other than the live one (a promoted retrain), on both backends.

A retrain's tables are stood in for here: registered in-process tables on the
embedded backend (what :class:`~trainer.retrain.RetrainManager` does),
tables under the family's ``model_name`` written by another ``Resources`` on
Redis (what a trainer process does). The real retrain flow is driven through
the dashboard in ``test_dashboard.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from feature_store.events import EventContext
from feature_store.runtime.resources import open_resources, table_specs
from feature_store.settings import Settings
from feature_store.sparse import open_table
from feature_store.sparse.base import SparseTable
from tests.app.conftest import TestClient, make_settings, publish_model, service_of, wait_for
from tests.factories import make_video

FAMILY = "r20260101000000"
VIDEOS = [make_video(video_id=f"f{i}", category=f"k{i % 3}") for i in range(12)]
BODY = {"user_id": "u1", "candidates": [v.video_id for v in VIDEOS], "count": 12}


@contextmanager
def family_tables(service: Any, backend: str) -> Iterator[dict[str, SparseTable]]:
    """The retrain family's tables, findable by the service the way a retrain makes them."""
    resources = service.resources
    if backend == "memory":
        sparse = resources.settings.sparse.model_copy(update={"model_name": FAMILY})
        fam = resources.settings.model_copy(update={"sparse": sparse})
        tables = {s.name: open_table(s, fam) for s in table_specs(resources.schema, fam)}
        resources.families.register(FAMILY, tables)
        yield tables
    else:  # another process's trainer: its own client, the family's namespace
        with open_resources(resources.settings, model_name=FAMILY) as other:
            yield other.tables


def scores(client: TestClient) -> tuple[str | None, dict[str, float]]:
    out = client.post("/v1/recommend", json=BODY).json()
    return out["model_version"], {i["video_id"]: i["score"] for i in out["items"]}


def served(service: Any, version: str) -> bool:
    return service.model is not None and service.model.version == version


@pytest.fixture(params=["memory", "redis"])
def app_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "memory":
        return make_settings(tmp_path / "data")
    redis_url = request.getfixturevalue("redis_url")
    return make_settings(
        tmp_path / "data",
        redis={"url": redis_url},
        sparse={"backend": "redis"},
        stores={"backend": "redis"},
        api={"hot_row_cache_ttl_ms": 0},
    )


def test_promoted_family_is_served_from_its_own_tables_and_rolls_back(
    app_settings: Settings,
) -> None:
    backend = app_settings.sparse.backend
    with ExitStack() as stack:
        client = stack.enter_context(TestClient(create_app(app_settings)))
        service = service_of(client)
        service.recommender.rerank = None  # raw model scores: no cold-start cap (no engagement)
        resources = service.resources
        registry, schema = resources.registry, resources.schema
        resources.catalog.upsert(VIDEOS)
        live = publish_model(registry, schema, seed=3)
        wait_for(lambda: served(service, live))
        version, before = scores(client)
        assert version == live

        # A family with no tables anywhere is refused; the live version keeps serving.
        orphan = publish_model(registry, schema, family="r19990101000000", activate=False)
        registry.activate(orphan)
        wait_for(lambda: orphan in service.holder.failed)
        assert "no sparse tables" in service.holder.failed[orphan]
        assert scores(client) == (live, before)
        registry.rollback()

        # The family's trainer writes rows only its tables hold (same dense weights:
        # seed 3), then exports; the operator promotes that version.
        tables = stack.enter_context(family_tables(service, backend))
        stats = resources.activity.video_stats([v.video_id for v in VIDEOS])
        now_ms = int(time.time() * 1000)
        batch = service.scorer.features("u1", now_ms, EventContext(), [], VIDEOS, stats)
        for table, keys in batch.table_keys.items():
            tables[table].pull(keys, train=True)  # admitted: initial (non-zero) weights
        assert not resources.tables["video"].pull(batch.table_keys["video"]).any()
        promoted = publish_model(registry, schema, family=FAMILY, seed=3, activate=False)
        registry.activate(promoted)
        wait_for(lambda: served(service, promoted))
        assert service.model.manifest.family == FAMILY
        version, after = scores(client)
        assert version == promoted
        assert after != before  # the family's rows, not the live ones, were read

        registry.rollback()
        wait_for(lambda: served(service, live))
        assert scores(client) == (live, before)


def test_embedded_promoted_family_still_serves_after_a_restart(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    with TestClient(create_app(settings)) as client:
        service = service_of(client)
        resources = service.resources
        resources.catalog.upsert(VIDEOS)
        publish_model(resources.registry, resources.schema, seed=3)
        with family_tables(service, "memory") as tables:
            stats = resources.activity.video_stats([v.video_id for v in VIDEOS])
            now_ms = int(time.time() * 1000)
            batch = service.scorer.features("u1", now_ms, EventContext(), [], VIDEOS, stats)
            tables["video"].pull(batch.table_keys["video"], train=True)
            promoted = publish_model(resources.registry, resources.schema, family=FAMILY, seed=3)
            wait_for(lambda: served(service, promoted))
            before = scores(client)
    with TestClient(create_app(settings)) as client:  # the family's tables come from disk
        service = service_of(client)
        wait_for(lambda: served(service, promoted))
        assert scores(client) == before
