"""Real headless Chromium (Debian's ``chromium``) driven by Playwright, against a live server.

Playwright's own browser downloads are never used: the system Chromium is
launched through ``executable_path``. Without it (or without the
``playwright`` package) these tests skip, saying why; ``scripts/test``
installs Chromium with apt so that CI runs them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from app.wiring import embedded_extensions, embedded_trainer
from tests.app.conftest import serve_in_thread
from tests.app.test_dashboard import dashboard_settings

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """One Chromium for the browser tests. Package-scoped, not session-scoped: the sync
    Playwright API keeps an asyncio loop running in the main thread while it is open,
    and the tests after this package call ``asyncio.run`` there (the async client's)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("no chromium binary (apt-get install chromium; scripts/test does it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install -e '.[test]')")
    profile = tempfile.mkdtemp(prefix="vidrec-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vidrec up --demo, on a real socket: API, embedded trainer, demo traffic."""
    settings = dashboard_settings(
        tmp_path_factory.mktemp("browser") / "data", dashboard={"refresh_ms": 500}
    )
    with serve_in_thread(create_app(
        settings, trainer=embedded_trainer, extensions=embedded_extensions(demo=True)
    )) as url:
        yield url


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        page.close()
