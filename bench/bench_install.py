"""What a new user waits for: ``./scripts/up`` on a fresh clone, to the first answer.

    python bench/bench_install.py [--repo .] [--rev HEAD] [--json out.json]

Clones ``--repo`` at ``--rev`` into a temporary directory, runs ``./scripts/up
--port <free>`` there with pip's cache off (``PIP_NO_CACHE_DIR=1``: a new
machine has none; torch comes from wherever ``VIDREC_TORCH`` / pip's
configuration finds it, here a local CPU wheel), and times it until
``GET /healthz`` answers 200 (the first answer: install, start, demo catalog).
Then stops it (SIGTERM to its process group) and measures the ``.venv``: its
size on disk and its largest distributions.

The floor, measured in the same run: a bare venv with torch alone (the one
dependency ``vidrec up`` cannot do without and the largest), its time and
size. ``ratio`` is ours over the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.machine import cpu_model

FIRST_ANSWER_LIMIT_S = 1800.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_bytes(path: Path) -> int:
    """Bytes on disk under ``path`` (``du``'s count: allocated blocks, links once)."""
    out = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def largest(site: Path, n: int = 8) -> list[tuple[str, int]]:
    """The ``n`` largest entries of a site-packages directory, in bytes."""
    sizes = [(p.name, tree_bytes(p)) for p in site.iterdir() if not p.name.endswith("-info")]
    return sorted(sizes, key=lambda x: -x[1])[:n]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def time_floor(work: Path, env: dict[str, str]) -> tuple[float, int]:
    """A venv with torch alone: (seconds, bytes)."""
    venv = work / "floor"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    torch = env.get("VIDREC_TORCH", "torch==2.13.0")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", torch], check=True, env=env)
    return time.monotonic() - started, tree_bytes(venv)


def time_up(clone: Path, env: dict[str, str]) -> tuple[float, str]:
    """``./scripts/up`` from a fresh clone until /healthz answers: (seconds, its log's tail)."""
    port = free_port()
    log = clone / "up.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["./scripts/up", "--port", str(port)], cwd=clone, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}/healthz"
            while not answers(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"scripts/up exited {proc.returncode}:\n"
                                       + log.read_text()[-3000:])
                if time.monotonic() - started > FIRST_ANSWER_LIMIT_S:
                    raise RuntimeError("no answer within the limit:\n" + log.read_text()[-3000:])
                time.sleep(0.5)
            elapsed = time.monotonic() - started
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    return elapsed, log.read_text()[-600:]


def run(repo: Path, rev: str) -> dict[str, Any]:
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
    env.pop("VIRTUAL_ENV", None)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="vidrec-install-") as tmp:
        work = Path(tmp)
        clone = work / "vidrec"
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        floor_s, floor_bytes = time_floor(work, env)
        up_s, tail = time_up(clone, env)
        venv = clone / ".venv"
        site = next((venv / "lib").glob("python3*/site-packages"))
        result = {
            "rev": rev, "commit": commit,
            "first_answer_s": round(up_s, 1), "venv_bytes": tree_bytes(venv),
            "floor_torch_only_s": round(floor_s, 1), "floor_torch_only_bytes": floor_bytes,
            "largest": largest(site),
            "stamp": (venv / ".vidrec-installed").read_text().strip(),
        }
    result["ratio_time"] = round(result["first_answer_s"] / result["floor_torch_only_s"], 2)
    result["ratio_size"] = round(result["venv_bytes"] / result["floor_torch_only_bytes"], 2)
    result["machine"] = (
        f"{cpu_model(platform.processor() or platform.machine())}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    result["load_average_1min_before_after"] = [round(load_before, 2),
                                                round(os.getloadavg()[0], 2)]
    result["log_tail"] = tail
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=".", help="a git repository to clone (a path)")
    parser.add_argument("--rev", default="HEAD", help="the revision to check out")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()
    result = run(Path(args.repo).resolve(), args.rev)
    gb = 1e9
    print(f"rev {result['rev']} ({result['commit']}), stamp {result['stamp']!r}")
    print(f"first answer  {result['first_answer_s']:7.1f} s   floor (torch alone) "
          f"{result['floor_torch_only_s']:.1f} s   ratio {result['ratio_time']}")
    print(f".venv         {result['venv_bytes'] / gb:7.2f} GB  floor "
          f"{result['floor_torch_only_bytes'] / gb:.2f} GB   ratio {result['ratio_size']}")
    print("largest: " + ", ".join(f"{n} {b / 1e6:.0f} MB" for n, b in result["largest"]))
    print(f"machine: {result['machine']}; load average (1 min) before/after "
          f"{result['load_average_1min_before_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
