"""``vidrec up --demo``: the seeded world and the simulated sessions."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.demo import DemoTraffic
from feature_store.sim.world import WorldConfig
from tests.app.conftest import publish_model, service_of, wait_for

SMALL = WorldConfig(users=20, videos=60, creators=5, categories=4, seed=3)


def test_demo_seeds_once_and_sessions_follow_the_recommendations(client: TestClient) -> None:
    service = service_of(client)
    demo = DemoTraffic(service, config=SMALL)
    assert demo.seed_catalog() == 60
    assert demo.seed_catalog() == 0  # a restart keeps the world it has
    version = publish_model(service.resources.registry, service.resources.schema)
    wait_for(lambda: service.model is not None)
    events = [e for _ in range(5) for e in demo.session()]
    assert events and all(e.event_id.startswith(f"demo-{demo.run_id}-") for e in events)
    assert {e.model_version for e in events} == {version}
    assert all(e.recommendation_id for e in events)
    shown = {e.video_id for e in events if e.type == "impression"}
    assert shown <= {f"v{i}" for i in range(60)}
    with service.resources.event_log.consumer("demo-check") as consumer:
        consumer.seek_to_beginning()
        assert len(consumer.poll(10_000, 1.0)) == len(events)
