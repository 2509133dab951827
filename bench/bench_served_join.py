"""The served-log join in the Kafka + Redis topology, at a stated load, across trainer restarts.

    python bench/bench_served_join.py [--recommend-per-s 20] [--posts-per-s 5]
                                      [--seconds 120] [--doc docs/benchmarks.md | --no-doc]

As an operator runs it (``tests/production/stack.py``): a redis-server with
AOF, Tansu on durable storage (an S3-compatible store), 8 partitions,
``vidrec serve`` and ``vidrec train`` as separate processes. A client
(``tests/production/traffic.py``) asks for ``--recommend-per-s``
recommendations and, for each response a model ranked, posts an impression
of each of its top five items naming the response and a play of the first,
``--posts-per-s`` batches a second. A third of the way the trainer is
stopped (SIGTERM) and started again; two thirds of the way it is SIGKILLed
and started again. Once every acknowledged event is trained, prints the
join's outcomes (``trainer/served.py``) as the trainer counted them, the
service's served-log writer outcomes, and how long batches waited for the
served log; writes ``bench/results/served_join.json`` and the
``served-join`` block of ``docs/benchmarks.md``.

The join rate is a share of the impressions the trainer counted (a SIGKILL
rolls the counts back to its last checkpoint, and the events it had
already pushed are not counted again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402
from bench.run_all import replace_block  # noqa: E402
from tests.production.stack import (  # noqa: E402
    Production,
    counter_values,
    plays,
    post,
    production_env,
    seed_catalog,
    wait_until,
)
from tests.production.traffic import NamingClient  # noqa: E402
from tests.services import RedisServer, S3Store, TansuBroker  # noqa: E402

OUTCOMES = ("joined", "missing", "late", "unknown", "other_schema")


def machine() -> str:
    return f"{cpu_model(platform.machine())}, {os.cpu_count()} cores, Python " \
           f"{platform.python_version()}"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _ranked(url: str) -> bool:
    body = httpx.post(f"{url}/v1/recommend", json={"user_id": "pu1", "count": 5}, timeout=30).json()
    return body["model_version"] is not None


def run(tmp: Path, recommend_per_s: float, posts_per_s: float, seconds: float) -> dict[str, Any]:
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(extra_args=("--appendonly", "yes")))
        store = stack.enter_context(S3Store())
        broker = stack.enter_context(TansuBroker(storage=store))
        prod = Production(tmp, production_env(redis.url, broker.bootstrap))
        stack.callback(prod.close)
        prod.start_serve()
        videos = seed_catalog(prod.url, 200)
        trainer = prod.trainer("trainer").start()
        with httpx.Client(base_url=prod.url, timeout=30) as client:
            post(client, plays(200, videos, 2000, "warm"))
        wait_until(lambda: _ranked(prod.url), 300, "a model-ranked recommendation")

        traffic = NamingClient(prod.url, recommend_per_s, posts_per_s).start()
        started = time.monotonic()
        time.sleep(seconds / 3)
        graceful_exit = trainer.stop()
        trainer.start()
        time.sleep(max(0.0, started + 2 * seconds / 3 - time.monotonic()))
        trainer.kill()
        trainer.start()
        time.sleep(max(0.0, started + seconds - time.monotonic()))
        traffic.stop()
        ran_s = time.monotonic() - started
        acked = set(traffic.acked)
        drained_at = time.monotonic()
        wait_until(lambda: acked <= set(trainer.trained()), 900, "every event trained", 1.0)
        drain_s = time.monotonic() - drained_at
        status = wait_until(lambda: prod.status().get("served") and prod.status(), 60, "status")
        service = httpx.get(f"{prod.url}/metrics", timeout=30).text
        exposed = counter_values(trainer.metrics(), "vidrec_trainer_served_join_total")
    served = status["served"]
    counted = sum(served[k] for k in OUTCOMES)
    written = counter_values(service, "vidrec_served_log_records_total")
    return {
        "recommend_per_s": recommend_per_s,
        "posts_per_s": posts_per_s,
        "seconds": round(ran_s, 1),
        "ranked_responses": traffic.ranked,
        "unranked_responses": traffic.unranked,
        "impressions_named": traffic.named,
        "events_acked": len(acked),
        "counted": counted,
        **{k: served[k] for k in OUTCOMES},
        "join_rate": round(served["joined"] / counted, 4) if counted else None,
        "waited_s": served["waited_s"],
        "served_log_records": dict(written),
        "graceful_exit": graceful_exit,
        "drain_s": round(drain_s, 1),
        "metrics_since_last_start": dict(exposed),
        "client_errors": traffic.errors[:5],
    }


def table(r: dict[str, Any]) -> str:
    rows = [
        ("load", f"{r['recommend_per_s']:g} recommend/s, {r['posts_per_s']:g} posts/s, "
                 f"{r['seconds']} s, trainer SIGTERMed and restarted at 1/3, SIGKILLed and "
                 f"restarted at 2/3"),
        ("responses ranked by a model / not (no model)",
         f"{r['ranked_responses']} / {r['unranked_responses']}"),
        ("impressions naming them (acknowledged)", str(r["impressions_named"])),
        ("counted by the trainer", str(r["counted"])),
        ("joined / missing / late / unknown / other schema",
         " / ".join(str(r[k]) for k in OUTCOMES)),
        ("**join rate**", f"**{100 * (r['join_rate'] or 0):.2f}%**"),
        ("batches' wait for the served log, in all", f"{r['waited_s']} s"),
        ("service's served-log records", json.dumps(r["served_log_records"])),
        ("trainer drained the stream after the load in", f"{r['drain_s']} s"),
    ]
    lines = ["| figure | value |", "|---|---|"]
    return "\n".join(lines + [f"| {f} | {v} |" for f, v in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recommend-per-s", type=float, default=20.0)
    parser.add_argument("--posts-per-s", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="vidrec-served-join-") as tmp:
        result = run(Path(tmp), args.recommend_per_s, args.posts_per_s, args.seconds)
    where = f"{machine()}; load average {load_before} before, {load_average()} after"
    command = "python bench/bench_served_join.py" + "".join(
        f" {flag}" for flag in sys.argv[1:] if flag != "--no-doc"
    )
    body = "\n".join([f"`{command}` ({started}; {where}):", "", table(result)])
    print(json.dumps(result, indent=2))
    print()
    print(body)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "served_join.json").write_text(
        json.dumps({"machine": where, "started": started, "result": result}, indent=2)
    )
    if not args.no_doc:
        doc_path = Path(args.doc)
        doc, found = replace_block(doc_path.read_text(), "served-join", body)
        if not found:
            print("no <!-- bench:served-join:begin --> block in the doc; not rewritten",
                  file=sys.stderr)
        else:
            doc_path.write_text(doc)
            print(f"rewrote the served-join block of {doc_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
