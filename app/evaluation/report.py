"""What ``vidrec eval`` shows: a text table, a markdown section, and the AUC-over-time plot."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from pathlib import Path

from app.evaluation.runner import EvalConfig, EvalResult

_HEADER = (
    "model",
    "AUC last 20%",
    "logloss last 20%",
    "AUC all",
    "logloss all",
    "recall@{k}",
    "NDCG@{k}",
)


def _fmt(value: float) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.4f}"


def rows(result: EvalResult) -> list[list[str]]:
    return [
        [m.name, _fmt(m.auc_test), _fmt(m.logloss_test), _fmt(m.auc_all), _fmt(m.logloss_all),
         _fmt(m.recall), _fmt(m.ndcg)]
        for m in result.models
    ]


def header(k: int) -> list[str]:
    return [h.format(k=k) for h in _HEADER]


def _aligned(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def window_rows(result: EvalResult) -> list[list[str]]:
    """Per window: its end (event time, UTC) and each model's AUC over it."""
    out = []
    for i, end in enumerate(result.window_ends_ms):
        when = datetime.fromtimestamp(end / 1000, UTC).strftime("%Y-%m-%d %H:%M")
        out.append([str(i + 1), when, *(_fmt(m.window_auc[i]) for m in result.models)])
    return out


def window_header(result: EvalResult) -> list[str]:
    return ["window", "ends (UTC)", *(m.name for m in result.models)]


def text_table(result: EvalResult, k: int) -> str:
    per_window = _aligned([window_header(result), *window_rows(result)])
    return "\n".join([
        *_aligned([header(k), *rows(result)]), "", summary(result), "",
        f"AUC per window ({len(result.window_ends_ms)} of equal row counts):", *per_window,
    ])


def _md(head: list[str], body: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|",
        *("| " + " | ".join(r) + " |" for r in body),
    ]


def summary(result: EvalResult) -> str:
    online = result.models[0]
    others = result.models[1:]
    margins = ", ".join(f"{online.auc_test - m.auc_test:+.4f} vs {m.name}" for m in others)
    popular = [m for m in others if "popularity" in m.name]
    offline = [m for m in others if m.name.startswith("offline")]
    met = all(online.auc_test >= m.auc_test + 0.03 for m in popular) and all(
        online.auc_test >= m.auc_test for m in offline
    )
    goal = (f"goal (+0.03 over both popularity baselines, at or above offline) "
            f"{'met' if met else 'missed'}")
    fallbacks = ", ".join(f"{k}: {v}" for k, v in sorted(result.service_fallbacks.items()))
    return (
        f"{result.events:,} events, {result.samples:,} labelled rows (positive rate "
        f"{result.positive_rate:.3f}); last 20%: {result.test_rows:,} rows, "
        f"{100 * result.new_test_users:.0f}% of their users ({100 * result.new_test_rows:.0f}% "
        "of the rows) absent from the first 80%.\n"
        f"Online AUC on the last 20%: {margins}; {goal}. AUC on the first 80% (where "
        f"settings may be tuned): online {online.auc_fit:.4f}, "
        + ", ".join(f"{m.name} {m.auc_fit:.4f}" for m in popular) + ".\n"
        f"Ranking: {result.queries} held-back positives asked of the service; the item was "
        f"among its candidates in {100 * result.service_candidate_recall:.0f}% of them"
        f"{' (fallbacks: ' + fallbacks + ')' if fallbacks else ''}.\n"
        f"Offline epochs (valid AUC): "
        + ", ".join(f"{int(e['epoch'])}: {e['valid_auc']:.4f}" for e in result.offline_epochs)
        + f"; best {result.offline_best_epoch}.\n"
        f"Replay {result.online_seconds:.0f} s ({result.events_per_s:,.0f} events/s), "
        f"total {result.seconds:.0f} s."
    )


def method(result: EvalResult, cfg: EvalConfig) -> str:
    """How the figures were made (part of the generated section, so it stays true)."""
    users = (
        "; and, from `u.user`, the user's age group, gender and occupation, each also "
        "crossed with the genre (`features.user_attributes`, carried in the events' "
        "and requests' context; zip codes unused)"
        if result.user_attributes else "; no user attributes (none in the data)"
    )
    return f"""\
How: the dataset is replayed in event-time order (ratings sorted by
(timestamp, user, item)) through the embedded deployment: the in-process
event log (one partition), the real online trainer consuming it in batches of
{cfg.batch_size} events, each batch scored *before* its training step
(prequential, test-then-train), the signal feed and the service. Labels:
rating >= 4 is positive, one weighted sample per rating (the trainer's label
policy set by settings, see `app/evaluation/stream.py`). Features (the
default schema): user, movie, first genre (category), all genres (tags),
release decade (in the creator column), watched history (>= 3 stars),
the movie's counters so far, hour of day{users}.

Rows: every model's "last 20%" figure is over the same {result.test_rows:,}
rows (the last 20% of the {result.samples:,} labelled rows by (ts, user,
item)). Popularity: smoothed positive rate of the movie over everything
before the row; recent popularity: the same with counts decayed with a
{cfg.half_life_days:g}-day half-life (event time). Offline Wide&Deep: the same
features (as they stood at each rating), network and optimizers, trained in
shuffled epochs on the first 70%, early-stopped on the next 10% (the last
eighth of the first 80%); its test scores are those of the best validation
epoch. Ranking: at {result.queries} sampled held-back positives (first
rating >= 4 of a (user, movie) pair in the last 20% of events), just before
the rating is replayed, `recommend` is asked for the user's top {cfg.k} with
the service's clock at the rating's time (the network exported at most
{cfg.export_every:,} events earlier); the baselines rank every movie by
(decayed) positives, both excluding the movies the service excluded (the
user's watched history)."""


def markdown(
    result: EvalResult, cfg: EvalConfig, command: str, plot: str | None
) -> str:
    lines = _md(header(cfg.k), rows(result))
    parts = [
        f"Command: `{command}`",
        "",
        *lines,
        "",
        summary(result).replace("\n", "\n\n"),
        "",
        method(result, cfg),
    ]
    if plot:
        parts += ["", f"![AUC over time]({plot})"]
    parts += [
        "",
        f"AUC per time window ({len(result.window_ends_ms)} windows of equal row counts; "
        "the offline model scores only the last 20%; times as replayed: MovieLens 100K "
        "is shifted to start in 2000, see `feature_store/datasets.py`):",
        "",
        *_md(window_header(result), window_rows(result)),
    ]
    return "\n".join(parts)


def plot(result: EvalResult, path: Path) -> Path:
    """AUC per equal-count window of the stream, one line per model (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    ends = [datetime.fromtimestamp(t / 1000, UTC) for t in result.window_ends_ms]
    times = mdates.date2num(ends)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for model in result.models:
        ax.plot(times, model.window_auc, marker="o", markersize=3, label=model.name)
    ax.xaxis_date()
    ax.axvline(mdates.date2num(datetime.fromtimestamp(result.test_start_ms / 1000, UTC)),
               color="grey",
               linestyle="--", linewidth=1, label="last 20% starts")
    ax.set_ylabel("AUC (window)")
    ax.set_xlabel("event time (shifted), end of window")
    ax.set_title(f"Prequential AUC over time: {Path(result.dataset).name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def replace_section(doc: str, title: str, body: str) -> str:
    """``doc`` with the ``## title`` section's body replaced (appended when absent)."""
    pattern = re.compile(rf"(^## {re.escape(title)}\n)(.*?)(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        return pattern.sub(lambda m: m.group(1) + "\n" + body.rstrip() + "\n\n", doc, count=1)
    return doc.rstrip() + f"\n\n## {title}\n\n" + body.rstrip() + "\n"
