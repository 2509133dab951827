"""``/docs`` and ``/redoc`` in real headless Chromium with the network cut off.

Every request that does not go to the service is aborted (and recorded): the
pages must render the API's operations from what the service itself serves,
as on a machine without internet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from app.main import create_app
from tests.app.conftest import make_settings, serve_in_thread

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def docs_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = make_settings(tmp_path_factory.mktemp("docs") / "data")
    with serve_in_thread(create_app(settings)) as url:
        yield url


@pytest.fixture()
def offline_page(page: Any, docs_url: str) -> Iterator[tuple[Any, list[str]]]:
    """A page whose every request to anywhere but the service is aborted; the list of those."""
    service = urlparse(docs_url).netloc
    outside: list[str] = []

    def only_the_service(route: Any) -> None:
        if urlparse(route.request.url).netloc == service:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_service)
    yield page, outside


def operation_count(docs_url: str) -> int:
    import httpx

    document = httpx.get(f"{docs_url}/openapi.json").json()
    return sum(len(item) for item in document["paths"].values())


def test_swagger_ui_renders_every_operation_offline(
    offline_page: tuple[Any, list[str]], docs_url: str
) -> None:
    page, outside = offline_page
    page.goto(f"{docs_url}/docs")
    page.wait_for_selector(".opblock-summary-path")
    paths = page.locator(".opblock-summary-path").all_text_contents()
    assert len(paths) == operation_count(docs_url)
    assert {"/v1/recommend", "/v1/events", "/v1/videos"} <= {p.strip() for p in paths}
    # An operation opens with an example body built from the Event component.
    events = "#operations-events-post_events_v1_events_post"
    page.click(f"{events} .opblock-summary")
    page.wait_for_selector(f"{events} .body-param__example")
    example = page.text_content(f"{events} .body-param__example") or ""
    assert '"event_id"' in example and '"watch_ms"' in example
    assert "Authorize" in (page.text_content(".auth-wrapper") or "")
    assert outside == []


def test_redoc_renders_offline(offline_page: tuple[Any, list[str]], docs_url: str) -> None:
    page, outside = offline_page
    page.goto(f"{docs_url}/redoc")
    page.wait_for_selector("h2:has-text('Recommend')", timeout=60_000)
    for operation in ("Post Events", "Put Videos", "Get Video"):
        assert page.locator("h2", has_text=operation).count() == 1, operation
    assert outside == []  # its "by Redocly" logo is blocked by the page's CSP

