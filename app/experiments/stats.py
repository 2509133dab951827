"""Per-arm figures with 95% confidence intervals, from the feed's totals.

- **CTR** and **finishes per impression** are proportions (an impression was
  clicked or played, or not; finished or not): **Wilson score** intervals,
  which stay inside [0, 1] and behave at small counts and rates near 0, where
  the textbook normal (Wald) interval does not.
- **Watch time per impression** is a mean of a skewed quantity (many zeros, a
  long tail): a **normal interval** on the mean, mean ± 1.96·s/√n with the
  sample standard deviation s from the sums of the watch and its square. By
  the central limit theorem it is right once an arm has a few hundred
  impressions; a bootstrap would need every impression kept, which the
  feed's bounded totals do not do.
- **Against the control** (the first arm): the difference of each other
  arm's figure with the control's, with Newcombe's hybrid score interval for
  proportions (built from the two Wilson intervals) and the unpooled
  (Welch) normal interval for means. An interval that excludes 0 is a
  difference at the 5% level for that one figure; looking at several
  figures, or at the same figures every few seconds, makes a false winner
  more likely than 5%: decide on a sample size before the experiment.
"""

from __future__ import annotations

import math
from typing import Any

from app.experiments.tally import Totals
from feature_store.experiments import Experiment

Z = 1.959963984540054
"""Two-sided 95% normal quantile."""

Interval = tuple[float, float, float] | None
"""(estimate, low, high), or None without data."""


def wilson(successes: int, trials: int, z: float = Z) -> Interval:
    """Wilson score interval of a proportion."""
    if trials <= 0:
        return None
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return p, max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(total: float, squares: float, n: int, z: float = Z) -> Interval:
    """Normal interval of a mean from the sum and the sum of squares of ``n`` values."""
    if n <= 0:
        return None
    mean = total / n
    if n < 2:
        return mean, math.nan, math.nan
    variance = max(0.0, (squares - total * total / n) / (n - 1))
    half = z * math.sqrt(variance / n)
    return mean, mean - half, mean + half


def _variance(total: float, squares: float, n: int) -> float:
    return max(0.0, (squares - total * total / n) / (n - 1)) if n > 1 else math.nan


def newcombe(arm: Interval, control: Interval) -> Interval:
    """Difference of two proportions (arm - control), Newcombe's hybrid score interval."""
    if arm is None or control is None:
        return None
    p1, l1, u1 = arm
    p2, l2, u2 = control
    diff = p1 - p2
    return (
        diff,
        diff - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
        diff + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2),
    )


def welch(arm: Totals, control: Totals, scale: float, z: float = Z) -> Interval:
    """Difference of the mean watch (arm - control), unpooled normal interval."""
    n1, n2 = arm.impressions, control.impressions
    if n1 < 2 or n2 < 2:
        return None
    diff = (arm.watch_ms / n1 - control.watch_ms / n2) * scale
    spread = math.sqrt(
        _variance(arm.watch_ms, arm.watch_sq, n1) / n1
        + _variance(control.watch_ms, control.watch_sq, n2) / n2
    )
    return diff, diff - z * spread * scale, diff + z * spread * scale


def _scaled(interval: Interval, scale: float) -> Interval:
    return None if interval is None else tuple(v * scale for v in interval)  # type: ignore[return-value]


def _figure(interval: Interval) -> dict[str, float] | None:
    if interval is None:
        return None
    value, low, high = interval
    return {"value": value, "low": low, "high": high}


def summarize(experiment: Experiment, totals: dict[str, Totals]) -> list[dict[str, Any]]:
    """One row per arm (the control first): counts, the three figures with their
    intervals, and each figure's difference with the control's."""
    control = totals.get(experiment.arms[0].name, Totals())
    control_ctr = wilson(control.clicks, control.impressions)
    control_finish = wilson(control.finishes, control.impressions)
    rows = []
    for i, arm in enumerate(experiment.arms):
        t = totals.get(arm.name, Totals())
        ctr = wilson(t.clicks, t.impressions)
        finish = wilson(t.finishes, t.impressions)
        row: dict[str, Any] = {
            "arm": arm.name, "family": arm.family, "weight": arm.weight,
            "impressions": t.impressions, "clicks": t.clicks, "finishes": t.finishes,
            "watch_s": t.watch_ms / 1000,
            "ctr": _figure(ctr),
            "finish_rate": _figure(finish),
            "watch_s_per_impression": _figure(
                _scaled(mean_interval(t.watch_ms, t.watch_sq, t.impressions), 1e-3)
            ),
        }
        if i > 0:
            row["vs_control"] = {
                "ctr": _figure(newcombe(ctr, control_ctr)),
                "finish_rate": _figure(newcombe(finish, control_finish)),
                "watch_s_per_impression": _figure(welch(t, control, 1e-3)),
            }
        rows.append(row)
    return rows
