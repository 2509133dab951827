"""What an operator of ``vidrec up`` sees, over HTTP on a real socket.

The app is built as ``vidrec up --demo`` builds it (the composition root's
embedded trainer and demo traffic) and served by uvicorn on a free port;
every check goes through the routes an operator or a client uses.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.main import create_app
from app.wiring import embedded_extensions
from tests.app.conftest import serve_in_thread, wait_for
from tests.app.test_dashboard import dashboard_settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """``vidrec up --demo`` on a real socket, shared by this module's tests."""
    settings = dashboard_settings(tmp_path_factory.mktemp("up") / "data")
    app = create_app(settings, extensions=embedded_extensions(demo=True))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


def samples(http: httpx.Client) -> dict[str, float]:
    """``/metrics`` as {name{labels}: value}."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def test_metrics_carry_the_embedded_trainers_series(up: httpx.Client) -> None:
    figures = wait_for(
        lambda: (s := samples(up)).get("vidrec_trainer_events_total", 0) > 0
        and "vidrec_trainer_auc" in s and s,
        timeout_s=120, interval_s=0.3,
    )
    for name in ("vidrec_trainer_consumer_lag", "vidrec_trainer_events_per_second",
                 "vidrec_trainer_samples_total", "vidrec_trainer_batch_seconds_count",
                 "vidrec_trainer_baseline_auc", "vidrec_trainer_logloss"):
        assert name in figures, name
    assert 0.0 <= figures["vidrec_trainer_auc"] <= 1.0
    assert figures["vidrec_trainer_batch_seconds_count"] > 0
    # The service's own series are still there, once each.
    assert "vidrec_events_total{result=accepted}" in figures or any(
        k.startswith("vidrec_request_seconds") for k in figures
    )
    body = up.get("/metrics").text
    assert body.count("# TYPE vidrec_trainer_auc gauge") == 1
