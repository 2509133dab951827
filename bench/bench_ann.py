"""Approximate nearest-neighbour libraries on clustered video vectors, against exact search.

    nice -n 10 python -m bench.bench_ann [--sizes 10000 1000000] [--dim 32] [--queries 1000]
                                          [--k 100] [--threads 2] [--only faiss-ivf,hnswlib]

Picks the index behind :class:`app.candidates.ann.VideoIndex`. For each size
the vectors are ``--dim`` float32, L2-normalised (inner product = cosine, as
the two-tower export writes them), drawn around ``sqrt(n)`` cluster centres
of log-normal sizes (real embeddings cluster: uniform noise on the sphere
makes every index look worse and every neighbour equally far). Queries are
random videos' vectors moved by noise of norm about 1 (a user vector sits
near what it likes, farther from it than the videos are from their centres).

Each library is built once with ``--threads`` threads, then queried one
query per call on one thread (OpenBLAS and OpenMP set to one thread too), as a
request does (the service runs one
request's search on its own thread; two cores are shared by the whole
process). Per configuration it prints:

- ``recall@k``: mean share of the exact top ``k`` (numpy inner product over
  every vector) that the index returns;
- ``p50``/``p99``: single-query latency in microseconds over ``--queries``
  queries after 20 warm-ups, Python call included; ``CPU p50``/``CPU p99``:
  the querying thread's CPU time for the same calls (on a shared machine the
  wall-clock tail is mostly time the thread waited for a core: a 4 ms
  scheduler slice lands in the top 1 % of any query long enough to be hit);
- ``build s``: seconds to build (train + add), once per library and size;
- ``same``: whether a second build from the same vectors (sizes up to 10^5
  only) returns identical ids for every query: every serving process must
  hold the identical index.

``--only video-index`` measures vidrec's own ``VideoIndex`` (default ``ann``
settings) the same way, plain and with a 200-video exclude set (as a
request's seen videos; at 10^4 the excluded ones cost it up to 2 % recall).

The pick per size is the configuration with recall@k >= 0.95 and the lowest
p99. The machine, library versions and load average are printed first, since
the machine is shared and the figures move with its load.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

# One BLAS thread, before numpy loads: a request's search runs on its own thread, and
# OpenBLAS's second thread waits for a core the rest of the process (and machine) holds.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from bench.machine import cpu_model  # noqa: E402

Search = Callable[[np.ndarray, int], np.ndarray]
"""One query (dim,) and k -> the ids (positions) of the k best, best first."""

TARGET_RECALL = 0.95


@dataclass
class Row:
    size: int
    library: str
    config: str
    recall: float
    p50_us: float
    p99_us: float
    cpu_p50_us: float
    cpu_p99_us: float
    build_s: float
    same: str


def clustered(n: int, dim: int, rng: np.random.Generator, spread: float) -> np.ndarray:
    """``n`` normalised vectors around ``sqrt(n)`` centres of uneven sizes."""
    clusters = max(8, int(math.sqrt(n)))
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = rng.lognormal(0.0, 1.0, clusters)
    which = rng.choice(clusters, size=n, p=weights / weights.sum())
    noise = rng.standard_normal((n, dim)).astype(np.float32) * (spread / math.sqrt(dim))
    out = centres[which] + noise
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Exact top ``k`` ids per query by inner product (chunked: 10^6 x 1000 floats)."""
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), 64):
        scores = queries[start : start + 64] @ vectors.T
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1)
        out[start : start + 64] = np.take_along_axis(part, order, axis=1)
    return out


def numpy_exact(vectors: np.ndarray) -> Search:
    def search(query: np.ndarray, k: int) -> np.ndarray:
        scores = vectors @ query
        part = np.argpartition(-scores, k - 1)[:k]
        return part[np.argsort(-scores[part])]

    return search


def measure(search: Search, queries: np.ndarray, truth: np.ndarray, k: int) -> tuple[float, ...]:
    """(recall@k, wall p50, wall p99, CPU p50, CPU p99) over every query, one call each, us."""
    for q in queries[:20]:
        search(q, k)
    wall = np.empty(len(queries))
    cpu = np.empty(len(queries))
    hits = 0
    for i, q in enumerate(queries):
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        ids = search(q, k)
        cpu[i] = (time.thread_time_ns() - start_cpu) / 1000
        wall[i] = (time.perf_counter_ns() - start) / 1000
        hits += len(np.intersect1d(ids, truth[i], assume_unique=False))
    recall = hits / truth.size
    return recall, *(float(np.percentile(t, p)) for t in (wall, cpu) for p in (50, 99))


# Each builder returns a list of (config name, search) sharing one built index.
Builder = Callable[[np.ndarray, int], list[tuple[str, Search]]]


def build_faiss_flat(vectors: np.ndarray, threads: int) -> list[tuple[str, Search]]:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.omp_set_num_threads(1)

    def search(q: np.ndarray, k: int) -> np.ndarray:
        return index.search(q[None, :], k)[1][0]

    return [("flat", search)]


def build_faiss_ivf(vectors: np.ndarray, threads: int) -> list[tuple[str, Search]]:
    import faiss

    n, dim = vectors.shape
    nlist = max(16, int(4 * math.sqrt(n)))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = 1234
    index.cp.niter = 20
    sample = vectors[np.random.default_rng(7).permutation(n)[: min(n, 64 * nlist)]]
    faiss.omp_set_num_threads(threads)
    index.train(sample)
    index.add(vectors)
    faiss.omp_set_num_threads(1)
    out = []
    for nprobe in (4, 8, 16, 32, 64, 128):
        if nprobe > nlist:
            continue
        params = faiss.SearchParametersIVF(nprobe=nprobe)

        def search(q: np.ndarray, k: int, params: Any = params) -> np.ndarray:
            ids = index.search(q[None, :], k, params=params)[1][0]
            return ids[ids >= 0]

        out.append((f"nlist={nlist} nprobe={nprobe}", search))
    return out


def build_faiss_hnsw(vectors: np.ndarray, threads: int) -> list[tuple[str, Search]]:
    import faiss

    index = faiss.IndexHNSWFlat(vectors.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 100
    faiss.omp_set_num_threads(threads)
    index.add(vectors)
    faiss.omp_set_num_threads(1)
    out = []
    for ef in (64, 128, 256, 512):
        params = faiss.SearchParametersHNSW(efSearch=ef)

        def search(q: np.ndarray, k: int, params: Any = params) -> np.ndarray:
            return index.search(q[None, :], k, params=params)[1][0]

        out.append((f"M=32 efC=100 ef={ef}", search))
    return out


def build_hnswlib(vectors: np.ndarray, threads: int) -> list[tuple[str, Search]]:
    import hnswlib

    n, dim = vectors.shape
    index = hnswlib.Index(space="ip", dim=dim)
    index.init_index(max_elements=n, M=16, ef_construction=100, random_seed=100)
    index.add_items(vectors, np.arange(n), num_threads=threads)
    out = []
    for ef in (100, 150, 200, 400):

        def search(q: np.ndarray, k: int, ef: int = ef) -> np.ndarray:
            index.set_ef(ef)
            return index.knn_query(q, k=k, num_threads=1)[0][0]

        out.append((f"M=16 efC=100 ef={ef}", search))
    return out


def build_usearch(vectors: np.ndarray, threads: int) -> list[tuple[str, Search]]:
    from usearch.index import Index

    n, dim = vectors.shape
    index = Index(ndim=dim, metric="ip", dtype="f32", connectivity=16, expansion_add=128)
    index.add(np.arange(n), vectors, threads=threads)
    out = []
    for ef in (64, 128, 256, 512):

        def search(q: np.ndarray, k: int, ef: int = ef) -> np.ndarray:
            index.expansion_search = ef
            return index.search(q, k, threads=1).keys

        out.append((f"M=16 efC=128 ef={ef}", search))
    return out


def build_voyager(vectors: np.ndarray, threads: int) -> list[tuple[str, Search]]:
    import voyager

    n, dim = vectors.shape
    index = voyager.Index(
        voyager.Space.InnerProduct, num_dimensions=dim, M=16, ef_construction=100, random_seed=1
    )
    index.add_items(vectors, np.arange(n), num_threads=threads)
    out = []
    for ef in (100, 200, 400):

        def search(q: np.ndarray, k: int, ef: int = ef) -> np.ndarray:
            return np.asarray(index.query(q, k=k, num_threads=1, query_ef=ef)[0])

        out.append((f"M=16 efC=100 ef={ef}", search))
    return out


def build_video_index(vectors: np.ndarray, threads: int) -> list[tuple[str, Search]]:
    """vidrec's own :class:`~app.candidates.ann.VideoIndex` with the default settings (what
    a request pays: id strings, the alive bitmap, a 200-video exclude set)."""
    from app.candidates.ann import VideoIndex
    from feature_store.settings import AnnSettings

    n = len(vectors)
    ids = [f"v{i:07d}" for i in range(n)]
    settings = AnnSettings(build_threads=threads)
    index = VideoIndex.build(ids, vectors, settings)
    exclude = {ids[i] for i in np.random.default_rng(5).choice(n, min(200, n // 10))}

    def search(q: np.ndarray, k: int, exclude: set[str] | frozenset[str] = frozenset()) -> Any:
        return np.fromiter((int(v[1:]) for v in index.search(q, k, exclude)[0]), np.int64)

    def search_excluding(q: np.ndarray, k: int) -> Any:
        return search(q, k, exclude)

    config = f"{index.kind} nprobe={settings.nprobe}" if index.kind != "exact" else "exact"
    return [(config, search), (f"{config}, 200 excluded", search_excluding)]


LIBRARIES: dict[str, tuple[str, Builder]] = {
    "faiss-flat": ("faiss", build_faiss_flat),
    "faiss-ivf": ("faiss", build_faiss_ivf),
    "faiss-hnsw": ("faiss", build_faiss_hnsw),
    "hnswlib": ("hnswlib", build_hnswlib),
    "usearch": ("usearch", build_usearch),
    "voyager": ("voyager", build_voyager),
    "video-index": ("faiss", build_video_index),
}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("faiss-cpu", "hnswlib", "usearch", "voyager"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _same(
    builder: Builder,
    vectors: np.ndarray,
    threads: int,
    first: list[tuple[str, Search]],
    queries: np.ndarray,
    k: int,
) -> str:
    second = builder(vectors, threads)
    for (_, a), (_, b) in zip(first, second, strict=True):
        if any(not np.array_equal(a(q, k), b(q, k)) for q in queries[:200]):
            return "no"
    return "yes"


def run_size(n: int, args: argparse.Namespace, names: list[str]) -> list[Row]:
    rng = np.random.default_rng(n)
    vectors = clustered(n, args.dim, rng, spread=0.6)
    # A user vector sits near what it likes, farther than the videos from their centres.
    noise = rng.standard_normal((args.queries, args.dim)).astype(np.float32)
    queries = vectors[rng.choice(n, args.queries)] + noise * (1.0 / math.sqrt(args.dim))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    truth = exact_top(vectors, queries, args.k)
    rows = []
    start = time.perf_counter()
    figures = measure(numpy_exact(vectors), queries, truth, args.k)
    rows.append(Row(n, "numpy", "exact", *figures, 0.0, "yes"))
    _print_row(rows[-1])
    for name in names:
        start = time.perf_counter()
        _, builder = LIBRARIES[name]
        built = builder(vectors, args.threads)
        build_s = time.perf_counter() - start
        small = n <= 100_000
        same = _same(builder, vectors, args.threads, built, queries, args.k) if small else "-"
        for config, search in built:
            figures = measure(search, queries, truth, args.k)
            rows.append(Row(n, name, config, *figures, build_s, same))
            _print_row(rows[-1])
        del built
    return rows


def _print_row(row: Row) -> None:
    print(
        f"| {row.size:,} | {row.library} | {row.config} | {row.recall:.3f} | {row.p50_us:,.0f} | "
        f"{row.p99_us:,.0f} | {row.cpu_p50_us:,.0f} | {row.cpu_p99_us:,.0f} | "
        f"{row.build_s:.1f} | {row.same} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2, help="build threads")
    parser.add_argument("--only", default="", help="comma-separated libraries (default: all)")
    args = parser.parse_args()
    names = [n for n in (args.only.split(",") if args.only else LIBRARIES) if n]
    available = []
    for name in names:
        module = LIBRARIES[name][0]
        try:
            importlib.import_module(module)
            available.append(name)
        except ImportError:
            print(f"skipping {name}: {module} is not installed")
    print(f"machine: {cpu_model(platform.machine())}, {os.cpu_count()} cores; {versions()}")
    print(f"load average at start: {os.getloadavg()}")
    print(f"k={args.k} dim={args.dim} queries={args.queries} build threads={args.threads}\n")
    print(
        "| vectors | library | config | recall@k | p50 us | p99 us | CPU p50 us | CPU p99 us "
        "| build s | same |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
    rows: list[Row] = []
    for n in args.sizes:
        rows.extend(run_size(n, args, available))
    print(f"\nload average at end: {os.getloadavg()}")
    for n in args.sizes:
        ok = [r for r in rows if r.size == n and r.recall >= TARGET_RECALL]
        best = min(ok, key=lambda r: r.p99_us) if ok else None
        by_cpu = min(ok, key=lambda r: r.cpu_p99_us) if ok else None
        if best is not None and by_cpu is not None:
            print(
                f"pick at {n:,}: {best.library} {best.config} (recall {best.recall:.3f}, "
                f"p99 {best.p99_us:,.0f} us); by CPU p99: {by_cpu.library} {by_cpu.config} "
                f"(recall {by_cpu.recall:.3f}, CPU p99 {by_cpu.cpu_p99_us:,.0f} us)"
            )


if __name__ == "__main__":
    main()
