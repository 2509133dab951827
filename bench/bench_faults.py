"""Faults: what clients see while Redis or the broker is down, and what survives a kill -9.

    python bench/bench_faults.py [--redis-down-s 15] [--broker-down-s 20] [--runs 3]
                                 [--events 3000] [--only redis,broker,embedded,actions,metrics]
                                 [--doc docs/benchmarks.md | --no-doc]

The scenarios of issue #13, run as an operator would (``tests/faults/harness.py``):
a redis-server with AOF, a Tansu broker on storage that outlives it, and
``vidrec serve`` and ``vidrec train`` as separate processes, under steady
client traffic:

- **redis**: Redis stopped for ``--redis-down-s`` under 20 recommend/s and 5
  event posts/s (10 events each), then started again on its AOF;
- **broker**: ``--runs`` times, ``--events`` events posted (5 posts/s of 50),
  the broker SIGKILLed a third of the way and restarted ``--broker-down-s``
  later; clients resend a batch after a 503's ``Retry-After``;
- **embedded**: ``vidrec up``, 200 videos in 20 upserts and 20 hides, SIGKILL
  right after the last answer, restart;
- **actions**: 100 admin actions waiting at once for a trainer that never
  answers, while ``/healthz`` and ``POST /v1/events`` are timed;
- **metrics**: ``/metrics`` series before and after 1,000 requests to random paths.

Floors, measured in the same run: recommend latency before the Redis outage
(against the degraded answers during it), and ``/healthz`` and event-post
latency with no action pending (against 100 pending). Prints the figures,
the machine and its load average, writes ``bench/results/faults.json`` and
rewrites the ``faults`` block of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402
from bench.run_all import replace_block  # noqa: E402
from tests.faults.harness import KEY, quantile  # noqa: E402
from tests.faults.scenarios import (  # noqa: E402
    broker_figures,
    broker_restarts,
    embedded_kill,
    redis_figures,
    redis_outage,
)

SCENARIOS = ("redis", "broker", "embedded", "actions", "metrics")


def machine() -> str:
    return f"{cpu_model(platform.machine())}, {os.cpu_count()} cores, Python " \
           f"{platform.python_version()}"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def redis_scenario(tmp: Path, down_s: float) -> dict[str, Any]:
    run = redis_outage(tmp, outage_s=down_s)
    figures = redis_figures(run)
    outage = run.outages[0]
    answers = run.loads[0].recommends
    before = [a.seconds for a in answers if a.at < outage.down_at]
    during = [a.seconds for a in answers if a.degraded]
    figures.update(
        normal_p50_ms=ms(quantile(before, 0.5)), normal_p99_ms=ms(quantile(before, 0.99)),
        degraded_p50_ms=ms(quantile(during, 0.5)), degraded_p99_ms=ms(quantile(during, 0.99)),
    )
    return figures


def broker_scenario(tmp: Path, runs: int, events: int, down_s: float) -> dict[str, Any]:
    return broker_figures(broker_restarts(tmp, runs=runs, events=events, outage_s=down_s))


async def _probe(url: str, pending: int, seconds: float | None) -> dict[str, Any]:
    """Time /healthz and event posts (every 20 ms) while ``pending`` actions wait."""
    import httpx

    limits = httpx.Limits(max_connections=pending + 10)
    out: dict[str, Any] = {"health": [], "events": [], "statuses": set()}
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        actions = [
            asyncio.create_task(http.post(
                "/dashboard/api/actions/pause", json={"id": uuid.uuid4().hex}, headers=KEY
            ))
            for _ in range(pending)
        ]
        await asyncio.sleep(1.0 if pending else 0.0)
        deadline = time.monotonic() + (seconds or 0.0)
        n = 0
        while (actions and not all(t.done() for t in actions)) or time.monotonic() < deadline:
            started = time.monotonic()
            health = await http.get("/healthz")
            out["health"].append(time.monotonic() - started)
            event = {"event_id": f"b{uuid.uuid4().hex}", "user_id": f"u{n % 9}", "video_id": "v1",
                     "type": "finish", "ts": int(time.time() * 1000)}
            started = time.monotonic()
            posted = await http.post("/v1/events", json={"events": [event]}, headers=KEY)
            out["events"].append(time.monotonic() - started)
            out["statuses"].update({health.status_code, posted.status_code})
            n += 1
            await asyncio.sleep(0.02)
        out["action_statuses"] = sorted({(await t).json()["status"] for t in actions})
    return out


def actions_scenario(tmp: Path, pending: int = 100) -> dict[str, Any]:
    from app.main import create_app
    from tests.app.conftest import make_settings, serve_in_thread

    settings = make_settings(tmp / "data", dashboard={"ack_timeout_s": 5.0})
    with serve_in_thread(create_app(settings)) as url:
        idle = asyncio.run(_probe(url, 0, seconds=5.0))
        busy = asyncio.run(_probe(url, pending, seconds=None))
    return {
        "pending": pending,
        "action_outcomes": busy["action_statuses"],
        "statuses": sorted(busy["statuses"]),
        "probes": len(busy["health"]),
        "health_p99_ms": ms(quantile(busy["health"], 0.99)),
        "events_p99_ms": ms(quantile(busy["events"], 0.99)),
        "floor_health_p99_ms": ms(quantile(idle["health"], 0.99)),
        "floor_events_p99_ms": ms(quantile(idle["events"], 0.99)),
    }


def metrics_scenario(tmp: Path, requests: int = 1000) -> dict[str, Any]:
    from app.main import create_app
    from tests.app.conftest import TestClient, make_settings

    def series(client: Any) -> int:
        text = client.get("/metrics").text
        return sum(1 for line in text.splitlines() if line and line[0] != "#")

    with TestClient(create_app(make_settings(tmp / "data"))) as client:
        client.get("/no/such/path")
        series(client)
        before = series(client)
        for _ in range(requests):
            client.get(f"/{uuid.uuid4().hex}/{uuid.uuid4().hex}")
        after = series(client)
    return {"random_paths": requests, "series_before": before, "series_after": after}


def table(results: dict[str, Any]) -> str:
    """The markdown table of the docs block."""
    rows: list[tuple[str, str, str]] = []
    r = results.get("redis")
    if r:
        rows += [
            (f"Redis down {r['outage_s']} s, 20 recommend/s + 5 posts/s",
             "recommends / 5xx / over 1 s",
             f"{r['recommends']} / {r['recommend_5xx']} / {r['recommend_over_1s']}"),
            ("", "degraded answers while down (flagged / answered)",
             f"{r['degraded_during']} / {r['answered_during']}"),
            ("", "recommend p50, p99: degraded vs normal before (floor)",
             f"{r['degraded_p50_ms']}, {r['degraded_p99_ms']} ms vs "
             f"{r['normal_p50_ms']}, {r['normal_p99_ms']} ms"),
            ("", "first normal answer after Redis is back", f"{r['normal_after_s']} s"),
            ("", "/healthz not 200 / max", f"{r['health_not_200']} / {r['health_max_ms']:.0f} ms"),
            ("", "event posts 200 / other, max",
             f"{r['posts_200']} / {r['posts'] - r['posts_200']}, {r['post_max_ms']:.0f} ms"),
            ("", "events acknowledged / lost / trained twice",
             f"{r['events_acked']} / {r['acked_lost']} / {r['trained_twice']}"),
        ]
    b = results.get("broker")
    if b:
        rows += [
            (f"broker SIGKILLed {b['restarts']}x for {b['outage_s']} s",
             "events acknowledged / not in topic / not trained / trained twice",
             f"{b['events_acked']} / {b['acked_not_in_topic']} / {b['acked_lost']} / "
             f"{b['trained_twice']}"),
            ("", "per run: acknowledged, lost",
             ", ".join(f"{x['acked']}, {x['lost']}" for x in b["per_run"])),
            ("", "records stored twice (producer retries, resends)", str(b["stored_twice"])),
            ("", "event posts: 503 / over 1 s / max",
             f"{b['posts_503']} / {b['post_over_1s']} / {b['post_max_ms']:.0f} ms"),
            ("", "/healthz not 200; recommend 5xx",
             f"{b['health_not_200']}; {b['recommend_5xx']}"),
        ]
    e = results.get("embedded")
    if e:
        rows += [
            ("embedded `vidrec up`, SIGKILL after writes", "catalog writes acknowledged / present",
             f"{e['writes_acked']} / {e['writes_present']}"),
            ("", "hides acknowledged / still hidden", f"{e['hides_acked']} / {e['hides_present']}"),
        ]
    a = results.get("actions")
    if a:
        rows += [
            (f"{a['pending']} admin actions pending", "/healthz p99 (floor: none pending)",
             f"{a['health_p99_ms']} ms ({a['floor_health_p99_ms']} ms)"),
            ("", "event post p99 (floor: none pending)",
             f"{a['events_p99_ms']} ms ({a['floor_events_p99_ms']} ms)"),
            ("", "statuses seen; action outcomes",
             f"{a['statuses']}; {a['action_outcomes']}"),
        ]
    m = results.get("metrics")
    if m:
        rows.append((f"{m['random_paths']} requests to random paths",
                     "/metrics series before / after",
                     f"{m['series_before']} / {m['series_after']}"))
    lines = ["| scenario | figure | value |", "|---|---|---|"]
    lines += [f"| {s} | {f} | {v} |" for s, f, v in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-down-s", type=float, default=15.0)
    parser.add_argument("--broker-down-s", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    chosen = [s for s in args.only.split(",") if s]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    results: dict[str, Any] = {}
    for name in chosen:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"vidrec-faults-{name}-") as tmp:
            path = Path(tmp)
            if name == "redis":
                results[name] = redis_scenario(path, args.redis_down_s)
            elif name == "broker":
                results[name] = broker_scenario(path, args.runs, args.events, args.broker_down_s)
            elif name == "embedded":
                results[name] = embedded_kill(path)
            elif name == "actions":
                results[name] = actions_scenario(path)
            else:
                results[name] = metrics_scenario(path)
        print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    where = f"{machine()}; load average {load_before} before, {load_average()} after"
    command = "python bench/bench_faults.py" + "".join(
        f" {flag}" for flag in sys.argv[1:] if flag not in ("--no-doc",)
    )
    body = "\n".join([
        f"`{command}` ({started}; {where}):",
        "",
        table(results),
    ])
    print(json.dumps(results, indent=2, default=str))
    print()
    print(body)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "faults.json").write_text(json.dumps(
        {"machine": where, "started": started, "results": results}, indent=2, default=str
    ))
    if not args.no_doc:
        doc_path = Path(args.doc)
        doc, found = replace_block(doc_path.read_text(), "faults", body)
        if not found:
            print("no <!-- bench:faults:begin --> block in the doc; not rewritten", file=sys.stderr)
        else:
            doc_path.write_text(doc)
            print(f"rewrote the faults block of {doc_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
