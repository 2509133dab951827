"""Recommend latency and throughput over HTTP, beside the floor of the same work without HTTP.

    python bench/bench_serving.py [--requests 2000] [--candidates 500] [--backend memory|redis]

1. Prepares a data directory: a synthetic catalog (5,000 videos), 50,000
   synthetic events applied to the activity store and the candidate signals,
   every sparse row the benchmark's requests touch admitted (so pulls return
   real rows), and an exported WideDeep model (hidden 128-64) activated, with
   the retrieval towers (``retrieval.enabled``, the default; untrained, over
   admitted rows): the user tower and the catalog's video vectors, so the
   retrieval run's latency includes the user vector and the search; and the
   sequence tower (``sequence.enabled``, the default; one short refit over the
   events' views), so every run's latency includes encoding the user's views;
   and one fit of the live factorisation on those views
   (``factorization.enabled``), so it includes reading the user's factor and
   scoring the candidates with it.
2. Starts ``vidrec serve`` on it in a subprocess: one uvicorn worker.
3. From this (second) process, sends a fixed number of ``POST /v1/recommend``
   requests with 500 given candidates over keep-alive HTTP/1.1 (a raw-socket
   client with the requests encoded beforehand, see ``_client``): first one at
   a time (latency: p50, p99), then from 2 client processes (requests/s).
   A retrieval run (no candidates: the sources pick up to 500) follows.
   Then the HTTP floor: the same client's round trip for a 404 (an unknown
   path, answered by the router without any recommend work). Last, the
   served log's cost: a second server on the same data with
   ``served_log.enabled=false``, measured alternately with the first
   (sequential, given candidates): p50 and server CPU per request with and
   without logging each response's features (``served_log_cost``). The same
   for tracing: a server exporting every request's spans over OTLP/HTTP to a
   local sink, alternately with the first (tracing off: ``tracing_cost``).
   With ``--workers N`` (Redis backends): ``vidrec serve --workers 1`` and
   ``--workers N`` on a local Kafka-protocol broker, each under two clients per
   worker: requests/s and the servers' CPU per request (``workers``).
   With ``--baseline-tree DIR``, a server run from another checkout (the
   code before a change) alternately with this one (``baseline``).
4. Measures the floor in this process on the same data: the same sparse pulls
   and ONNX run for the same requests, without HTTP, JSON or candidate work
   (``pull_and_onnx``; and with the cold start's anonymous rows of the new
   candidates stacked into the run as a recommend does,
   ``pull_and_onnx_with_anonymous``),
   the whole in-process recommend for reference, and each recommend stage's
   mean CPU time (``floor.stage_cpu_ms``, ``time.thread_time``).

Results are printed and written to ``bench/results/serving.json``. The
client shares the machine's cores with the server, as a second process on
the same host would.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from feature_store.settings import Settings  # noqa: E402

N_VIDEOS = 5_000
N_USERS = 2_000
N_EVENTS = 50_000
DISTINCT_REQUESTS = 200


def bench_settings(data_dir: Path, backend: str, redis_url: str | None) -> Settings:
    extra: dict[str, Any] = {}
    if backend == "redis":
        extra = {
            "redis": {"url": redis_url},
            "sparse": {"backend": "redis"},
            "stores": {"backend": "redis"},
        }
    return Settings(data_dir=data_dir, api={"signal_feed": False}, **extra)


def make_requests(count: int, candidates: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        user = int(rng.integers(0, N_USERS))
        ids = rng.choice(N_VIDEOS, size=candidates, replace=False)
        out.append(
            {
                "user_id": f"u{user}",
                "candidates": [f"v{int(i)}" for i in ids],
                "count": 20,
                "exclude_seen": False,
                "context": {"device": "phone", "surface": "home", "country": "US"},
            }
        )
    return out


def prepare(
    settings: Settings,
    requests: list[dict[str, Any]],
    videos: int = N_VIDEOS,
    events: int = N_EVENTS,
) -> str:
    """Fill the data directory (or Redis) for a catalog of ``videos`` that has seen
    ``events`` events; returns the model version."""
    from app.schemas import RecommendRequest
    from app.scoring.features import RequestFeatureExtractor
    from feature_store.features.schema import WIDE_TABLE
    from feature_store.runtime.resources import open_resources
    from feature_store.signals import serving_signals
    from feature_store.sim.world import SyntheticWorld, WorldConfig
    from trainer.export import publish
    from trainer.model import WideDeep

    world = SyntheticWorld(
        WorldConfig(
            users=N_USERS, videos=videos, seed=1, start_ts=int(time.time() * 1000) - 86_400_000
        )
    )
    # The signals are snapshotted on exit, for the service that reads the directory.
    with open_resources(settings) as res, serving_signals(res) as signals:
        catalog = world.videos()
        for start in range(0, len(catalog), 50_000):
            res.catalog.upsert(catalog[start : start + 50_000])
        signals.index_videos(catalog)
        events = world.events(events)
        by_id = {v.video_id: v for v in catalog}
        for start in range(0, len(events), 5000):
            chunk = events[start : start + 5000]
            res.activity.record(chunk, by_id)
            signals.record(chunk)
        extractor = RequestFeatureExtractor(res.schema)
        by_id = {v.video_id: v for v in catalog}
        now = int(time.time() * 1000)
        for body in requests:
            req = RecommendRequest.model_validate(body)
            cand = [by_id[c] for c in req.candidates or []]
            history = res.activity.history(req.user_id)
            stats = res.activity.video_stats([v.video_id for v in cand])
            batch = extractor.extract_request(req.user_id, now, req.context, history, cand, stats)
            # Admits (rows get initial weights); training pulls take unique keys.
            for table, keys in batch.table_keys.items():
                res.tables[table].pull(np.unique(keys), train=True)
            res.tables[WIDE_TABLE].pull(np.unique(batch.wide_keys), train=True)
        extra, artifacts = retrieval_artifacts(res, catalog, requests, now)
        extra, artifacts = with_sequence(settings, events, extra, artifacts, res.factors)
        version = publish(
            res.registry,
            WideDeep(res.schema),
            res.schema,
            family=settings.sparse.model_name,
            training_position={},
            metrics={},
            activate=True,
            keep=5,
            extra=extra,
            artifacts=artifacts,
        )
    return version


def retrieval_artifacts(
    res: Any, videos: list[Any], requests: list[dict[str, Any]], now: int
) -> tuple[dict[str, Any], Any]:
    """The towers' manifest entry and writer (none when ``retrieval.enabled`` is off),
    after admitting the tower rows the requests' users and the catalog touch."""
    from app.schemas import RecommendRequest
    from feature_store.features import FeatureExtractor, FeatureRow
    from feature_store.features.schema import FeatureSchema
    from feature_store.models.retrieval_io import ARTIFACTS, MANIFEST_KEY, Towers
    from trainer.retrieval import RetrievalTrainer
    from trainer.retrieval_export import writer

    settings = res.settings
    if not settings.retrieval.enabled:
        return {}, None
    towers = Towers.from_settings(res.schema, settings.retrieval)
    retrieval = RetrievalTrainer(
        towers, FeatureExtractor(res.schema).layout, res.tables, settings.retrieval
    )
    users = []
    for body in requests:
        req = RecommendRequest.model_validate(body)
        history = tuple(res.activity.history(req.user_id))
        users.append(FeatureRow(req.user_id, "", now, None, req.context, history))
    retrieval.pull(FeatureExtractor(FeatureSchema(towers.user)).extract(users), train=True)
    rows = [FeatureRow("", v.video_id, now, v) for v in videos]
    retrieval.pull(FeatureExtractor(FeatureSchema(towers.video)).extract(rows), train=True)
    return {MANIFEST_KEY: towers.describe()}, (list(ARTIFACTS), writer(retrieval, videos))


def with_sequence(
    settings: Settings, events: list[Any], extra: dict[str, Any], artifacts: Any,
    factors: Any = None,
) -> tuple[dict[str, Any], Any]:
    """``extra`` and ``artifacts`` with a sequence tower added (``sequence.enabled``): the
    events' chosen videos coded, one short refit (the weights do not matter here; the
    shapes and the work per request do), so a request encodes its user's views. With
    ``factors`` (``factorization.enabled``), one fit of the live factorisation on the same
    views published there, so a request reads its user's factor and scores with it."""
    from feature_store.models import sequence_io
    from trainer.export import all_writers
    from trainer.sequence import CHOSEN, SequenceTrainer
    from trainer.sequence_export import writer

    if not settings.sequence.enabled:
        return extra, artifacts
    quick = settings.sequence.model_copy(update={"epochs": 1, "max_windows": 64})
    trainer = SequenceTrainer(quick)
    trainer.add_views([(e.user_id, e.video_id) for e in events if e.type in CHOSEN])
    if factors is not None and settings.factorization.enabled:
        from trainer.factorization import LiveFactorization

        LiveFactorization(settings.factorization, trainer, factors).fit()
    trainer.refit()
    published = trainer.published
    if published is None:
        return extra, artifacts
    names, writers = [], []
    if artifacts is not None:
        names, writers = list(artifacts[0]), [artifacts[1]]
    names += sequence_io.ARTIFACTS
    writers.append(writer(published, quick.max_len))
    described = sequence_io.describe(quick.max_len, quick.dim, published.fits, 1.0)
    return {**extra, sequence_io.MANIFEST_KEY: described}, (names, all_writers(writers))


class Server:
    """``vidrec serve`` in a subprocess."""

    def __init__(
        self, data_dir: Path, port: int, env: dict[str, str], cwd: Path = ROOT, workers: int = 1
    ) -> None:
        self.port = port
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "--log-level",
                "WARNING",
                "serve",
                "--data-dir",
                str(data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *(["--workers", str(workers)] if workers > 1 else []),
            ],
            cwd=cwd,  # `-m app.cli` imports the app of this directory
            env={**os.environ, **env},
        )

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("server not ready")

    def cpu_seconds(self) -> float:
        """User plus system CPU time the server process and its live workers have used so
        far."""
        total, pending = 0, [self.process.pid]
        while pending:
            pid = pending.pop()
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except FileNotFoundError:  # ended meanwhile
                continue
            fields = stat.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            pending += [int(child) for child in children]
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def encode_recommend(bodies: list[bytes]) -> list[bytes]:
    """``POST /v1/recommend`` requests with these JSON bodies, as bytes on the wire."""
    return [
        b"POST /v1/recommend HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        for body in bodies
    ]


RECOMMENDED = (b"200", b'"items":[{')
"""What a successful recommend answer has: its status, and a part of its body."""


def _client(
    args: tuple[int, list[bytes], int, int, tuple[bytes, bytes]],
) -> tuple[list[float], int, float, float]:
    """One keep-alive connection sending ``count`` requests; latencies (ms), errors, span.

    A raw socket with the requests encoded beforehand, reading only the status
    line, the headers and ``Content-Length`` bytes of body: what a load
    generator in C does, so the latency is the server's and the loopback's.
    (``http.client`` adds about 0.1 ms of its own per request: header
    objects, ``email.parser``.) An answer without the ``expect``\ ed status
    and body part counts as an error.
    """
    port, requests, offset, count, (want_status, want_body) = args
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    latencies: list[float] = []
    errors = 0
    started = time.perf_counter()
    for i in range(offset, offset + count):
        request = requests[i % len(requests)]
        t0 = time.perf_counter()
        sock.sendall(request)
        status = reader.readline()
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        data = reader.read(length)
        latencies.append((time.perf_counter() - t0) * 1000)
        if status.split(b" ", 2)[1:2] != [want_status] or want_body not in data:
            errors += 1
    reader.close()
    sock.close()
    return latencies, errors, started, time.perf_counter()


def http_round_trip(port: int, count: int) -> dict[str, Any]:
    """The HTTP floor: ``GET`` of an unknown path (a 404 from the router), same client."""
    request = [b"GET /no-such-path HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"]
    latencies, errors, _, _ = _client((port, request, 0, count, (b"404", b"")))
    return summary(latencies) | {"requests": count, "errors": errors}


def run_load(port: int, bodies: list[bytes], total: int, clients: int) -> dict[str, Any]:
    """``total`` requests split over ``clients`` client *processes* (closed loop, keep-alive).

    Processes, not threads: a threaded Python client serialises on its own
    GIL and would measure itself.
    """
    share = total // clients
    requests = encode_recommend(bodies)
    jobs = [(port, requests, k * share, share, RECOMMENDED) for k in range(clients)]
    if clients == 1:
        results = [_client(jobs[0])]
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            results = pool.map(_client, jobs)
    latencies = [ms for r in results for ms in r[0]]
    span = max(r[3] for r in results) - min(r[2] for r in results)
    return summary(latencies) | {
        "requests": share * clients,
        "clients": clients,
        "errors": sum(r[1] for r in results),
        "requests_per_s": round(share * clients / span, 1),
    }


def alternate(
    servers: dict[str, Server], bodies: list[bytes], total: int, rounds: int = 2
) -> dict[str, dict[str, Any]]:
    """p50 and server CPU per request of each server, measured alternately: ``rounds``
    rounds of ``total / rounds`` sequential requests per server, taking turns, so that a
    change of the machine's speed during the runs weighs on all of them alike."""
    latencies: dict[str, list[float]] = {name: [] for name in servers}
    cpu = dict.fromkeys(servers, 0.0)
    share = max(1, total // rounds)
    requests = encode_recommend(bodies)
    for _ in range(rounds):
        for name, server in servers.items():
            before = server.cpu_seconds()
            result = _client((server.port, requests, 0, share, RECOMMENDED))
            latencies[name] += result[0]
            cpu[name] += server.cpu_seconds() - before
    return {
        name: summary(latencies[name])
        | {"server_cpu_ms_per_request": round(cpu[name] * 1000 / (rounds * share), 3)}
        for name in servers
    }


def _difference(out: dict[str, Any], on: str, off: str) -> dict[str, Any]:
    out["p50_added_ms"] = round(out[on]["p50_ms"] - out[off]["p50_ms"], 3)
    out["cpu_added_ms_per_request"] = round(
        out[on]["server_cpu_ms_per_request"] - out[off]["server_cpu_ms_per_request"], 3
    )
    return out


def second_server(
    data_dir: Path, env: dict[str, str], bodies: list[bytes], cwd: Path = ROOT
) -> Server:
    from tests.services import free_port

    server = Server(data_dir, free_port(), env, cwd)
    server.wait_ready()
    run_load(server.port, bodies, 300, 1)  # warm, as the first server was
    return server


def served_log_cost(
    logging_server: Server, data_dir: Path, env: dict[str, str], bodies: list[bytes], total: int
) -> dict[str, Any]:
    """p50 and server CPU per request with the served log and without, measured alternately
    (a second server on the same data with ``served_log.enabled=false``)."""
    quiet = second_server(data_dir, env | {"VIDREC_SERVED_LOG__ENABLED": "false"}, bodies)
    try:
        out = alternate(
            {"with_served_log": logging_server, "without_served_log": quiet}, bodies, total
        )
    finally:
        quiet.stop()
    return _difference(out, "with_served_log", "without_served_log")


class _OtlpSink:
    """A local OTLP/HTTP receiver that accepts and drops spans (the collector's place)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def tracing_cost(
    quiet_server: Server, data_dir: Path, env: dict[str, str], bodies: list[bytes], total: int
) -> dict[str, Any]:
    """p50 and server CPU per request with tracing on (every request sampled, spans
    exported over OTLP/HTTP to a local sink) and off (the first server), alternately."""
    sink = _OtlpSink()
    traced = second_server(data_dir, env | {"VIDREC_TRACING__OTLP_ENDPOINT": sink.url}, bodies)
    try:
        out = alternate({"tracing_on": traced, "tracing_off": quiet_server}, bodies, total)
    finally:
        traced.stop()
        sink.close()
    return _difference(out, "tracing_on", "tracing_off")


def baseline_cost(
    server: Server, tree: Path, data_dir: Path, env: dict[str, str], bodies: list[bytes],
    total: int,
) -> dict[str, Any]:
    """The same server run from another checkout (``--baseline-tree``: the code before a
    change), alternately with this one, on the same data: before and after."""
    before = second_server(data_dir, env, bodies, cwd=tree)
    try:
        out = alternate({"this_tree": server, "baseline_tree": before}, bodies, total, rounds=4)
    finally:
        before.stop()
    out["baseline_tree"]["path"] = str(tree)
    return _difference(out, "this_tree", "baseline_tree")


def workers_scaling(
    data_dir: Path, env: dict[str, str], bodies: list[bytes], total: int, workers: int
) -> dict[str, Any]:
    """Requests/s of ``vidrec serve --workers 1`` and ``--workers N`` on the same data (the
    Redis backends and a local Kafka-protocol broker, as several workers need), each under
    two closed-loop clients per worker; with the servers' CPU (the supervisor and its
    workers) per request, whose inverse is the requests one core serves."""
    from tests.services import TansuBroker, free_port

    out: dict[str, Any] = {}
    with TansuBroker() as broker:
        kafka = env | {
            "VIDREC_EVENT_LOG__BACKEND": "kafka",
            "VIDREC_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
            "VIDREC_EVENT_LOG__TOPIC_NAMESPACE": f"bench{os.getpid()}",
        }
        for count in (1, workers):
            server = Server(data_dir, free_port(), kafka, workers=count)
            try:
                server.wait_ready()
                run_load(server.port, bodies, 100 * count, 2 * count)  # every worker warm
                before = server.cpu_seconds()
                result = run_load(server.port, bodies, total, 2 * count)
                cpu_ms = (server.cpu_seconds() - before) * 1000 / result["requests"]
            finally:
                server.stop()
            out[f"workers_{count}"] = result | {
                "server_cpu_ms_per_request": round(cpu_ms, 3),
                "requests_per_cpu_s": round(1000 / cpu_ms, 1) if cpu_ms else None,
            }
    return out


def summary(ms: list[float]) -> dict[str, float]:
    arr = np.asarray(ms)
    return {
        "p50_ms": round(float(np.percentile(arr, 50)), 3),
        "p90_ms": round(float(np.percentile(arr, 90)), 3),
        "p99_ms": round(float(np.percentile(arr, 99)), 3),
        "mean_ms": round(float(arr.mean()), 3),
    }


def floor(settings: Settings, requests: list[dict[str, Any]], total: int) -> dict[str, Any]:
    """The same pulls and ONNX run in-process; and the whole recommend without HTTP."""
    from app.schemas import RecommendRequest
    from app.scoring.scorer import ANONYMOUS
    from app.service import open_service
    from feature_store.runtime.resources import open_resources

    with open_resources(settings) as res, open_service(res) as service:
        model = service.model
        assert model is not None
        scorer = service.scorer
        now = int(time.time() * 1000)
        prepared, stacked = [], []
        new_rows = 0
        for body in requests:
            req = RecommendRequest.model_validate(body)
            cand = [v for v in res.catalog.get_many(req.candidates or []) if v is not None]
            history = res.activity.history(req.user_id)
            stats = res.activity.video_stats([v.video_id for v in cand])
            batch = scorer.features(req.user_id, now, req.context, history, cand, stats)
            prepared.append(batch)
            # The cold start's anonymous rows of the new candidates, in the same run.
            extractor = scorer.extractor
            rows = extractor.table.rows_of(cand)
            new = service.recommender.rerank.cold_start.new_positions(extractor.table, rows)
            stacked.append(
                extractor.extract_with_reference(
                    req.user_id, now, req.context, history, rows, ANONYMOUS, new
                )
                if len(new) else batch
            )
            new_rows += len(new)
        pull_run = pull_and_run(scorer, model, prepared, total)
        with_anonymous = pull_and_run(scorer, model, stacked, total)
        features: list[float] = []
        parsed = [RecommendRequest.model_validate(b) for b in requests]
        for i in range(total):
            t0 = time.perf_counter()
            service.recommender.recommend(parsed[i % len(parsed)])
            features.append((time.perf_counter() - t0) * 1000)
        return {
            "pull_and_onnx": summary(pull_run),
            "pull_and_onnx_with_anonymous": summary(with_anonymous)
            | {"anonymous_rows_per_request": round(new_rows / len(requests), 1)},
            "recommend_in_process": summary(features),
            "stage_cpu_ms": stage_cpu(service, requests, total),
            "provider": model.provider,
            "unique_keys_per_request": int(np.mean([b.unique_key_count for b in prepared])),
        }


def pull_and_run(scorer: Any, model: Any, batches: list[Any], total: int) -> list[float]:
    """Milliseconds of each of ``total`` pulls and ONNX runs, cycling through ``batches``."""
    out = []
    for i in range(total):
        batch = batches[i % len(batches)]
        t0 = time.perf_counter()
        rows, wide = scorer.pull(batch)
        scorer.run(model, batch, rows, wide)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def stage_cpu(service: Any, requests: list[dict[str, Any]], total: int) -> dict[str, float]:
    """Mean CPU time (``time.thread_time``) of each recommend stage, in ms.

    The stages run as :class:`app.recommender.Recommender` runs them, one
    request after another cycling through ``requests``; thread CPU time is
    steadier than wall time on a shared machine.
    """
    from app.api.recommend import parse_request
    from app.candidates.retrieval import CandidateFilter, Pool
    from app.candidates.sources import REQUEST
    from app.recommender import Found
    from app.scoring.ranking import top_k

    rec, scorer, model = service.recommender, service.scorer, service.model
    bodies = [json.dumps(b).encode() for b in requests]
    spent: dict[str, float] = {}
    clock = time.thread_time
    now = int(time.time() * 1000)
    for i in range(total):
        body = bodies[i % len(bodies)]
        t0 = clock()
        req = parse_request("application/json", body)
        t1 = clock()
        count = rec.validate(req)
        t2 = clock()
        history = rec.activity.history(req.user_id)
        ids = list(dict.fromkeys(req.candidates or []))
        selected, rows = scorer.select(ids, CandidateFilter(), rec.settings.max_candidates)
        if selected is not None:
            ids = [ids[i] for i in selected]
        t3 = clock()
        batch = scorer.extractor.extract_rows(req.user_id, now, req.context, history, rows)
        t5 = clock()
        pulled, wide = scorer.pull(batch, model)
        t6 = clock()
        scores = scorer.run(model, batch, pulled, wide)
        t7 = clock()
        found = Found(ids, [REQUEST] * len(ids), rows, Pool(ids, [REQUEST] * len(ids)))
        rec._respond(found, scores, top_k(scores, count), model.version, None).model_dump_json()
        t8 = clock()
        for stage, seconds in (
            ("parse", t1 - t0),
            ("validate", t2 - t1),
            ("candidates", t3 - t2),
            ("features", t5 - t3),
            ("pull", t6 - t5),
            ("onnx", t7 - t6),
            ("respond", t8 - t7),
            ("total", t8 - t0),
        ):
            spent[stage] = spent.get(stage, 0.0) + seconds
    return {stage: round(seconds * 1000 / total, 3) for stage, seconds in spent.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--backend", choices=["memory", "redis"], default="memory")
    parser.add_argument(
        "--events", type=int, default=N_EVENTS,
        help="events the world has seen before serving: the default leaves almost every "
        "candidate *new* (under rerank.new_video_impressions, so the cold start scores it "
        "for an anonymous user too); 500000 gives a catalog most of whose videos are past it",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serving.json"))
    parser.add_argument(
        "--baseline-tree", default=None,
        help="another checkout (e.g. a worktree of the previous commit): its server is "
        "measured alternately with this one's on the same data (before / after)",
    )
    parser.add_argument(
        "--workers", type=int, default=1,
        help="with --backend redis: also `vidrec serve --workers 1` against `--workers N` "
        "on a local Kafka-protocol broker (requests/s, and per CPU second)",
    )
    args = parser.parse_args()
    if args.workers > 1 and args.backend != "redis":
        parser.error("--workers needs --backend redis (workers share state through Redis)")

    import tempfile

    from tests.services import RedisServer, free_port

    redis_server = RedisServer() if args.backend == "redis" else None
    if redis_server is not None:
        redis_server.start()
    data_dir = Path(tempfile.mkdtemp(prefix="vidrec-bench-"))
    settings = bench_settings(data_dir, args.backend, redis_server.url if redis_server else None)
    requests = make_requests(DISTINCT_REQUESTS, args.candidates)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    version = prepare(settings, requests, events=args.events)
    print(f"prepared {data_dir} in {time.perf_counter() - t0:.1f} s; model {version}")

    env = {"VIDREC_API__SIGNAL_FEED": "false"}
    if args.backend == "redis":
        env |= {
            "VIDREC_REDIS__URL": redis_server.url,
            "VIDREC_SPARSE__BACKEND": "redis",  # type: ignore[union-attr]
            "VIDREC_STORES__BACKEND": "redis",
        }
    port = free_port()
    server = Server(data_dir, port, env)
    results: dict[str, Any] = {}
    try:
        server.wait_ready()
        given = [json.dumps(b).encode() for b in requests]
        retrieval = [
            json.dumps({"user_id": b["user_id"], "count": 20, "context": b["context"]}).encode()
            for b in requests
        ]
        run_load(port, given, 300, 1)  # warm: connections, caches, allocator

        def measured(bodies: list[bytes], clients: int) -> dict[str, Any]:
            # Server CPU per request: steadier than wall time on a shared machine,
            # and 1000 / it is what one worker could serve on a core of its own.
            cpu_before = server.cpu_seconds()
            result = run_load(port, bodies, args.requests, clients)
            cpu_ms = (server.cpu_seconds() - cpu_before) * 1000 / result["requests"]
            return result | {
                "server_cpu_ms_per_request": round(cpu_ms, 3),
                "requests_per_cpu_s": round(1000 / cpu_ms, 1) if cpu_ms else None,
            }

        results["http_given_candidates_sequential"] = measured(given, 1)
        results["http_given_candidates_2_clients"] = measured(given, 2)
        run_load(port, retrieval, 200, 1)
        results["http_retrieval_sequential"] = measured(retrieval, 1)
        http_round_trip(port, 200)  # warm
        results["http_round_trip_404"] = http_round_trip(port, args.requests)
        results["served_log_cost"] = served_log_cost(
            server, data_dir, env, given, args.requests
        )
        results["tracing_cost"] = tracing_cost(server, data_dir, env, given, args.requests)
        if args.workers > 1:
            results["workers"] = workers_scaling(
                data_dir, env, given, args.requests, args.workers
            )
        if args.baseline_tree:
            results["baseline"] = baseline_cost(
                server, Path(args.baseline_tree).resolve(), data_dir, env, given, args.requests
            )
    finally:
        server.stop()
    results["floor"] = floor(settings, requests, args.requests)
    if redis_server is not None:
        redis_server.stop()
    seq = results["http_given_candidates_sequential"]
    results["p50_over_floor"] = round(
        seq["p50_ms"] / results["floor"]["pull_and_onnx"]["p50_ms"], 2
    )
    results["p99_over_floor"] = round(
        seq["p99_ms"] / results["floor"]["pull_and_onnx"]["p50_ms"], 2
    )
    results["p99_over_floor_p99"] = round(
        seq["p99_ms"] / results["floor"]["pull_and_onnx"]["p99_ms"], 2
    )
    results["p50_over_floor_with_anonymous"] = round(
        seq["p50_ms"] / results["floor"]["pull_and_onnx_with_anonymous"]["p50_ms"], 2
    )
    results["meta"] = {
        "backend": args.backend,
        "candidates": args.candidates,
        "events_before_serving": args.events,
        "cpus": os.cpu_count(),
        "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    print(json.dumps(results, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
