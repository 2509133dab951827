"""What the matrix-factorisation baseline of ``vidrec eval --protocol loo`` costs on a log.

    python -m bench.mf_schedule DIR [--samples 6]

``DIR`` holds ``events.csv`` and ``videos.csv`` (``bench/generate_log.py``).
Plans the run as ``vidrec eval DIR/events.csv --catalog DIR/videos.csv
--protocol loo --negatives 1`` does (:func:`app.evaluation.runner.prepare`),
works out the baseline's refit points from the pair counts alone (every
finish is a positive pair, trained before any question after it, as in the
replay), then fits ``--samples`` of them, evenly spread, and prints their
CPU and the run's estimate (their mean times the refits). Nothing is
replayed: seconds for a 50,000-user log, instead of the run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from app.evaluation import runner
from app.evaluation.factorization import AlsParams, _columns, _matrix, als, fit_quietly


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--samples", type=int, default=6)
    args = p.parse_args()
    cfg = runner.EvalConfig(args.dir / "events.csv", protocol="loo", negatives=1,
                            progress=False, catalog=args.dir / "videos.csv")
    t0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="vidrec-mf-") as tmp:
        stream, _, queries = runner.prepare(cfg, Path(tmp))
    prepare_cpu = time.process_time() - t0
    users: list[int] = []
    items: list[int] = []
    user_code: dict[str, int] = {}
    item_code: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    pairs_before = np.zeros(len(stream.events) + 1, dtype=np.int64)
    for i, e in enumerate(stream.events):
        pairs_before[i] = len(users)
        if e.type.value != "finish":
            continue
        pair = (user_code.setdefault(e.user_id, len(user_code)),
                item_code.setdefault(e.video_id, len(item_code)))
        if pair not in seen:
            seen.add(pair)
            users.append(pair[0])
            items.append(pair[1])
    pairs_before[len(stream.events)] = len(users)
    params = AlsParams()
    fits: list[int] = []
    fitted = -1
    for q in queries:
        n = int(pairs_before[q.position])
        if fitted < 0 or n - fitted >= max(1, min(params.refit_every, fitted // 10)):
            fits.append(n)
            fitted = n
    u, v = np.asarray(users, dtype=np.int64), np.asarray(items, dtype=np.int64)
    sampled = []
    for j in np.linspace(0, len(fits) - 1, args.samples).round().astype(int).tolist():
        n = max(1, fits[j])
        matrix = _matrix(u, v, n, _columns(v, n, len(item_code)))
        model = als(params, 0)
        t = time.process_time()
        fit_quietly(model, matrix)
        sampled.append({"pairs": n, "cpu_s": round(time.process_time() - t, 2)})
    print(json.dumps({
        "events": len(stream.events), "questions": len(queries), "pairs": len(users),
        "refits": len(fits), "prepare_cpu_s": round(prepare_cpu, 1), "fits": sampled,
        "estimated_fit_cpu_s": round(np.mean([s["cpu_s"] for s in sampled]) * len(fits)),
    }))


if __name__ == "__main__":
    main()
