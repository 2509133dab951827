"""Every benchmark with fixed seeds and sizes, one table, and the docs sections it owns.

    python -m bench [all] [--quick] [--only sparse,training] [--doc docs/benchmarks.md | --no-doc]
    vidrec bench all [--quick] ...

Runs, one after the other, each in its own child process with a time limit
(:data:`LIMIT_S`, 5 minutes; serving 10: it measures four request paths with
2,000 requests each. A benchmark that overruns is reported as ``timeout``, the
others still run): the sparse tables (``bench.bench_sparse.run``), online training
(``bench.bench_training.run``), serving latency (``bench/bench_serving.py``),
freshness (``bench/bench_freshness.py``) and overload
(``bench.bench_overload.run``: sustainable rate, shedding, liveness; the server on a core of
its own, the client on the others, where there are two), at the sizes in :data:`SIZES`
(``--quick``: :data:`QUICK`, to check the harness end to end in about a
minute). Prints one table (figure, value, floor, ratio, machine) and
rewrites, in ``docs/benchmarks.md``, the block between
``<!-- bench:<name>:begin -->`` and ``<!-- bench:<name>:end -->`` of each
benchmark that ran (with the benchmark's own table where it has one, so its
section's prose and ratio convention still hold), plus the combined table between
``<!-- bench:all:begin -->`` and ``<!-- bench:all:end -->`` (appended in its
own section when missing; left as it is by a run of some benchmarks only, ``--only``).
Prose outside the markers is never touched.

``ratio`` is always "ours over the floor, in time" (below 1 beats the floor)
where the benchmark defines a floor: sparse (table time / redis-py time),
training (pipeline time per event / bare model time), serving (p50 over
HTTP / p50 of the same pulls and ONNX run in-process; overload: the sustainable
rate / the normal answers per second at 3x it). Freshness and overload's other
figures have goals, not floors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
LIMIT_S = 300
"""Each benchmark ends by itself within 5 minutes on 2 cores, or is stopped..."""
LIMITS_S = {"serving": 600}
"""...except these, in seconds: serving takes 4-5 minutes on a quiet 2-core machine."""
NAMES = ("sparse", "training", "serving", "freshness", "overload")

SIZES: dict[str, dict[str, Any]] = {
    "sparse": {"iterations": 30, "rows": 100_000, "batch": 4096, "dim": 64},
    "training": {"events": 150_000, "warmup": 30_000, "batch": 1024},
    "serving": {"requests": 2000, "candidates": 500},
    "freshness": {"trials": 40},
    "overload": {"seconds": 60, "factor": 3, "candidates": 500},
}
QUICK: dict[str, dict[str, Any]] = {
    "sparse": {"iterations": 3, "rows": 10_000, "batch": 1024, "dim": 16},
    "training": {"events": 12_000, "warmup": 4000, "batch": 1024},
    "serving": {"requests": 100, "candidates": 100},
    "freshness": {"trials": 3},
    "overload": {"seconds": 5, "factor": 3, "candidates": 100},
}


def machine() -> str:
    cpu = cpu_model(platform.machine())
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def _row(name: str, figure: str, value: float, unit: str, floor: float | None,
         ratio: float | None, note: str = "") -> dict[str, Any]:
    return {"bench": name, "figure": figure, "value": value, "unit": unit, "floor": floor,
            "ratio": ratio, "note": note}


# --- one benchmark (runs in the child process) ------------------------------


Rows = list[dict[str, Any]]
Result = tuple[Rows, str | None]
"""The rows of the combined table, and the benchmark's own table for its block (or None)."""


def run_sparse(size: dict[str, Any]) -> Result:
    from bench import bench_sparse

    raw = bench_sparse.run(seed=0, **size)
    rows = [
        _row("sparse", r["figure"], r["value"], r["unit"], r["floor"], r["ratio"], r["note"])
        for r in raw
    ]
    return rows, bench_sparse._format(raw)


def run_training(size: dict[str, Any]) -> Result:
    from bench import bench_training

    raw = bench_training.run(**size)
    rows = []
    for r in raw:
        # bench_training reports rate / floor rate; the combined table wants time / floor time.
        ratio = r["floor"] / r["value"] if r["value"] else None
        rows.append(_row("training", r["figure"], r["value"], r["unit"], r["floor"], ratio,
                         r["note"]))
    return rows, bench_training._format(raw)


def run_serving(size: dict[str, Any]) -> Result:
    with tempfile.TemporaryDirectory(prefix="vidrec-bench-all-") as tmp:
        out = Path(tmp) / "serving.json"
        _script("bench_serving.py", "--requests", size["requests"], "--candidates",
                size["candidates"], "--out", out, limit_s=LIMITS_S["serving"])
        data = json.loads(out.read_text())
    seq = data["http_given_candidates_sequential"]
    floor = data["floor"]["pull_and_onnx"]
    note = f"{size['candidates']} candidates, ONNX on {data['floor'].get('provider', '?')}"
    return [
        _row("serving", "recommend p50 over HTTP", seq["p50_ms"], "ms", floor["p50_ms"],
             seq["p50_ms"] / floor["p50_ms"], note),
        _row("serving", "recommend p99 over HTTP", seq["p99_ms"], "ms", floor["p99_ms"],
             seq["p99_ms"] / floor["p99_ms"], note),
        _row("serving", "recommend requests/s, 2 clients",
             data["http_given_candidates_2_clients"]["requests_per_s"], "req/s", None, None,
             note),
        _row("serving", "recommend p50 with retrieval",
             data["http_retrieval_sequential"]["p50_ms"], "ms", None, None,
             "the service's own candidate sources"),
    ], None


def run_freshness(size: dict[str, Any]) -> Result:
    _script("bench_freshness.py", "--trials", size["trials"], "--backend", "memory")
    data = json.loads((ROOT / "bench" / "results" / "freshness-memory.json").read_text())
    row, sig = data["event_to_served_row"], data["event_to_candidate_signals"]
    note = f"embedded backends, {data['trials']} trials; goal p95 <= 2 s"
    return [
        _row("freshness", "event to served row p50", row["p50_s"], "s", None, None, note),
        _row("freshness", "event to served row p95", row["p95_s"], "s", None, None, note),
        _row("freshness", "event to candidate signals p95", sig["p95_s"], "s", None, None, note),
        _row("freshness", "event to excluded as seen p95",
             data["event_to_excluded_as_seen"]["p95_s"], "s", None, None, note),
    ], None


def run_overload(size: dict[str, Any]) -> Result:
    from bench import bench_overload

    # The server on a core of its own, the client on the others: its tails, not the client's.
    pin = len(os.sched_getaffinity(0)) >= 2
    data = bench_overload.run(size["seconds"], size["factor"], size["candidates"], pin=pin)
    o, live = data["overload"], data["overload"]["liveness"]
    sustainable = data["sustainable"]["requests_per_s"]
    note = f"{size['factor']}x for {size['seconds']} s, {size['candidates']} candidates"
    rows = [
        _row("overload", "sustainable recommends/s (one process"
             + (", one core)" if pin else ")"), sustainable, "req/s", None,
             None, "closed loop, 4 connections, none shed"),
        _row("overload", "normal answers/s at 3x (vs sustainable)", o["normal_recommends_per_s"],
             "req/s", sustainable, sustainable / max(1e-9, o["normal_recommends_per_s"]), note),
        _row("overload", "admitted recommends over the deadline", o["admitted_over_deadline"],
             "requests", None, None, f"of {o['admitted_recommends']}; goal 0"),
        _row("overload", "refusals over 50 ms", o["refusals_over_50ms"], "requests", None, None,
             f"of {o['refusals']}; goal 0"),
        _row("overload", "liveness failures", live["failures"], "probes", None, None,
             f"of {live['probes']}; goal 0"),
        _row("overload", "liveness p99", live.get("p99_ms", 0.0), "ms", None, None,
             "goal <= 100 ms"),
        _row("overload", "back to normal after the load", data["recovery_s"] or -1.0, "s", None,
             None, "goal <= 2 s (-1: never)"),
    ]
    return rows, bench_overload.table(data)


def _script(name: str, *args: Any, limit_s: float = LIMIT_S) -> None:
    subprocess.run([sys.executable, str(ROOT / "bench" / name), *map(str, args)], cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL, timeout=limit_s)


RUNNERS = {"sparse": run_sparse, "training": run_training, "serving": run_serving,
           "freshness": run_freshness, "overload": run_overload}


# --- the parent -------------------------------------------------------------


def run_one(name: str, size: dict[str, Any]) -> tuple[Rows, str | None, float, str | None]:
    """Run one benchmark in a child process; (rows, own table, seconds, error or None)."""
    started = time.perf_counter()
    limit_s = LIMITS_S.get(name, LIMIT_S)
    with tempfile.TemporaryDirectory(prefix="vidrec-bench-all-") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "bench.run_all", "--child", name, "--size",
               json.dumps(size), "--out", str(out)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, timeout=limit_s, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return [], None, time.perf_counter() - started, f"timeout after {limit_s} s"
        seconds = time.perf_counter() - started
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return [], None, seconds, f"failed (exit {proc.returncode}): {tail[0]}"
        rows, own = json.loads(out.read_text())
        return rows, own, seconds, None


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit in ("ms", "s") or abs(value) < 100:
        return f"{value:,.3f}".rstrip("0").rstrip(".") if value else "0"
    return f"{value:,.0f}"


def table(rows: list[dict[str, Any]], where: str) -> str:
    lines = ["| figure | value | floor | ratio | machine |", "|---|---:|---:|---:|---|"]
    for r in rows:
        unit = r["unit"]
        value = "timeout" if r.get("error") else f"{_num(r['value'], unit)} {unit}"
        floor = "-" if r["floor"] is None else f"{_num(r['floor'], unit)} {unit}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['bench']}: {r['figure']} | {value} | {floor} | {ratio} | {where} |")
    return "\n".join(lines)


def text(rows: list[dict[str, Any]], where: str) -> str:
    head = ("figure", "value", "floor", "ratio")
    body = [
        (f"{r['bench']}: {r['figure']}",
         r["error"] if r.get("error") else f"{_num(r['value'], r['unit'])} {r['unit']}",
         "-" if r["floor"] is None else f"{_num(r['floor'], r['unit'])} {r['unit']}",
         "-" if r["ratio"] is None else f"{r['ratio']:.2f}")
        for r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) for x in (head, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*lines, f"machine: {where}"])


def replace_block(doc: str, name: str, body: str) -> tuple[str, bool]:
    """``doc`` with the text between ``name``'s markers replaced; (doc, found)."""
    pattern = re.compile(
        rf"(<!-- bench:{re.escape(name)}:begin -->\n).*?(\n?<!-- bench:{re.escape(name)}:end -->)",
        re.S,
    )
    if not pattern.search(doc):
        return doc, False
    return pattern.sub(lambda m: m.group(1) + body.rstrip() + "\n" + m.group(2).lstrip("\n"),
                       doc, count=1), True


def rewrite_doc(path: Path, per_bench: dict[str, str], combined: str | None) -> list[str]:
    """Rewrite the owned blocks; returns the names rewritten. ``combined`` is None for a
    run of some benchmarks only (``--only``): the combined table keeps the last whole
    run's rows instead of being replaced by a few of them."""
    doc = path.read_text()
    done = []
    for name, body in per_bench.items():
        doc, found = replace_block(doc, name, body)
        if found:
            done.append(name)
    if combined is not None:
        doc, found = replace_block(doc, "all", combined)
        if not found:
            doc = (doc.rstrip() + "\n\n## All benchmarks (`vidrec bench all`)\n\n"
                   "<!-- bench:all:begin -->\n" + combined.rstrip() + "\n<!-- bench:all:end -->\n")
        done.append("all")
    path.write_text(doc)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("target", nargs="?", default="all", choices=["all"])
    parser.add_argument("--quick", action="store_true", help="small sizes: check the harness")
    parser.add_argument("--only", default=",".join(NAMES), help="comma-separated subset")
    parser.add_argument("--doc", default=str(DOC), help="markdown file whose blocks to rewrite")
    parser.add_argument("--no-doc", action="store_true", help="print only")
    parser.add_argument("--child", choices=NAMES, help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.out).write_text(json.dumps(RUNNERS[args.child](json.loads(args.size))))
        return 0

    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(NAMES)
    if unknown:
        parser.error(f"unknown benchmarks: {sorted(unknown)}")
    sizes = QUICK if args.quick else SIZES
    where = machine()
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    per_bench: dict[str, str] = {}
    for name in names:
        print(f"running {name} {sizes[name]} ...", file=sys.stderr, flush=True)
        got, own, seconds, error = run_one(name, sizes[name])
        if error:
            print(f"  {name}: {error}", file=sys.stderr)
            rows.append(_row(name, "(did not finish)", 0.0, "", None, None) | {"error": error})
            continue
        print(f"  {name}: {seconds:.0f} s", file=sys.stderr)
        rows += got
        command = "vidrec bench all" + (" --quick" if args.quick else "") + f" --only {name}"
        per_bench[name] = (
            f"Last `vidrec bench all` run ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{seconds:.0f} s; alone: `{command}`), sizes {sizes[name]}; {where}:\n\n"
            + (own or table(got, where))
        )
    print(text(rows, where))
    if not args.no_doc:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        combined = (
            f"Command: `vidrec bench all{' --quick' if args.quick else ''}` "
            f"(or `python -m bench`), {stamp}; load average before {load_before:.2f}, "
            f"after {os.getloadavg()[0]:.2f}. `ratio` is ours over the floor in time (below 1 "
            "beats the floor): sparse table / redis-py, training pipeline / bare model per "
            "event, serving HTTP / the same pulls and ONNX run in-process, overload "
            "sustainable rate / normal answers per second at 3x it; freshness and the other "
            "overload figures have goals, not floors.\n\n" + table(rows, where)
        )
        whole = set(names) == set(NAMES)
        done = rewrite_doc(Path(args.doc), per_bench, combined if whole else None)
        print(f"rewrote {', '.join(done)} in {args.doc}", file=sys.stderr)
    return 0 if not any(r.get("error") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
