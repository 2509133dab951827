"""``vidrec eval DATASET``: arguments, and printing/recording the result."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from feature_store.errors import ConfigurationError, InvalidInput
from feature_store.settings import ApiSettings

if TYPE_CHECKING:
    from app.evaluation.runner import EvalTrainers

log = logging.getLogger(__name__)

_NOT_FIGURES = ("dataset", "json", "no_progress")
"""Options that do not change the figures, left out of the recorded command."""


def section_title(title: str) -> str:
    """The ``--doc`` section of a run: ``Quality (<dataset>[, protocol])``."""
    return f"Quality ({title})"


def add_eval_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("dataset", help="MovieLens directory (ml-100k or ratings.csv layout), "
                   "or a CSV / Parquet file of events")
    p.add_argument("--format", default="auto", choices=["auto", "movielens", "csv", "parquet"])
    p.add_argument("--catalog", default=None, metavar="FILE",
                   help="videos of a CSV / Parquet dataset (CSV, JSON lines or Parquet; "
                   "without it no retrieval figures)")
    p.add_argument("--protocol", default="retrieval", choices=["retrieval", "loo"],
                   help="ranking figures: 'retrieval' asks the service at held-back positives "
                   "to retrieve and rank; 'loo' holds out each user's last view of a "
                   "positive-only log and ranks it among --candidates sampled videos")
    p.add_argument("--negatives", type=int, default=0, metavar="N",
                   help="positive-only log: add each view's impression and N impressions of "
                   "videos the user never touched (they time out into negatives)")
    p.add_argument("--candidates", type=int, default=99,
                   help="loo: sampled videos ranked beside the held-out one")
    p.add_argument("--full-ranking", action="store_true",
                   help="loo: rank the held-out video against the whole catalog minus the "
                   "user's earlier views (as published sequential-recommendation results "
                   "count it) instead of --candidates sampled videos")
    p.add_argument("--redis", metavar="URL", default=None,
                   help="Redis tables and stores in this *empty scratch* database "
                   "(default: embedded in-process backends)")
    p.add_argument("--queries", type=int, default=None,
                   help="retrieval: held-back positives asked of the service (last 20%%; "
                   "default 500); loo: users held out (default: all with two views)")
    p.add_argument("--k", type=int, default=None,
                   help="cut-off of the ranking figures (default 20; 10 with --protocol loo)")
    p.add_argument("--windows", type=int, default=20, help="time windows of the AUC curve")
    p.add_argument("--batch-size", type=int, default=32, help="events per online step")
    p.add_argument("--epochs", type=int, default=10, help="most offline epochs")
    p.add_argument("--limit", type=int, default=None, help="at most this many events")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="eval_auc.png", help="PNG of AUC over time ('' for none)")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--doc", default=None,
                   help="rewrite this markdown file's '## Quality (<dataset>)' section "
                   "(the protocol is part of the name)")
    p.add_argument("--ranking-weights", default=None, metavar="JSON",
                   help="the service's weights over the ranking heads for this run, e.g. "
                   "'{\"engagement\": 1}' (default: api.ranking_weights)")
    p.add_argument("--no-progress", action="store_true")
    return p


def ranking_weights(text: str | None) -> dict[str, Any]:
    """``--ranking-weights`` as extra settings (``{}`` when absent); InvalidInput naming the
    option when it is not a valid weighting."""
    if text is None:
        return {}
    try:
        weights = json.loads(text)
        ApiSettings(ranking_weights=weights)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "value"
        raise InvalidInput("--ranking-weights", f"{where}: {first['msg']}") from exc
    except (ValueError, ConfigurationError) as exc:
        raise InvalidInput("--ranking-weights", str(exc)) from exc
    return {"api": {"ranking_weights": weights}}


def command_line(args: argparse.Namespace) -> str:
    """The ``vidrec eval`` command that reproduces ``args`` (options left at their default
    omitted), for the docs."""
    defaults = vars(add_eval_arguments(argparse.ArgumentParser()).parse_args([args.dataset]))
    parts = ["vidrec", "eval", args.dataset]
    for name, value in vars(args).items():
        if name in defaults and name not in _NOT_FIGURES and value != defaults[name]:
            flag = "--" + name.replace("_", "-")
            parts += [flag] if value is True else [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)


def run_eval(args: argparse.Namespace, trainers: EvalTrainers) -> int:
    """``vidrec eval`` with the trainers the composition root built."""
    from app.evaluation.report import markdown, plot, replace_section, text_table
    from app.evaluation.runner import EvalConfig, evaluate

    if args.negatives < 0:
        raise InvalidInput("--negatives", "must be at least 0")
    if args.candidates < 1:
        raise InvalidInput("--candidates", "must be at least 1")
    if args.full_ranking and args.protocol != "loo":
        raise InvalidInput("--full-ranking", "ranks a held-out view: use it with --protocol loo")
    cfg = EvalConfig(
        dataset=Path(args.dataset),
        fmt=args.format,
        protocol=args.protocol,
        negatives=args.negatives,
        catalog=Path(args.catalog) if args.catalog else None,
        candidates=args.candidates,
        full_ranking=args.full_ranking,
        backend="redis" if args.redis else "memory",
        redis_url=args.redis,
        batch_size=args.batch_size,
        queries=args.queries,
        k=args.k,
        windows=args.windows,
        offline_epochs=args.epochs,
        limit=args.limit,
        seed=args.seed,
        progress=not args.no_progress,
        settings=ranking_weights(args.ranking_weights),
    )
    result = evaluate(cfg, trainers)
    sys.stdout.write(text_table(result) + "\n")
    png = None
    if args.plot:
        png = plot(result, Path(args.plot))
        log.info("plot written to %s", png)
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=2, default=str) + "\n")
    if args.doc:
        doc = Path(args.doc)
        link = None
        if png is not None:
            try:
                link = str(png.resolve().relative_to(doc.resolve().parent))
            except ValueError:
                link = str(png)
        section = markdown(result, cfg, command_line(args), link)
        title = section_title(result.title)
        doc.write_text(replace_section(doc.read_text(), title, section))
        log.info("rewrote '## %s' in %s", title, doc)
    return 0
