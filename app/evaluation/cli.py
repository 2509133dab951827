"""``vidrec eval DATASET``: arguments, and printing/recording the result."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

log = logging.getLogger(__name__)

DOC_SECTION = "Quality (MovieLens 100K)"
_NOT_FIGURES = ("dataset", "json", "no_progress")
"""Options that do not change the figures, left out of the recorded command."""


def add_eval_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("dataset", help="MovieLens directory (ml-100k or ratings.csv layout), "
                   "or a CSV / Parquet file of events")
    p.add_argument("--format", default="auto", choices=["auto", "movielens", "csv", "parquet"])
    p.add_argument("--redis", metavar="URL", default=None,
                   help="Redis tables and stores in this *empty scratch* database "
                   "(default: embedded in-process backends)")
    p.add_argument("--queries", type=int, default=500,
                   help="held-back positives asked of the service (last 20%%)")
    p.add_argument("--k", type=int, default=20, help="cut-off of recall and NDCG")
    p.add_argument("--windows", type=int, default=20, help="time windows of the AUC curve")
    p.add_argument("--batch-size", type=int, default=32, help="events per online step")
    p.add_argument("--epochs", type=int, default=10, help="most offline epochs")
    p.add_argument("--limit", type=int, default=None, help="at most this many events")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="eval_auc.png", help="PNG of AUC over time ('' for none)")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--doc", default=None,
                   help=f"rewrite the '## {DOC_SECTION}' section of this markdown file")
    p.add_argument("--no-progress", action="store_true")
    return p


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


def run_eval(args: argparse.Namespace) -> int:
    from app.evaluation.report import markdown, plot, replace_section, text_table
    from app.evaluation.runner import EvalConfig, evaluate

    cfg = EvalConfig(
        dataset=Path(args.dataset),
        fmt=args.format,
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
    )
    result = evaluate(cfg)
    sys.stdout.write(text_table(result, cfg.k) + "\n")
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
        doc.write_text(replace_section(doc.read_text(), DOC_SECTION, section))
        log.info("rewrote '## %s' in %s", DOC_SECTION, doc)
    return 0
