"""The retrieval stage's own cost per request: the user vector, then the search.

    python -m bench.bench_retrieval [--users 50] [--rounds 20]

On ``bench_serving``'s data (5,000 synthetic videos, 50,000 events, the
towers published untrained over admitted rows): for each of ``--users``
requests, :meth:`~app.scoring.retrieval.RetrievalModel.user_vector` (the user
columns' keys, one pull per tower table, one ONNX run) and the search of the
version's index for 200 neighbours, the user's watches excluded; p50 and p99
of each over ``users x rounds`` calls, in this process. The whole request
with retrieval is ``bench_serving``'s retrieval run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    from app.schemas import RecommendRequest
    from app.scoring.onnx_model import session_options
    from app.scoring.retrieval import load_retrieval
    from bench.bench_serving import bench_settings, make_requests, prepare
    from feature_store.runtime.resources import open_resources

    settings = bench_settings(Path(tempfile.mkdtemp(prefix="vidrec-bench-")), "memory", None)
    requests = make_requests(args.users, 500)
    version = prepare(settings, requests)
    with open_resources(settings) as res:
        model = load_retrieval(
            res.registry, res.registry.manifest(version), res.schema, session_options(settings.api)
        )
        assert model is not None

        def pull(table: str, keys: np.ndarray) -> np.ndarray:
            return res.tables[table].pull(keys, train=False)

        bodies = [RecommendRequest.model_validate(r) for r in requests]
        histories = {b.user_id: res.activity.history(b.user_id) for b in bodies}
        took: dict[str, list[float]] = {"user vector": [], "search (200)": []}
        for round_ in range(args.rounds + 1):  # the first round warms up
            for body in bodies:
                history = histories[body.user_id]
                t0 = time.perf_counter()
                vector = model.user_vector(body.user_id, 0, body.context, history, pull)
                t1 = time.perf_counter()
                model.neighbours(vector, 200, {h.video_id for h in history})
                t2 = time.perf_counter()
                if round_:
                    took["user vector"].append(t1 - t0)
                    took["search (200)"].append(t2 - t1)
        for name, seconds in took.items():
            ms = np.array(seconds) * 1000
            print(f"{name}: p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms "
                  f"({len(ms)} calls, {len(model.index.items()[0])} videos)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
