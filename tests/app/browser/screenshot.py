"""Take ``docs/dashboard.png``: the dashboard after a minute of demo traffic.

    python -m tests.app.browser.screenshot [docs/dashboard.png] [--seconds 60] [--width 1400]

Runs what ``vidrec up --demo`` runs (embedded trainer, demo traffic) on a
free port in a temporary data directory, exports every 15 s so the versions
table has rows, does one rollback and one pause/resume through the page's
API so the audit log has entries, starts a retrain from the log's beginning
and, once it has exported, an experiment of the live family against it,
looks up a user, and screenshots the page
in headless Chromium.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import httpx

from app.main import create_app
from app.wiring import embedded_extensions, embedded_trainer
from tests.app.browser.conftest import CHROMIUM_ARGS, chromium_path
from tests.app.conftest import serve_in_thread, wait_for
from tests.app.test_dashboard import dashboard_settings

ADMIN = {"X-API-Key": "vidrec-dev-key", "X-Operator": "ops-demo"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="docs/dashboard.png")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--width", type=int, default=1400, help="viewport width, CSS px")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from playwright.sync_api import sync_playwright

    data = Path(tempfile.mkdtemp(prefix="vidrec-shot-")) / "data"
    settings = dashboard_settings(
        data,
        trainer={"batch_size": 256, "max_wait_ms": 200, "export_every_s": 15,
                 "metrics_every_s": 1.0, "checkpoint_every_s": 10, "metrics_window": 20_000},
        dashboard={"refresh_ms": 1000, "sample_every_s": 1.0, "rate_window_s": 10},
    )
    app = create_app(
        settings, trainer=embedded_trainer, extensions=embedded_extensions(demo=True)
    )
    with serve_in_thread(app) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": args.width, "height": 1000})
        page.goto(f"{url}/dashboard")
        page.fill("#key", ADMIN["X-API-Key"])
        page.fill("#operator", ADMIN["X-Operator"])
        page.click("#login-submit")
        started = time.monotonic()
        with httpx.Client(base_url=url, headers=ADMIN, timeout=60) as client:
            time.sleep(args.seconds * 0.3)
            retrain = client.post("/dashboard/api/actions/retrain", json={"from_ts_ms": 0})
            family = retrain.json()["result"]["family"]
            wait_for(lambda: family in {
                v["family"] for v in client.get("/dashboard/api/overview").json()["models"]
                .get("versions", [])}, timeout_s=120)
            client.post("/dashboard/api/actions/experiment_start", json={"experiment": {
                "id": "live-vs-retrain", "arms": [{"name": "live", "family": "main"},
                                                   {"name": "retrain", "family": family}]}})
            time.sleep(args.seconds * 0.3)
            client.post("/dashboard/api/actions/pause", json={})
            client.post("/dashboard/api/actions/resume", json={})
            client.post("/dashboard/api/actions/export", json={})
            client.post("/dashboard/api/actions/rollback", json={})
            client.post("/dashboard/api/actions/export", json={})
            time.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
            user = next(
                (f"u{n}" for n in range(100)
                 if client.get(f"/dashboard/api/users/u{n}").json()["history"]),
                "u1",
            )
        page.fill("#user-id", user)
        page.click("#btn-user")
        page.wait_for_selector("#user-recs tbody tr")
        page.wait_for_timeout(1500)
        page.screenshot(path=args.out, full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
