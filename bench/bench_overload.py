"""Overload: one process's sustainable recommend rate, then 3x that rate, over real sockets.

    python bench/bench_overload.py [--seconds 60] [--factor 3] [--candidates 500]
                                   [--server-tree DIR] [--pin] [--collections]

1. Prepares the serving benchmark's data (``bench_serving.prepare``: 5,000
   synthetic videos, 50,000 events, an exported WideDeep model with towers)
   and starts ``vidrec serve`` on it (one uvicorn worker, memory backends,
   the default shedding settings).
2. **Quiet floor**: recommends one at a time (500 given candidates): p50, p99.
3. **Sustainable rate**: closed loop, 4 client connections each waiting for
   its answer, for 10 s: the recommends/s the process completes, none shed.
4. **Overload**: an open-loop load generator (requests sent on a fixed
   schedule whatever the answers, over up to 256 keep-alive connections,
   latencies taken from each request's scheduled time, so a slow server is
   not excused by a client that waited) sends ``--factor`` x the sustainable
   rate of recommends, plus one single-event ``POST /v1/events`` per four
   recommends, for ``--seconds``. Each answer is classed: *normal* (200),
   *deadline* (200, ``fallback_reason: "deadline"``), *refused* (503
   ``Overloaded``), other. Meanwhile a prober in its own process opens a new
   connection every 100 ms for ``GET /healthz``, as a kubelet does, with the
   manifests' 2 s timeout.
5. **Recovery**: once every request sent has its answer, one recommend every
   50 ms until one is answered normally within 2x the quiet p99 (at least
   20 ms): the seconds from the end of the schedule to it (the answers still
   owed then, a server's queue, included).

Goals (issue #22): 0 liveness failures and liveness within 100 ms; every
admitted recommend within its deadline (``api.recommend_deadline_ms``, 250
ms); every refusal within 50 ms; normal within 2 s of the load's end.
Client and server share the machine's cores, so every latency includes the
client's own scheduling; the machine and its load average are printed, and
so is the client's own share: the requests it began more than 10 ms after
their scheduled time (its task ran late: no core for the client) among the
tails, and its event loop's lag (how late a 2 ms sleep wakes; a late client
also reads its answers late, which no count here separates).
``--server-tree`` runs the server from another checkout (the code before a
change) on the same data. ``--event-log kafka`` has the events acknowledged
by a Kafka-protocol broker (Tansu) on the same machine instead of the
in-process log: posts the broker did not acknowledge within
``kafka.produce_timeout_ms`` (or the request's deadline) are counted apart.
``--pin`` puts the server on the first core and the client and the prober
on the others (``sched_setaffinity``), as if the load came from
another machine: the server's tails are then its own, not the client's
scheduling (the sustainable rate is measured pinned too, so the load is 3x
what one core serves).
``--collections`` has the server log each full (generation 2) garbage
collection: when, how long, and how many objects it walked (a
``sitecustomize`` the bench writes and puts on the server's ``PYTHONPATH``;
nothing in the product): a full collection holds the GIL for its whole
length, so it shows as a burst of late answers.
Results: ``bench/results/overload.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_serving import (  # noqa: E402
    DISTINCT_REQUESTS,
    RECOMMENDED,
    Server,
    _client,
    bench_settings,
    encode_recommend,
    make_requests,
    prepare,
)
from bench.machine import cpu_model  # noqa: E402

DEADLINE_MS = 250.0
"""The default ``api.recommend_deadline_ms`` the server runs with."""
REFUSAL_GOAL_MS = 50.0
LIVENESS_GOAL_MS = 100.0
LIVENESS_TIMEOUT_S = 2.0
"""The manifests' ``livenessProbe.timeoutSeconds``."""
MAX_CONNECTIONS = 256
CLIENT_LATE_MS = 10.0
"""A request the client began this much after its scheduled time was delayed by the
client (it had no core), not by the server: counted apart."""


def machine() -> str:
    cpu = cpu_model(platform.machine())
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def percentiles(ms: list[float]) -> dict[str, float | int]:
    if not ms:
        return {"count": 0}
    arr = np.asarray(ms)
    return {
        "count": len(ms),
        "p50_ms": round(float(np.percentile(arr, 50)), 2),
        "p99_ms": round(float(np.percentile(arr, 99)), 2),
        "max_ms": round(float(arr.max()), 2),
    }


# --- the server's full collections (--collections) ---------------------------------------

COLLECTIONS_PROBE = '''"""From bench/bench_overload.py --collections: log each full collection."""
import gc
import os
import time

_path = os.environ.get("VIDREC_BENCH_GC_LOG")  # the bench's server only, not its pools
if _path:
    _log = open(_path, "a", buffering=1)
    _began = [0.0]

    def _collection(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            _began[0] = time.monotonic()
            return
        ended = time.monotonic()
        walked = len(gc.get_objects(2)) + len(gc.get_objects(1)) + len(gc.get_objects(0))
        _log.write(f"{os.getpid()} {ended:.6f} {(ended - _began[0]) * 1000:.2f} {walked}\\n")

    gc.callbacks.append(_collection)
'''


def probe_collections(env: dict[str, str]) -> Path:
    """Put :data:`COLLECTIONS_PROBE` on the server's path (``env``); its log file."""
    directory = Path(tempfile.mkdtemp(prefix="vidrec-bench-gc-"))
    (directory / "sitecustomize.py").write_text(COLLECTIONS_PROBE)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["VIDREC_BENCH_GC_LOG"] = str(directory / "collections.log")
    return directory / "collections.log"


def collections_during(log: Path, window: tuple[float, float]) -> dict[str, Any]:
    """The server's full collections whose end fell in ``window`` (``time.monotonic()``)."""
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    inside = [(float(ms), int(walked)) for _, ended, ms, walked in rows
              if window[0] <= float(ended) <= window[1]]
    return {"count": len(inside), "ms": [round(ms, 1) for ms, _ in inside],
            "tracked_after": [walked for _, walked in inside]}


# --- the open-loop generator -------------------------------------------------------------


class _Connections:
    """Keep-alive connections to the server, opened on demand, at most ``limit``."""

    def __init__(self, port: int, limit: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(limit)

    async def take(self) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], bool]:
        """A connection, and whether it was reused (the server may have closed it idle)."""
        await self.slots.acquire()
        if self.idle:
            return self.idle.pop(), True
        return await self.fresh(), False

    async def fresh(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    def give_back(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        if conn is not None:
            self.idle.append(conn)
        self.slots.release()


async def _exchange(
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], payload: bytes
) -> tuple[int, bytes]:
    reader, writer = conn
    writer.write(payload)
    status = int((await reader.readline()).split(b" ", 2)[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


def classify(kind: str, status: int, body: bytes) -> str:
    if status == 503 and b"Overloaded" in body:
        return "refused"
    if status == 503 and b"EventLogUnavailable" in body:
        return "unacknowledged"  # the broker did not acknowledge in time
    if status == 200 and kind == "recommend":
        return "deadline" if b'"fallback_reason":"deadline"' in body else "normal"
    return "normal" if status == 200 else f"status_{status}"


Result = tuple[str, str, float, float]
"""(kind, class, latency ms from the scheduled time, ms the client itself started it late)."""


async def _lag_monitor(lags: list[float], period_s: float = 0.002) -> None:
    """The client's own loop lag: how late a ``period_s`` sleep wakes, ms (the client
    shares the cores: a late wake-up delays its sends and its reads alike)."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(period_s)
        lags.append((time.monotonic() - t - period_s) * 1000)


async def _open_loop(
    port: int, schedule: list[tuple[float, str, bytes]], limit: int, lags: list[float]
) -> list[Result]:
    """Send each ``(offset_s, kind, payload)`` at its offset; a :data:`Result` each.

    Times are ``time.monotonic()`` (uvloop's ``loop.time()`` is cached per
    iteration, in ms). A request's latency runs from its scheduled time; apart,
    how late the client itself began it (its task ran late: the client had no
    core), before it waited for a connection or the server."""
    conns = _Connections(port, limit)
    results: list[Result] = []
    monitor = asyncio.create_task(_lag_monitor(lags))

    async def one(intended: float, kind: str, payload: bytes) -> None:
        conn = None
        late_ms = (time.monotonic() - intended) * 1000
        try:
            conn, reused = await conns.take()
            try:
                status, body = await _exchange(conn, payload)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                if not reused:
                    raise
                # A keep-alive connection the server closed while idle (uvicorn: 5 s), as
                # an HTTP client meets it: send again on a new one.
                conn[1].close()
                conn = await conns.fresh()
                status, body = await _exchange(conn, payload)
            latency_ms = (time.monotonic() - intended) * 1000
            results.append((kind, classify(kind, status, body), latency_ms, late_ms))
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            if conn is not None:
                conn[1].close()
                conn = None
            results.append((kind, "error", (time.monotonic() - intended) * 1000, late_ms))
        finally:
            conns.give_back(conn)

    start = time.monotonic() + 0.05
    tasks = []
    for offset, kind, payload in schedule:
        delay = start + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(start + offset, kind, payload)))
    await asyncio.gather(*tasks)
    monitor.cancel()
    for _, writer in conns.idle:
        writer.close()
    return results


def open_loop(
    port: int, schedule: list[tuple[float, str, bytes]], lags: list[float]
) -> list[Result]:
    """:func:`_open_loop` with the client's garbage collector off: its schedule and
    results are tens of thousands of objects, and a full collection of them stalled the
    client's loop for up to 300 ms, which the tails counted as the server's."""
    gc.collect()
    gc.disable()
    try:
        import uvloop

        return uvloop.run(_open_loop(port, schedule, MAX_CONNECTIONS, lags))
    except ImportError:
        return asyncio.run(_open_loop(port, schedule, MAX_CONNECTIONS, lags))
    finally:
        gc.enable()


# --- liveness, as a kubelet probes it ----------------------------------------------------


def _probe_liveness(port: int, stop_at: float, out: Any) -> None:
    """A new connection every 100 ms for GET /healthz (2 s timeout); puts (ok, ms)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    got: list[tuple[bool, float]] = []
    while time.time() < stop_at:
        t0 = time.perf_counter()
        ok = False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=LIVENESS_TIMEOUT_S) as s:
                s.sendall(request)
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
                ok = data.startswith(b"HTTP/1.1 200")
        except OSError:
            ok = False
        elapsed = time.perf_counter() - t0
        got.append((ok and elapsed <= LIVENESS_TIMEOUT_S, elapsed * 1000))
        time.sleep(max(0.0, 0.1 - elapsed))
    out.put(got)


# --- phases --------------------------------------------------------------------------------


def sustainable_rate(port: int, requests: list[bytes], seconds: float) -> dict[str, Any]:
    """Closed loop, 4 connections for ``seconds``: recommends/s completed, none shed."""
    ctx = multiprocessing.get_context("spawn")
    per_client = max(50, int(seconds * 120))  # about `seconds` at 480 req/s, 4 clients
    jobs = [(port, requests, k * per_client, per_client, RECOMMENDED) for k in range(4)]
    with ctx.Pool(4) as pool:
        results = pool.map(_client, jobs)
    done = sum(len(r[0]) for r in results)
    errors = sum(r[1] for r in results)
    span = max(r[3] for r in results) - min(r[2] for r in results)
    latencies = [ms for r in results for ms in r[0]]
    return {"requests_per_s": round(done / span, 1), "requests": done, "errors": errors,
            "seconds": round(span, 1), **percentiles(latencies)}


def schedule_for(rate: float, seconds: float, recommends: list[bytes],
                 posts: list[bytes]) -> list[tuple[float, str, bytes]]:
    """Recommends at ``rate``/s and one event post per four recommends, evenly spaced."""
    out: list[tuple[float, str, bytes]] = []
    n = int(rate * seconds)
    for i in range(n):
        out.append((i / rate, "recommend", recommends[i % len(recommends)]))
        if i % 4 == 3:
            out.append(((i + 0.5) / rate, "events", posts[(i // 4) % len(posts)]))
    return out


def event_posts(count: int) -> list[bytes]:
    now = int(time.time() * 1000)
    out = []
    for i in range(count):
        body = json.dumps({"events": [{
            "event_id": f"overload-{now}-{i}", "user_id": f"u{i % 2000}",
            "video_id": f"v{i % 5000}", "type": "play", "ts": now, "watch_ms": 5000,
        }]}).encode()
        out.append(
            b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"X-API-Key: vidrec-dev-key\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
    return out


def overload(port: int, rate: float, seconds: float, recommends: list[bytes]) -> dict[str, Any]:
    schedule = schedule_for(rate, seconds, recommends, event_posts(int(rate * seconds / 4) + 1))
    ctx = multiprocessing.get_context("spawn")
    probes = ctx.Queue()
    prober = ctx.Process(target=_probe_liveness, args=(port, time.time() + seconds + 1, probes))
    prober.start()
    started, window_start = time.perf_counter(), time.monotonic()
    lags: list[float] = []
    results = open_loop(port, schedule, lags)
    load_s = time.perf_counter() - started
    liveness = probes.get(timeout=seconds + 60)
    prober.join()
    out: dict[str, Any] = {"offered_recommends_per_s": round(rate, 1), "seconds": seconds,
                           "wall_s": round(load_s, 1),
                           "window_monotonic": [window_start, window_start + load_s]}
    for kind in ("recommend", "events"):
        mine = [r for r in results if r[0] == kind]
        classes: dict[str, list[float]] = {}
        for _, cls, ms, _ in mine:
            classes.setdefault(cls, []).append(ms)
        out[kind] = {cls: percentiles(ms) for cls, ms in sorted(classes.items())}
        out[kind]["sent"] = len(mine)
    recommends = out["recommend"]
    admitted = [r for r in results if r[0] == "recommend" and r[1] in ("normal", "deadline")]
    refused = [r for r in results if r[1] == "refused"]
    over = [r for r in admitted if r[2] > DEADLINE_MS]
    slow = [r for r in refused if r[2] > REFUSAL_GOAL_MS]
    out["admitted_recommends"] = len(admitted)
    out["admitted_over_deadline"] = len(over)
    out["refusals"] = len(refused)
    out["refusals_over_50ms"] = len(slow)
    # The client's share: tails of requests the client itself began late, and its loop lag.
    out["client_late_over_deadline"] = sum(r[3] > CLIENT_LATE_MS for r in over)
    out["client_late_refusals_over_50ms"] = sum(r[3] > CLIENT_LATE_MS for r in slow)
    out["client_began_late"] = sum(r[3] > CLIENT_LATE_MS for r in results)
    out["client_loop_lag"] = {"over_10ms": sum(lag > 10 for lag in lags), **percentiles(lags)}
    # Over the time the answers took: a server that queues answers them long after.
    out["normal_recommends_per_s"] = round(
        recommends.get("normal", {}).get("count", 0) / max(seconds, load_s), 1
    )
    ms = [m for _, m in liveness]
    out["liveness"] = {
        "probes": len(liveness),
        "failures": sum(not ok for ok, _ in liveness),
        "over_100ms": sum(m > LIVENESS_GOAL_MS for m in ms),
        **percentiles(ms),
    }
    return out


def recovery(port: int, request: bytes, normal_ms: float, limit_s: float = 30) -> float | None:
    """Seconds until a recommend is answered normally within ``normal_ms`` (None: never)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        t0 = time.perf_counter()
        latencies, errors, _, _ = _client((port, [request], 0, 1, RECOMMENDED))
        if not errors and latencies[0] <= normal_ms:
            return round(t0 - started, 3)
        time.sleep(0.05)
    return None


def pin_apart(server_pid: int) -> dict[str, list[int]]:
    """The server process on the first core this process may use, this process (and what
    it starts next: the pools, the prober, the broker) on the others."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least 2 cores")
    split = {"server": cores[:1], "client": cores[1:]}
    pin_threads(server_pid, split["server"])
    os.sched_setaffinity(0, split["client"])
    return split


def pin_threads(pid: int, cores: list[int]) -> None:
    """Every thread ``pid`` has now on ``cores`` (threads it starts later inherit them)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cores)


def run(seconds: float, factor: float, candidates: int, server_tree: Path | None = None,
        event_log: str = "memory", pin: bool = False, collections: bool = False
        ) -> dict[str, Any]:
    from tests.services import TansuBroker, free_port

    data_dir = Path(tempfile.mkdtemp(prefix="vidrec-bench-overload-"))
    settings = bench_settings(data_dir, "memory", None)
    requests = make_requests(DISTINCT_REQUESTS, candidates)
    load_before = os.getloadavg()
    version = prepare(settings, requests)
    print(f"prepared {data_dir}; model {version}", flush=True)
    bodies = [json.dumps(b).encode() for b in requests]
    encoded = encode_recommend(bodies)
    env = {"VIDREC_API__SIGNAL_FEED": "false"}
    broker = TansuBroker() if event_log == "kafka" else None
    if broker is not None:  # events acknowledged by a Kafka-protocol broker on this machine
        broker.start()
        env |= {"VIDREC_EVENT_LOG__BACKEND": "kafka",
                "VIDREC_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
                "VIDREC_EXPERIMENTS__METRICS_FEED": "false"}
    gc_log = probe_collections(env) if collections else None
    server = Server(data_dir, free_port(), env, cwd=server_tree or ROOT)
    results: dict[str, Any] = {}
    own_cores = os.sched_getaffinity(0)
    cores = pin_apart(server.process.pid) if pin else None
    try:
        server.wait_ready()
        if cores:  # threads started before the first call inherited the whole machine
            pin_threads(server.process.pid, cores["server"])
        _client((server.port, encoded, 0, 300, RECOMMENDED))  # warm
        quiet, _, _, _ = _client((server.port, encoded, 0, 500, RECOMMENDED))
        results["quiet"] = percentiles(quiet)
        results["sustainable"] = sustainable_rate(server.port, encoded, 10)
        rate = results["sustainable"]["requests_per_s"] * factor
        print(f"sustainable {results['sustainable']['requests_per_s']} req/s; "
              f"offering {rate:.0f} req/s for {seconds} s", flush=True)
        results["overload"] = overload(server.port, rate, seconds, encoded)
        normal_ms = max(20.0, 2 * results["quiet"]["p99_ms"])
        probed = recovery(server.port, encoded[0], normal_ms)
        # From the end of the schedule: the answers still owed then (a queue) come first.
        owed_s = max(0.0, results["overload"]["wall_s"] - seconds)
        results["recovery_s"] = None if probed is None else round(owed_s + probed, 2)
        results["recovery_normal_ms"] = normal_ms
    finally:
        server.stop()
        if broker is not None:
            broker.kill()
        os.sched_setaffinity(0, own_cores)  # `vidrec bench all` goes on in this process
    if gc_log is not None and "overload" in results:
        window = results["overload"]["window_monotonic"]
        results["overload"]["collections"] = collections_during(gc_log, (window[0], window[1]))
    results["meta"] = {
        "machine": machine(),
        "factor": factor,
        "candidates": candidates,
        "event_log": event_log,
        "cores": cores,
        "deadline_ms": DEADLINE_MS,
        "server_tree": str(server_tree or ROOT),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    return results


def late(o: dict[str, Any], key: str) -> str:
    """ ``(n of them began late in the client)``, where the results have the count."""
    return f" ({o[key]} of them began > 10 ms late in the client)" if key in o else ""


def table(r: dict[str, Any]) -> str:
    o, m = r["overload"], r["meta"]
    rec, ev, live = o["recommend"], o["events"], o["liveness"]

    def cls(group: dict[str, Any], name: str) -> str:
        c = group.get(name)
        if not c or not c.get("count"):
            return "0"
        return f"{c['count']} (p50 {c['p50_ms']}, p99 {c['p99_ms']}, max {c['max_ms']} ms)"

    share = o["normal_recommends_per_s"] / max(1e-9, r["sustainable"]["requests_per_s"])
    rows = [
        ("quiet recommend, one at a time (floor)",
         f"p50 {r['quiet']['p50_ms']} ms, p99 {r['quiet']['p99_ms']} ms"),
        ("sustainable rate (closed loop, 4 connections, none shed)",
         f"{r['sustainable']['requests_per_s']} recommends/s "
         f"(p99 {r['sustainable']['p99_ms']} ms)"),
        (f"offered: {m['factor']}x for {o['seconds']} s",
         f"{o['offered_recommends_per_s']} recommends/s + 1 event post per 4"),
        ("recommends answered normally", cls(rec, "normal")),
        ("recommends past their deadline, answered degraded", cls(rec, "deadline")),
        ("recommends refused (503 Overloaded)", cls(rec, "refused")),
        ("other answers or errors",
         str(sum(v["count"] for k, v in rec.items() if k not in ("normal", "deadline",
             "refused", "sent") and isinstance(v, dict)))),
        (f"admitted recommends over the {m['deadline_ms']:.0f} ms deadline",
         f"{o['admitted_over_deadline']} of {o['admitted_recommends']}"
         f"{late(o, 'client_late_over_deadline')}"),
        ("refusals over 50 ms",
         f"{o['refusals_over_50ms']} of {o['refusals']}"
         f"{late(o, 'client_late_refusals_over_50ms')}"),
        ("normal answers per second, until the last answer (vs sustainable)",
         f"{o['normal_recommends_per_s']} ({share:.2f}x)"),
        ("event posts: accepted", cls(ev, "normal")),
        ("event posts: refused (503 Overloaded)", cls(ev, "refused")),
        ("event posts: not acknowledged in time (503)", cls(ev, "unacknowledged")),
        ("liveness probes: failures / over 100 ms",
         f"{live['failures']} / {live['over_100ms']} of {live['probes']} "
         f"(p50 {live.get('p50_ms')}, p99 {live.get('p99_ms')}, max {live.get('max_ms')} ms)"),
        ("the client's own delays: requests it began > 10 ms late; its loop's lag",
         f"{o.get('client_began_late', '-')} of {o['recommend']['sent'] + o['events']['sent']};"
         f" lag p99 {o.get('client_loop_lag', {}).get('p99_ms')}, max "
         f"{o.get('client_loop_lag', {}).get('max_ms')} ms"),
        *([("the server's full collections during the load: count; ms each; tracked objects "
            "after each", f"{o['collections']['count']}; {o['collections']['ms']}; "
            f"{o['collections']['tracked_after']}")] if "collections" in o else []),
        ("last answer after the schedule ended", f"{o['wall_s'] - o['seconds']:.1f} s"),
        ("back to normal after the load stopped",
         f"{r['recovery_s']} s (the answers owed, then a recommend within "
         f"{r['recovery_normal_ms']:.0f} ms)"),
    ]
    flag = (" --event-log kafka" if m["event_log"] == "kafka" else "") + (
        " --pin" if m.get("cores") else "") + (" --collections" if "collections" in o else "")
    head = (f"`python bench/bench_overload.py --seconds {o['seconds']:g} --factor {m['factor']:g}"
            f"{flag}` "
            f"({m['date_utc']} UTC; {m['machine']}; load average {m['load_average_before']} "
            f"before, {m['load_average_after']} after):\n\n| figure | value |\n|---|---|\n")
    return head + "\n".join(f"| {a} | {b} |" for a, b in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--factor", type=float, default=3)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--server-tree", type=Path, default=None,
                        help="run the server from another checkout (the code before a change)")
    parser.add_argument("--event-log", choices=["memory", "kafka"], default="memory",
                        help="kafka: events acknowledged by a Kafka-protocol broker (Tansu)")
    parser.add_argument("--pin", action="store_true",
                        help="the server on the first core, the client and prober on the others")
    parser.add_argument("--collections", action="store_true",
                        help="the server logs its full garbage collections (when, how long)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "overload.json"))
    parser.add_argument("--table", type=Path, default=None,
                        help="print the table of an earlier results file, and exit")
    args = parser.parse_args()
    if args.table is not None:
        print(table(json.loads(args.table.read_text())))
        return 0
    results = run(args.seconds, args.factor, args.candidates, args.server_tree, args.event_log,
                  args.pin, args.collections)
    print(json.dumps(results, indent=2))
    print(table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
