"""The ``vidrec`` command.

    vidrec up [--demo]         API + trainer + embedded backends in one process
    vidrec serve               the HTTP service alone (production)
    vidrec train               the online trainer alone (production)
    vidrec replay DATASET      write a dataset to the event log in event-time order
    vidrec eval DATASET        quality: replay through trainer and service, beside baselines
    vidrec bench all           every benchmark, one table, docs/benchmarks.md rewritten

Settings come from ``VIDREC_*`` environment variables (see
``feature_store.settings``); flags override the few that people change by
hand. ``up``, ``train`` and ``eval`` are built by the composition root
(``app.wiring``), imported inside their commands, so ``vidrec serve`` and
this module never load ``trainer`` or torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from feature_store.errors import VidrecError
from feature_store.settings import Settings

log = logging.getLogger("vidrec")


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = Path(args.data_dir)
    return Settings(**overrides)


def cmd_up(args: argparse.Namespace) -> int:
    from app.wiring import run_up

    return run_up(_settings(args), host=args.host, port=args.port, demo=args.demo)


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server import run_service

    return run_service(_settings(args), host=args.host, port=args.port, workers=args.workers)


def cmd_train(args: argparse.Namespace) -> int:
    from app.wiring import run_train

    return run_train(_settings(args))


def cmd_replay(args: argparse.Namespace) -> int:
    from app.evaluation.datasets import replay_dataset
    from feature_store.runtime.resources import open_resources

    settings = _settings(args)
    with open_resources(settings) as resources:
        count = replay_dataset(
            Path(args.dataset), resources, fmt=args.format, limit=args.limit
        )
    log.info("replayed %d events from %s", count, args.dataset)
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from feature_store.backfill import backfill
    from feature_store.runtime.resources import open_resources

    with open_resources(_settings(args)) as resources:
        report = backfill(
            resources, Path(args.events), fmt=args.format,
            videos_path=Path(args.videos) if args.videos else None,
        )
    log.info("%s", report.describe())
    return 0


def cmd_export_vectors(args: argparse.Namespace) -> int:
    from app.vectors_export import export_vectors
    from feature_store.errors import InvalidInput, NotFound
    from feature_store.models.registry import ModelRegistry
    from feature_store.runtime.resources import open_resources

    settings = _settings(args)
    registry = ModelRegistry(settings.data_dir / "registry")
    version = args.version or registry.active()
    if version is None:
        raise NotFound("no active model version yet: export one first, or name --version")
    manifest = registry.manifest(version)
    if manifest.family != settings.sparse.model_name and settings.sparse.backend == "memory":
        raise InvalidInput("version", f"{version} is of retrain family {manifest.family!r}, "
                           "whose embedded tables only the process that trains it holds")
    with open_resources(settings, model_name=manifest.family) as resources:
        export_vectors(resources, manifest, Path(args.out),
                       Path(args.users) if args.users else None)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from app.wiring import run_eval

    return run_eval(args)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run ``python -m bench`` from the source checkout (``bench/`` is not installed)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if not (root / "bench" / "run_all.py").is_file():
        raise VidrecError("vidrec bench needs a source checkout (bench/ next to app/)")
    return subprocess.call([sys.executable, "-m", "bench", *args.bench_args], cwd=root)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidrec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--data-dir", help="snapshots, registry and checkpoints (VIDREC_DATA_DIR)")
        return p

    up = with_common(sub.add_parser("up", help="everything in one process (embedded default)"))
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--demo", action="store_true", help="seed a catalog and simulated users")
    up.set_defaults(func=cmd_up)

    serve = with_common(sub.add_parser("serve", help="the HTTP service alone"))
    serve.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other hosts")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--workers", type=int, default=1,
        help="processes accepting on the port, about one core each (Redis and Kafka "
        "backends only: they share state through them)",
    )
    serve.set_defaults(func=cmd_serve)

    train = with_common(sub.add_parser("train", help="the online trainer alone"))
    train.set_defaults(func=cmd_train)

    replay = with_common(sub.add_parser("replay", help="write a dataset to the event log"))
    replay.add_argument("dataset", help="directory or file (MovieLens, or CSV of events)")
    replay.add_argument("--format", default="auto", choices=["auto", "movielens", "csv"])
    replay.add_argument("--limit", type=int, default=None, help="at most this many events")
    replay.set_defaults(func=cmd_replay)

    backfill = with_common(sub.add_parser(
        "backfill", help="historical events from a file into the event log, validated and "
        "dead-lettered as live ones (docs/offline.md)"))
    backfill.add_argument("events", help="events file: .csv, .parquet or .jsonl")
    backfill.add_argument("--videos", default=None,
                          help="videos file upserted into the catalog first")
    backfill.add_argument("--format", default="auto", choices=["auto", "csv", "parquet", "jsonl"])
    backfill.set_defaults(func=cmd_backfill)

    vectors = with_common(sub.add_parser(
        "export-vectors", help="video vectors and the user tower's inputs as Parquet "
        "(docs/offline.md)"))
    vectors.add_argument("out", help="directory for videos.parquet, users.parquet, manifest.json")
    vectors.add_argument("--users", default=None, help="file of user ids, one per line")
    vectors.add_argument("--version", default=None, help="a model version (default: the active)")
    vectors.set_defaults(func=cmd_export_vectors)

    from app.evaluation.cli import add_eval_arguments

    ev = sub.add_parser("eval", help="quality on a dataset: online model, service, baselines")
    add_eval_arguments(ev)
    ev.set_defaults(func=cmd_eval)

    bench = sub.add_parser("bench", help="benchmarks: `vidrec bench all [--quick]`")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="see python -m bench -h")
    bench.set_defaults(func=cmd_bench)
    return parser


def _onnxruntime_missing() -> bool:
    """Whether neither ONNX Runtime build is installed (both are optional extras)."""
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.func in (cmd_up, cmd_serve, cmd_eval, cmd_export_vectors) and _onnxruntime_missing():
        log.error("ONNX Runtime is not installed: pip install 'vidrec[cpu]' "
                  "(or 'vidrec[gpu]' where the service scores on a GPU)")
        return 2
    try:
        return int(args.func(args))
    except VidrecError as exc:
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
