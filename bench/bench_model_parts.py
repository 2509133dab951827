"""A recommend's model parts in CPU time, and where its ONNX run goes, node by node.

    python bench/bench_model_parts.py [--requests 400] [--profile]

Prepares :mod:`bench_serving`'s default world (memory backends, 500 given
candidates, almost all of them *new*, so the cold start's anonymous reference
rows double the batch) and, for ``--requests`` requests after 50 to warm, times
in this thread's CPU (``time.thread_time``) what a recommend spends on its
model, as :meth:`app.scoring.scorer.Scorer.score_rows` does it:

- ``features``: the user's rows and the anonymous reference rows
  (``RequestFeatureExtractor.extract_with_reference``; before it existed, the
  two ``extract_rows`` batches and their stacking);
- ``pull``: the sparse rows of the batch's keys;
- ``onnx``: the model's run; ``onnx_same_batch``: one batch run again and
  again (warm caches).

With ``--profile``, onnxruntime's profiler over 200 runs of one batch: the 25
slowest nodes with their input shapes, and the time per operator type.

Run from any checkout (``cd TREE && python bench/bench_model_parts.py``) to
compare a change with the code before it, taking turns. Prints one JSON line
with the machine and its load.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_serving  # noqa: E402

from bench.machine import cpu_model  # noqa: E402


def extract(extractor: Any, schema: Any, request: Any, now: int, history: Any,
            rows: Any, new: Any) -> Any:
    """The batch a recommend scores: the user's rows and the anonymous reference's."""
    from app.scoring.scorer import ANONYMOUS

    if hasattr(extractor, "extract_with_reference"):
        return extractor.extract_with_reference(
            request.user_id, now, request.context, history, rows, ANONYMOUS, new
        )
    from app.scoring.onnx_model import stack_batches  # the code before it

    user = extractor.extract_rows(request.user_id, now, request.context, history, rows)
    reference = extractor.extract_rows(ANONYMOUS, now, request.context, (), rows[new])
    return stack_batches(schema, user, reference)


def profile(path: str, feed: dict[str, Any], runs: int = 200) -> dict[str, Any]:
    """onnxruntime's per-node times (microseconds per run) over ``runs`` runs of ``feed``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, feed)
    with open(session.end_profiling()) as fh:
        events = json.load(fh)
    node_us: collections.Counter[str] = collections.Counter()
    kind: dict[str, str] = {}
    shapes: dict[str, Any] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = event["name"][: -len("_kernel_time")]
            node_us[name] += event["dur"]
            kind[name] = event["args"].get("op_name", "")
            shapes[name] = event["args"].get("input_type_shape")
    by_kind: collections.Counter[str] = collections.Counter()
    for name, us in node_us.items():
        by_kind[kind[name]] += us
    return {
        "run_us": round(sum(node_us.values()) / runs, 1),
        "slowest_nodes": [
            {"node": name, "op": kind[name], "us": round(us / runs, 1), "inputs": shapes[name]}
            for name, us in node_us.most_common(25)
        ],
        "by_operator_us": {k: round(v / runs, 1) for k, v in by_kind.most_common()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    from app.schemas import RecommendRequest
    from app.service import open_service
    from feature_store.models import model_io
    from feature_store.runtime.resources import open_resources

    settings = bench_serving.bench_settings(Path(tempfile.mkdtemp()), "memory", None)
    bodies = bench_serving.make_requests(50, 500)
    version = bench_serving.prepare(settings, bodies)
    clock = time.thread_time
    with open_resources(settings) as res, open_service(res) as service:
        model, scorer = service.model, service.scorer
        assert model is not None
        extractor, now = scorer.extractor, int(time.time() * 1000)
        asked = []
        for body in bodies:
            request = RecommendRequest.model_validate(body)
            videos = [v for v in res.catalog.get_many(request.candidates or []) if v is not None]
            rows = extractor.table.rows_of(videos)
            new = service.recommender.rerank.cold_start.new_positions(extractor.table, rows)
            asked.append((request, res.activity.history(request.user_id), rows, new))
        spent: dict[str, float] = collections.defaultdict(float)
        for i in range(50 + args.requests):
            request, history, rows, new = asked[i % len(asked)]
            t0 = clock()
            batch = extract(extractor, res.schema, request, now, history, rows, new)
            t1 = clock()
            pulled, wide = scorer.pull(batch, model)
            t2 = clock()
            scorer.run(model, batch, pulled, wide)
            t3 = clock()
            if i >= 50:
                spent["features"] += t1 - t0
                spent["pull"] += t2 - t1
                spent["onnx"] += t3 - t2
        request, history, rows, new = asked[0]
        batch = extract(extractor, res.schema, request, now, history, rows, new)
        pulled, wide = scorer.pull(batch, model)
        for _ in range(50):
            scorer.run(model, batch, pulled, wide)
        t0 = clock()
        for _ in range(300):
            scorer.run(model, batch, pulled, wide)
        same = (clock() - t0) / 300
        out: dict[str, Any] = {
            "ms_per_request": {k: round(v * 1000 / args.requests, 3) for k, v in spent.items()}
            | {"onnx_same_batch": round(same * 1000, 3)},
            "rows_per_run": batch.batch_size,
            "model": version,
        }
        if args.profile:
            feed = model_io.build_feed(res.schema, batch, pulled, wide)
            out["onnx_profile"] = profile(str(res.registry.model_path(model.version)), feed)
    out["machine"] = {"cpu": cpu_model("unknown"), "cores": os.cpu_count(),
                      "load_average_1min": round(os.getloadavg()[0], 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
