"""The dashboard in real headless Chromium, over a live server with demo traffic.

What an operator does: log in, watch the charts fill, export (a new version
appears and becomes active), roll back (the previous version is active and
the API serves it), pause and resume the trainer; and a wrong key is refused.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from feature_store.heads import HEADS

pytestmark = pytest.mark.slow

ADMIN_KEY = "vidrec-dev-key"


def login(page: Any, url: str, key: str = ADMIN_KEY, name: str = "dana") -> None:
    page.goto(f"{url}/dashboard")
    page.fill("#key", key)
    page.fill("#operator", name)
    page.click("#login-submit")


def logged_in(page: Any, url: str) -> Any:
    login(page, url)
    page.wait_for_selector("#main:not([hidden])")
    return page


def confirm_action(page: Any, button: str) -> str:
    """Click an action button, confirm in the dialog, wait for its outcome; the status text."""
    page.click(button)
    page.wait_for_selector("#confirm:not([hidden])")
    page.click("#confirm-ok")
    status = page.locator("#action-status")
    page.wait_for_function(
        "() => /(done|failed|timeout) —/.test(document.getElementById('action-status').textContent)"
    )
    text: str = status.text_content() or ""
    return text


def active_version(page: Any) -> str:
    row = page.locator("#versions-table tr[data-active='true']")
    return str(row.get_attribute("data-version"))


def test_wrong_key_is_refused(page: Any, live_url: str) -> None:
    login(page, live_url, key="not-the-key")
    error = page.locator("#login-error")
    page.wait_for_function("() => document.getElementById('login-error').textContent.length > 0")
    assert "Key refused" in (error.text_content() or "")
    assert page.locator("#main").is_hidden()
    assert page.evaluate("sessionStorage.getItem('vidrec.dashboard.key')") is None


def test_charts_fill_under_traffic(page: Any, live_url: str) -> None:
    logged_in(page, live_url)
    assert "dana" in (page.text_content("#who") or "")
    for chart in ("#chart-auc", "#chart-logloss", "#chart-throughput", "#chart-requests",
                  "#chart-latency"):
        page.wait_for_function(
            "(sel) => Number(document.querySelector(sel).dataset.points || 0) >= 4",
            arg=chart, timeout=60_000,
        )
    assert page.text_content("#kpi-trainer-state") == "running"
    assert page.text_content("#kpi-served-join") not in (None, "", "–")
    # One figure per other ranking head, as the server lists them (feature_store/heads.py).
    for head in HEADS[1:]:
        kpi = page.locator("#kpi-" + head.figures()[0].replace("_", "-"))
        assert kpi.count() == 1, head.name
    assert page.locator("#tables-table tbody tr").count() >= 2
    assert page.locator("#lag-table tbody tr").count() == 4


def test_export_rollback_pause_resume(page: Any, live_url: str) -> None:
    logged_in(page, live_url)
    first = confirm_action(page, "#btn-export")
    assert "export: done" in first, first
    v1 = re.search(r"exported (\S+)", first).group(1)  # type: ignore[union-attr]
    page.wait_for_selector(f"#versions-table tr[data-version='{v1}'][data-active='true']")

    second = confirm_action(page, "#btn-export")
    v2 = re.search(r"exported (\S+)", second).group(1)  # type: ignore[union-attr]
    page.wait_for_selector(f"#versions-table tr[data-version='{v2}'][data-active='true']")
    page.wait_for_function(
        "(v) => document.getElementById('kpi-served-version').textContent === v", arg=v2
    )
    # The exported towers' video index: its kind, size and age on the serving panel.
    page.wait_for_function(
        "() => /^exact, [0-9,]+ videos, [0-9.]+ (s|min|h) old/"
        ".test(document.getElementById('kpi-index').textContent)"
    )

    back = confirm_action(page, "#btn-rollback")
    assert "rollback: done" in back and v1 in back, back
    page.wait_for_selector(f"#versions-table tr[data-version='{v1}'][data-active='true']")
    assert active_version(page) == v1
    served = httpx.post(f"{live_url}/v1/recommend", json={"user_id": "u1", "count": 3}).json()
    assert served["model_version"] == v1

    paused = confirm_action(page, "#btn-pause")
    assert "pause: done" in paused, paused
    page.wait_for_function(
        "() => document.getElementById('trainer-state').dataset.state === 'paused'"
    )
    resumed = confirm_action(page, "#btn-resume")
    assert "resume: done" in resumed, resumed
    page.wait_for_function(
        "() => document.getElementById('trainer-state').dataset.state === 'running'"
    )

    # The page refreshes after each action, so the newest row turns to its outcome.
    page.wait_for_function(
        "() => { const r = document.querySelector('#audit-table tbody tr');"
        " return r && /resume/.test(r.textContent) && /done/.test(r.textContent); }"
    )
    assert page.locator("#audit-table tbody tr").count() >= 5
    newest = page.locator("#audit-table tbody tr").first.text_content() or ""
    assert "dana" in newest


def test_cancelled_confirmation_does_nothing(page: Any, live_url: str) -> None:
    logged_in(page, live_url)
    page.wait_for_selector("#audit-table thead")  # the first poll has rendered the log
    before = page.locator("#audit-table tbody tr").count()
    page.click("#btn-pause")
    page.click("#confirm-cancel")
    page.wait_for_timeout(700)
    assert page.locator("#audit-table tbody tr").count() == before
    assert page.locator("#trainer-state").get_attribute("data-state") != "paused"


def test_viewer_key_sees_but_cannot_act(page: Any, live_url: str) -> None:
    from tests.app.test_dashboard import VIEWER_KEY

    login(page, live_url, key=VIEWER_KEY, name="vic")
    page.wait_for_selector("#main:not([hidden])")
    assert "viewer" in (page.text_content("#who") or "")
    page.wait_for_selector("#versions-table thead")
    for button in ("#btn-export", "#btn-pause", "#btn-rollback", "#btn-retrain"):
        assert page.locator(button).is_hidden()
    assert page.locator("[data-promote]").count() == 0
    refused = page.evaluate(
        """async () => (await fetch('/dashboard/api/actions/pause', {method: 'POST',
            headers: {'X-API-Key': sessionStorage.getItem('vidrec.dashboard.key'),
                      'Content-Type': 'application/json'}, body: '{}'})).status"""
    )
    assert refused == 403


def test_an_experiment_is_started_counted_and_concluded_from_the_page(
    page: Any, live_url: str
) -> None:
    """An A/A experiment (both arms on the live family, the usual first check of a split):
    started from the form, both arms fill with the demo's impressions, concluded."""
    logged_in(page, live_url)
    assert "export: done" in confirm_action(page, "#btn-export")  # the family has a version
    experiment = f"aa-{int(time.time())}"
    page.fill("#experiment-id", experiment)
    page.fill("#experiment-arms", "a=main, b=main")
    started = confirm_action(page, "#btn-experiment-start")
    assert "experiment_start: done" in started, started
    page.wait_for_function(
        """() => [...document.querySelectorAll('#experiment-table tbody tr')]
            .filter((tr) => Number(tr.cells[3].textContent.replace(/,/g, '')) > 0).length === 2""",
        timeout=90_000,
    )
    assert experiment in (page.text_content("#experiment-summary") or "")
    concluded = confirm_action(page, "#experiment-table button[data-conclude='b']")
    assert "experiment_conclude: done" in concluded, concluded
    page.wait_for_function(
        "(id) => document.getElementById('experiment-ended').textContent"
        " .includes(id + 'concluded')",
        arg=experiment,
    )
    assert "b won" in (page.text_content("#experiment-ended") or "")
    assert page.locator("#experiment-table tbody tr").count() == 0


def unmatched_requests(url: str) -> float:
    """Requests the service answered for no route (404s: a favicon the page never named)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith('vidrec_request_seconds_count{route="unmatched"}'):
            return float(line.split()[-1])
    return 0.0


LAYOUT_CHECK = """() => {
  const width = window.innerWidth, out = {page: document.documentElement.scrollWidth <= width};
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    if (r.width < 8 || r.left < 0 || r.right > width) return false;
    const y = r.top + Math.min(10, r.height / 2);
    return [r.left + 4, r.right - 4].every((x) => {
      const hit = document.elementFromPoint(x, y);
      return hit !== null && (hit === el || el.contains(hit));
    });
  };
  const audit = document.getElementById("audit-table");
  audit.scrollIntoView();
  const box = audit.parentElement;
  out.auditScrollsSideways = box.scrollWidth > box.clientWidth;
  out.auditHeads = [...audit.querySelectorAll("thead th")]
    .map((th) => [th.textContent, visible(th)]);
  out.auditCells = [...audit.querySelectorAll("tbody tr:first-child td")].map(visible);
  out.failedRows = [...audit.querySelectorAll("tbody tr")].slice(0, 2)
    .map((tr) => visible(tr.children[3]) && visible(tr.children[4]) && tr.children[3].textContent);
  out.cutTiles = [...document.querySelectorAll(".kpi .value")]
    .filter((v) => v.scrollWidth > v.clientWidth + 1 || v.scrollHeight > v.clientHeight + 1)
    .map((v) => v.id || v.textContent);
  out.clippedLegends = [...document.querySelectorAll("canvas")]
    .filter((c) => c.dataset.legendFits === "false").map((c) => c.id);
  return out;
}"""


def test_at_1400_px_every_audit_column_tile_and_legend_shows(page: Any, live_url: str) -> None:
    """An operator at 1,400 px sees each audit entry's outcome and message (a failed action
    must not look like a done one), every KPI whole, every chart legend, and no 404."""
    before = unmatched_requests(live_url)
    headers = {"X-API-Key": ADMIN_KEY, "X-Operator": "dana"}
    refused = httpx.post(f"{live_url}/dashboard/api/actions/promote",
                         json={"version": "main-nope"}, headers=headers).json()
    assert refused["status"] == "failed"
    experiment = {"id": "newsletter-ranking-2026-q1", "arms": [  # long arguments, no spaces
        {"name": "control", "family": "main"}, {"name": "candidate", "family": "r20990101000000"}]}
    started = httpx.post(f"{live_url}/dashboard/api/actions/experiment_start",
                         json={"experiment": experiment}, headers=headers).json()
    assert started["status"] == "failed"
    page.set_viewport_size({"width": 1400, "height": 1000})
    logged_in(page, live_url)
    for chart in ("#chart-auc", "#chart-logloss", "#chart-heads", "#chart-throughput",
                  "#chart-requests", "#chart-latency"):
        page.wait_for_function(
            "(sel) => Number(document.querySelector(sel).dataset.points || 0) >= 2",
            arg=chart, timeout=60_000,
        )
    page.wait_for_function("() => document.querySelectorAll('#audit-table tbody tr').length")
    layout = page.evaluate(LAYOUT_CHECK)
    assert layout["page"], "the page scrolls sideways at 1,400 px"
    assert not layout["auditScrollsSideways"]
    assert layout["auditHeads"] == [
        ["when", True], ["who", True], ["what", True], ["outcome", True], ["message", True]
    ]
    assert layout["auditCells"] == [True] * 5
    assert layout["failedRows"] == ["failed", "failed"]  # the experiment, the promotion
    assert layout["cutTiles"] == []
    assert layout["clippedLegends"] == []
    newest = page.locator("#audit-table tbody tr").first
    assert "failed" in (newest.locator("td").nth(3).text_content() or "")
    assert "no version of family" in (newest.locator("td").nth(4).text_content() or "")
    assert unmatched_requests(live_url) == before  # no /favicon.ico (nor any unknown path)
