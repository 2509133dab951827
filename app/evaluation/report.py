"""What ``vidrec eval`` shows: a text table, a markdown section, and the AUC-over-time plot."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from pathlib import Path

from app.evaluation.feed import IMPRESSION_LEAD_MS
from app.evaluation.results import RANKER_ROW, SEQUENCE_ROW, EvalResult, ModelFigures
from app.evaluation.runner import EvalConfig
from app.evaluation.stream import stars_watched
from feature_store.heads import HEADS, HeadSpec

_HEADER = (
    "model",
    "AUC last 20%",
    "per moment",
    "logloss last 20%",
    "AUC all",
    "logloss all",
    "{hit}@{k}",
    "NDCG@{k}",
)


def _fmt(value: float) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.4f}"


def rows(result: EvalResult) -> list[list[str]]:
    return [
        [m.name, _fmt(m.auc_test), _fmt(m.auc_test_moments), _fmt(m.logloss_test),
         _fmt(m.auc_all), _fmt(m.logloss_all), _fmt(m.recall), _fmt(m.ndcg)]
        for m in result.models
    ]


def header(result: EvalResult) -> list[str]:
    hit = "HR" if result.protocol == "loo" else "recall"
    return [h.format(k=result.k, hit=hit) for h in _HEADER]


def random_ranking(candidates: float, k: int) -> tuple[float, float]:
    """HR@k and NDCG@k of a random order of ``candidates`` videos (one relevant)."""
    if candidates <= 0:
        return math.nan, math.nan
    n = int(round(candidates))
    hr = min(k, n) / n
    ndcg = sum(1.0 / math.log2(r + 1) for r in range(1, min(k, n) + 1)) / n
    return hr, ndcg


def _aligned(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _curves(result: EvalResult) -> list[ModelFigures]:
    """Models with an AUC curve (ranking-only baselines have none)."""
    return [m for m in result.models if not all(math.isnan(v) for v in m.window_auc)]


def window_rows(result: EvalResult) -> list[list[str]]:
    """Per window: its end (event time, UTC) and each model's AUC over it."""
    out = []
    for i, end in enumerate(result.window_ends_ms):
        when = datetime.fromtimestamp(end / 1000, UTC).strftime("%Y-%m-%d %H:%M")
        out.append([str(i + 1), when, *(_fmt(m.window_auc[i]) for m in _curves(result))])
    return out


def window_header(result: EvalResult) -> list[str]:
    return ["window", "ends (UTC)", *(m.name for m in _curves(result))]


def text_table(result: EvalResult) -> str:
    per_window = _aligned([window_header(result), *window_rows(result)])
    return "\n".join([
        *_aligned([header(result), *rows(result)]), "", summary(result), "",
        f"AUC per window ({len(result.window_ends_ms)} of equal row counts):", *per_window,
    ])


def _md(head: list[str], body: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|",
        *("| " + " | ".join(r) + " |" for r in body),
    ]


def _goal(result: EvalResult) -> str:
    online = result.models[0]
    others = [m for m in result.models[1:] if not math.isnan(m.auc_test)]
    popular = [m for m in others if "popularity" in m.name]
    offline = [m for m in others if m.name.startswith("offline")]
    if math.isnan(online.auc_test) or not popular:
        return ("no AUC: the last 20% has a single class"
                + (" (a positive-only log has no negatives: add --negatives N)"
                   if result.positive_rate == 1.0 else ""))
    margins = ", ".join(f"{online.auc_test - m.auc_test:+.4f} vs {m.name}" for m in others)
    met = all(online.auc_test >= m.auc_test + 0.03 for m in popular) and all(
        online.auc_test >= m.auc_test for m in offline
    )
    return (f"{margins}; goal (+0.03 over both popularity baselines, at or above offline) "
            f"{'met' if met else 'missed'}. AUC on the first 80% (where settings may be "
            f"tuned): online {online.auc_fit:.4f}, "
            + ", ".join(f"{m.name} {m.auc_fit:.4f}" for m in popular))


def _ranking(result: EvalResult) -> str:
    fallbacks = ", ".join(f"{k}: {v}" for k, v in sorted(result.service_fallbacks.items()))
    fallbacks = f" (fallbacks: {fallbacks})" if fallbacks else ""
    if result.protocol == "loo":
        hr, ndcg = random_ranking(result.candidates_per_query, result.k)
        among = (
            f"against the whole catalog: {result.candidates_per_query:,.0f} candidates on "
            "average (every video but those the user viewed before, the held-out one aside, "
            "as published sequential-recommendation results count it)"
            if result.full_ranking else
            f"among {result.candidates_per_query:.0f} candidates (itself and videos the user "
            "never touched)"
        )
        return (
            f"Ranking (leave-one-out): {result.queries:,} users' last views held out, each "
            f"ranked by the service {among}; a random order scores HR@{result.k} "
            f"{hr:.4f}, NDCG@{result.k} {ndcg:.4f}{fallbacks}."
        )
    if not result.catalog:
        return ("Ranking: retrieval figures cannot be computed without the videos' catalog "
                "(the service retrieves only videos it knows): give --catalog FILE, or use "
                "--protocol loo, which ranks given candidates.")
    return (
        f"Ranking: {result.queries} held-back positives asked of the service; the item was "
        f"among its candidates in {100 * result.service_candidate_recall:.0f}% of them "
        f"(the pool's coverage){fallbacks}. The row \"candidate pool, sources' order\" ranks "
        "that pool in its sources' interleave order, before the model scored it."
    )


def _heads(result: EvalResult) -> list[str]:
    """The other ranking heads' prequential figures, each beside its popularity baseline."""
    h = result.heads
    if not h:
        return []
    return [
        "Other heads, prequential over the replay (each head's last 200,000 samples at most), "
        "beside each video's smoothed mean label so far (popularity): "
        + "; ".join(_head_figures(spec, h) for spec in HEADS[1:]) + "."
    ]


def _head_figures(spec: HeadSpec, figures: dict[str, float]) -> str:
    """One head's figures, as its metric (:attr:`~feature_store.heads.HeadSpec.metric`) has
    them."""

    def f(figure: str) -> str:
        return _fmt(figures.get(f"{spec.name}_{figure}", math.nan))

    samples = figures.get(f"{spec.name}_samples", math.nan)
    count = f"{int(samples):,} samples" if samples == samples else "no samples"
    if spec.metric == "auc":
        return (f"{spec.about} AUC {f('auc')} (popularity {f('baseline_auc')}, rate "
                f"{f('rate')}, {count})")
    return (f"{spec.about} rank correlation {f('spearman')} (popularity "
            f"{f('baseline_spearman')}), MAE {f('mae')} (popularity {f('baseline_mae')}, "
            f"{count})")


def summary(result: EvalResult) -> str:
    notes = []
    if result.shift_days:
        notes.append(f"Every timestamp was shifted by {result.shift_days:+,.1f} days (the data "
                     "predates limits.min_ts_ms; relative timing unchanged).")
    if result.rejected_rows:
        notes.append(f"{result.rejected_rows:,} rows rejected as invalid, e.g. "
                     + "; ".join(result.rejected_examples[:3]) + ".")
    notes += [s[0].upper() + s[1:] + "." for s in result.skipped]
    for m in result.models:
        if m.unscored_test_rows:
            notes.append(f"{m.name}: {m.unscored_test_rows:,} of the {result.test_rows:,} rows "
                         "of the last 20% have no score (left out of its figures).")
    epochs = ", ".join(f"{int(e['epoch'])}: {e['valid_auc']:.4f}" for e in result.offline_epochs)
    lines = [
        *notes,
        f"{result.events:,} events, {result.samples:,} labelled rows (positive rate "
        f"{result.positive_rate:.3f}); last 20%: {result.test_rows:,} rows "
        f"({result.test_moments:,} moments), {100 * result.new_test_users:.0f}% of their users "
        f"({100 * result.new_test_rows:.0f}% of the rows) absent from the first 80%.",
        f"Online AUC on the last 20%: {_goal(result)}.",
        *_heads(result),
        _ranking(result),
        f"Offline epochs (valid AUC): {epochs}; best {result.offline_best_epoch}.",
        f"Replay {result.online_seconds:.0f} s ({result.events_per_s:,.0f} events/s), offline "
        f"Wide&Deep {result.offline_seconds:.0f} s, total {result.seconds:.0f} s.",
    ]
    return "\n".join(lines)


def _labels(result: EvalResult, cfg: EvalConfig) -> str:
    if result.protocol == "loo" or result.negatives:
        feed = (
            f" Each view is preceded by its impression {IMPRESSION_LEAD_MS} ms before it and by "
            f"{result.negatives} impression{'s' if result.negatives > 1 else ''}, at the "
            "same moment, of videos sampled "
            "uniformly among those the user never touched; nothing follows those, so the "
            "trainer's joiner times them out into negatives (60 s of event time later)."
            if result.negatives else " No impressions were added: every sample is positive."
        )
        source = ("every rating one view (a `finish`, whatever the stars)"
                  if "MovieLens" in result.title else "every view a positive")
        return f"Labels: a positive-only log, {source}.{feed}"
    if "MovieLens" in result.title:
        return ("Labels: rating >= 4 is positive, one weighted sample per rating (the "
                "trainer's label policy set by settings, see `app/evaluation/stream.py`).")
    return "Labels: the trainer's default label policy (docs/training.md)."


def _ranker_and_mf(cfg: EvalConfig, where: str) -> str:
    """How the ranker-alone and matrix-factorisation rows rank (both protocols)."""
    return (
        f"The row \"{RANKER_ROW}\" orders the service's candidates (after its filters) by "
        "the model's probability alone, without the retrieval and co-visitation bonus and "
        "the rerank that the final ranking (`app/scoring/ranking.py`) adds; the row "
        f"\"{SEQUENCE_ROW}\" orders them by the served sequence tower's logit alone (the "
        "user's recent views in order, `trainer/sequence.py`), one of the terms the final "
        "ranking adds. Matrix "
        f"factorisation (`implicit`'s {cfg.mf.describe()}; `app/evaluation/factorization.py`, "
        "settings picked on a validation split by `bench/tune_mf.py`) is trained on the "
        "positive samples trained before the moment only, the user's factor solved at the "
        f"moment from all of their positives before it, and ranks {where}; a video without "
        "a positive before its last fit ranks last."
    )


def _ranking_method(result: EvalResult, cfg: EvalConfig) -> str:
    if result.protocol == "loo":
        candidates = (
            "every video of the catalog but those the user viewed before (the user's training "
            "items; the held-out video itself stays a candidate), as published "
            "sequential-recommendation results count HR@10 and NDCG@10 over all items"
            if result.full_ranking else
            f"{cfg.candidates} videos sampled uniformly among those the user never touched"
        )
        return (
            f"Ranking (leave-one-out): every user with two views or more has the last one "
            f"held out of the log; at its moment (when its impression would have been "
            f"logged) the service's `recommend` ranks `candidates=` that video and "
            f"{candidates}, with the network exported at most {cfg.export_every:,} events "
            f"earlier. Popularity ranks the same candidates by their positives before the "
            f"moment (decayed for recent popularity); co-occurrence by, for each video the "
            f"user liked before, the number of other users who liked both it and the "
            f"candidate before the moment, summed (`app/evaluation/baselines.py`). "
            f"{_ranker_and_mf(cfg, 'the same candidates')} Ties are broken by the "
            f"candidates' random order."
        )
    if not result.catalog:
        return "Ranking: not computed (no catalog)."
    return (
        f"Ranking: at {result.queries} sampled held-back positives (first positive of a "
        f"(user, video) pair in the last 20% of events), just before it is replayed, "
        f"`recommend` is asked for the user's top {result.k} with the service's clock at the "
        f"event's time (the network exported at most {cfg.export_every:,} events earlier); "
        f"the baselines rank every video by (decayed) positives, both excluding the videos "
        f"the service excluded (the user's watched history). "
        + _ranker_and_mf(cfg, "every video with a factor, minus those excluded")
    )


def method(result: EvalResult, cfg: EvalConfig) -> str:
    """How the figures were made (part of the generated section, so it stays true)."""
    users = (
        "; and, from `u.user`, the user's age group, gender and occupation, each also "
        "crossed with the genre (`features.user_attributes`, carried in the events' "
        "and requests' context; zip codes unused)"
        if result.user_attributes else "; no user attributes (none in the data)"
    )
    videos = (
        "movie, first genre (category), all genres (tags), release decade (in the creator "
        "column)" if "MovieLens" in result.title else
        "video and its catalog fields" if result.catalog else
        "video (no catalog: every video known by its id only)"
    )
    stars = stars_watched(result.positive_watch_ratio)
    watched = (f" (ratings >= {stars:g}: plays reaching features.positive_watch_ratio "
               f"{result.positive_watch_ratio:g})"
               if stars is not None and "MovieLens" in result.title
               and result.protocol != "loo" and not result.negatives else "")
    return f"""\
How: the dataset is replayed in event-time order through the embedded
deployment: the in-process event log (one partition), the real online
trainer consuming it in batches of {cfg.batch_size} events, each batch scored
*before* its training step (prequential, test-then-train), the signal feed
and the service. {_labels(result, cfg)} Features (the default schema): user,
{videos}, watched history{watched}, the video's counters so far, hour of
day{users}.

Rows: every model's "last 20%" figure is over the same {result.test_rows:,}
rows (the last 20% of the {result.samples:,} labelled rows by (ts, user,
video)); "per moment" counts one score per (user, video) moment instead of
one per labelled event (a view that ends in a finish and a like is one
moment, scored by its first sample), {result.test_moments:,} moments.
Popularity: smoothed positive rate of the video over everything before the
row; recent popularity: the same with counts decayed with a
{cfg.half_life_days:g}-day half-life (event time). Offline Wide&Deep: the same
features (as they stood at each event), network and optimizers, trained in
shuffled epochs on the first 70%, early-stopped on the next 10% (the last
eighth of the first 80%); its test scores are those of the best validation
epoch.

{_ranking_method(result, cfg)}"""


def markdown(
    result: EvalResult, cfg: EvalConfig, command: str, plot: str | None
) -> str:
    lines = _md(header(result), rows(result))
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
        "the offline model scores only the last 20%; times as replayed"
        + (f", shifted by {result.shift_days:+,.0f} days, see `app/evaluation/datasets.py`"
           if result.shift_days else "") + "):",
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
    for model in _curves(result):
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
