"""The recommend answers of this tree for the serving bench's requests, to compare two trees.

    cd TREE && python PATH/TO/bench/answers.py DATA_DIR OUT.json

Run it from the root of each tree to compare (it imports the code of the
directory it is run from), each on its own copy of the same data.

A speed change must not change what is recommended. This runs the serving
bench's 200 given-candidate requests and 50 retrieval requests through
``Recommender.recommend`` in-process, on a data directory that
``bench/bench_serving.py`` prepared, and writes each answer's items
(``video_id``, score to 6 digits, source) and fallback reason. Two trees
agree when their files are equal. The answers are made deterministic: a
fixed clock, no exploration slots (Thompson draws are random), the
cold start's rates estimated once (their refresh follows the wall clock),
and the served log off (so the data directory is only read).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())  # the tree under test, not necessarily this file's

from bench.bench_serving import DISTINCT_REQUESTS, bench_settings, make_requests  # noqa: E402

FIXED_CLOCK_S = 1_800_000_000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()

    from app.schemas import RecommendRequest
    from app.service import open_service
    from feature_store.runtime.resources import open_resources
    from feature_store.settings import Settings

    base = bench_settings(args.data_dir, "memory", None).model_dump()
    base["rerank"] |= {"exploration_budget": 0.0, "prior_refresh_s": 1e9}
    base["served_log"] |= {"enabled": False}
    settings = Settings.model_validate(base)
    given = make_requests(DISTINCT_REQUESTS, 500)
    retrieval = [{"user_id": b["user_id"], "count": 20, "context": b["context"]}
                 for b in given[:50]]
    answers = []
    with open_resources(settings) as res, open_service(res) as service:
        recommender = service.recommender
        recommender.clock = lambda: FIXED_CLOCK_S
        for body in given + retrieval:
            response = recommender.recommend(RecommendRequest.model_validate(body))
            answers.append({
                "items": [[i.video_id, round(i.score, 6), i.source] for i in response.items],
                "fallback_reason": response.fallback_reason,
            })
    args.out.write_text(json.dumps(answers) + "\n")
    print(f"{len(answers)} answers written to {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
