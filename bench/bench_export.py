"""The retrieval export's cost on a large catalog (issue #24): where ``video_vectors`` spends it.

    python bench/bench_export.py [--videos 19000] [--rounds 5]

Builds ``--videos`` synthetic videos (:class:`feature_store.sim.world.SyntheticWorld`'s
catalog: ids, creators, categories, tags, titles, durations), a
:class:`~trainer.retrieval.RetrievalTrainer` as the trainer builds it (the
default schema and retrieval settings, memory sparse tables whose rows for
every catalog key were admitted by a training pull, as after a replay), then
times, per round (the first warms up and is not counted), median of the rest:

- ``extract``: the video tower's inputs of every visible video
  (:class:`~feature_store.features.extract.FeatureExtractor` over the rows),
- ``pull``: the tower tables' rows for those inputs, in chunks of
  :data:`trainer.retrieval_export.CHUNK`,
- ``forward``: pooling and the video tower's MLP on the pulled rows,
- ``video_vectors``: :func:`trainer.retrieval_export.video_vectors`, with
  fresh inputs (every video featurised, as every export did before issue #24)
  and with :class:`~trainer.retrieval_export.VideoInputs` kept from the
  previous round (as the trainer's export stage does now), also when one
  video's record changed since,
- ``writer``: the whole export's artifacts (user tower to ONNX, vectors, ids),
  fresh and kept.

Seconds of this thread's CPU (``time.thread_time``), so the shared machine's
load counts less than wall time; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402


def _cpu(fn: Callable[[], object], rounds: int) -> float:
    """Median thread CPU seconds of ``fn`` over ``rounds`` calls after one warm-up."""
    fn()
    took = []
    for _ in range(rounds):
        start = time.thread_time()
        fn()
        took.append(time.thread_time() - start)
    return statistics.median(took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=19_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from feature_store.features.columns import FeatureRow
    from feature_store.features.extract import FeatureExtractor
    from feature_store.features.schema import FeatureSchema, default_schema
    from feature_store.models.retrieval_io import Towers, tower_table
    from feature_store.runtime.resources import table_specs
    from feature_store.settings import Settings
    from feature_store.sim.world import SyntheticWorld, WorldConfig
    from feature_store.sparse import open_table
    from trainer import retrieval_export
    from trainer.retrieval import RetrievalTrainer

    torch.set_num_threads(1)
    print(f"cpu={cpu_model(platform.processor() or platform.machine())} cores={os.cpu_count()} "
          f"python={platform.python_version()} torch={torch.__version__}")
    schema = default_schema()
    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="vidrec-bench-export-")))
    towers = Towers.from_settings(schema, settings.retrieval)
    tables = {s.name: open_table(s, settings) for s in table_specs(schema, settings)
              if s.name.startswith("tt_")}
    retrieval = RetrievalTrainer(towers, FeatureExtractor(schema).layout, tables,
                                 settings.retrieval)
    videos = SyntheticWorld(WorldConfig(users=10, videos=args.videos)).videos()

    extractor = FeatureExtractor(FeatureSchema(columns=towers.video))
    rows = [FeatureRow(user_id="", video_id=v.video_id, ts_ms=0, video=v) for v in videos]
    chunks = [rows[i:i + retrieval_export.CHUNK]
              for i in range(0, len(rows), retrieval_export.CHUNK)]
    batches = [extractor.extract(c) for c in chunks]
    for _ in range(3):  # admit every catalog key's rows, as a replay would have
        for batch in batches:
            retrieval.pull(batch, train=True)
    pulled = [retrieval.pull(b, train=False) for b in batches]
    missing = sum(int((tables[tower_table(t)].pull(b.table_keys[t]) == 0).all(axis=1).sum())
                  for b in batches for t in b.table_keys)
    print(f"videos={len(videos)} chunks={len(chunks)} towers' keys without a row={missing}")

    @torch.no_grad()
    def forward() -> None:
        model = retrieval.model
        model.eval()
        for batch, rows_ in zip(batches, pulled, strict=True):
            tensors = [torch.from_numpy(np.ascontiguousarray(r)) for r in rows_]
            indices = {n: torch.from_numpy(i) for n, i in batch.column_indices.items()}
            model.video(model.video.pool(tensors, indices))

    out = Path(tempfile.mkdtemp(prefix="vidrec-bench-export-out-"))
    kept = retrieval_export.VideoInputs(towers.video)
    changed = list(videos)

    def one_changed() -> None:
        """An export after one video's record changed (its title)."""
        i = len(changed) // 2
        changed[i] = changed[i].model_copy(update={"title": f"{changed[i].title} x"})
        retrieval_export.video_vectors(retrieval, changed, kept)

    figures = {
        "extract": _cpu(lambda: [extractor.extract(c) for c in chunks], args.rounds),
        "pull": _cpu(lambda: [retrieval.pull(b, train=False) for b in batches], args.rounds),
        "forward": _cpu(forward, args.rounds),
        "video_vectors, fresh inputs": _cpu(
            lambda: retrieval_export.video_vectors(retrieval, videos), args.rounds),
        "video_vectors, kept inputs": _cpu(
            lambda: retrieval_export.video_vectors(retrieval, videos, kept), args.rounds),
        "video_vectors, kept inputs, one video changed": _cpu(one_changed, args.rounds),
        "writer, fresh inputs": _cpu(
            lambda: retrieval_export.writer(retrieval, videos)(out), args.rounds),
        "writer, kept inputs": _cpu(
            lambda: retrieval_export.writer(retrieval, videos, kept)(out), args.rounds),
    }
    load = os.getloadavg()
    for name, seconds in figures.items():
        print(f"{name}: {seconds * 1000:.0f} ms CPU")
    print(f"load average={load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
