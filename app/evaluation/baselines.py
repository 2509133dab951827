"""Baselines, scored test-then-train on the trainer's own samples.

:class:`Popularity` keeps, per video, its positives and its samples, either
plain counts (global popularity) or exponentially decayed ones with a
half-life in event time (recent popularity). Its probability is the smoothed
positive rate ``(pos + m * p) / (n + m)``, with ``p`` the stream's positive
rate so far and ``m`` the prior strength, read *before* the sample is
counted, so it is prequential like the online model. Its ranking is by
positives (decayed or not): "what most people liked (lately)".

:class:`CoOccurrence` ranks a user's candidates by how often other users
liked them together with what this user liked before: item-to-item
co-occurrence ("people who liked X also liked Y"), counted from positive
samples trained before the moment (see the class).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np
import numpy.typing as npt

from app.evaluation.metrics import Floats


class Popularity:
    """Smoothed positive rate per video, optionally decayed; see the module doc."""

    def __init__(self, half_life_ms: float | None = None, prior_strength: float = 10.0) -> None:
        self.rate = math.log(2) / half_life_ms if half_life_ms else 0.0
        self.prior = prior_strength
        self.pos: dict[str, float] = {}
        self.n: dict[str, float] = {}
        self.seen_at: dict[str, int] = {}
        self.total_pos = 0.0
        self.total = 0.0

    def _decayed(self, video: str, ts: int) -> tuple[float, float]:
        pos, n = self.pos.get(video, 0.0), self.n.get(video, 0.0)
        if self.rate and n:
            f = math.exp(-self.rate * max(0, ts - self.seen_at[video]))
            pos, n = pos * f, n * f
        return pos, n

    def score(self, video: str, ts: int) -> float:
        prior = (self.total_pos + 1.0) / (self.total + 2.0)
        pos, n = self._decayed(video, ts)
        return (pos + self.prior * prior) / (n + self.prior)

    def update(self, video: str, ts: int, label: float) -> None:
        pos, n = self._decayed(video, ts)
        self.pos[video], self.n[video], self.seen_at[video] = pos + label, n + 1.0, ts
        self.total_pos += label
        self.total += 1.0

    def positives(self, videos: Sequence[str], ts: int) -> Floats:
        """(Decayed) positives of each of ``videos`` at ``ts``: the ranking score."""
        return np.fromiter((self._decayed(v, ts)[0] for v in videos), np.float64, len(videos))

    def top(self, k: int, ts: int, exclude: Collection[str]) -> list[str]:
        """The ``k`` videos with the most (decayed) positives at ``ts``, minus ``exclude``."""
        videos = list(self.pos)
        if not videos:
            return []
        weight = np.fromiter((self.pos[v] for v in videos), np.float64, len(videos))
        if self.rate:
            age = np.fromiter((ts - self.seen_at[v] for v in videos), np.float64, len(videos))
            weight = weight * np.exp(-self.rate * np.maximum(age, 0.0))
        order = np.argsort(-weight, kind="stable")
        out: list[str] = []
        for i in order.tolist():
            if videos[i] not in exclude:
                out.append(videos[i])
                if len(out) == k:
                    break
        return out


def prequential(
    model: Popularity,
    video_ids: Sequence[str],
    ts_ms: Sequence[int],
    labels: Floats,
    stops: dict[int, list[int]] | None = None,
    on_stop: object = None,
) -> Floats:
    """Score each sample before counting it; ``stops`` maps a sample index to query ids."""
    scores = np.empty(len(video_ids))
    for i, (video, ts, label) in enumerate(zip(video_ids, ts_ms, labels, strict=True)):
        if stops and i in stops and callable(on_stop):
            for query in stops[i]:
                on_stop(query)
        scores[i] = model.score(video, int(ts))
        model.update(video, int(ts), float(label))
    if stops and callable(on_stop):
        for query in stops.get(len(video_ids), []):
            on_stop(query)
    return scores


class CoOccurrence:
    """Item co-occurrence over the positive samples, as of any sample index.

    What is counted: for a user ``u`` asked at sample index ``t`` (samples
    ``[0, t)`` trained before the moment), ``H`` is the set of videos ``u``
    had a positive sample on before ``t``; a candidate ``c`` scores

        sum over other users w of |H ∩ P_w| * [c in P_w]

    where ``P_w`` is the set of videos ``w`` had a positive sample on before
    ``t``: for each earlier video ``h`` of ``u``, the number of other users
    who liked both ``h`` and ``c`` before the moment, summed over ``h``.
    Each (user, video) pair counts once, from its first positive sample;
    the user's own likes never count (a re-watched candidate gains nothing
    from its own history). Raw counts, not normalised: popular candidates
    co-occur more, as they do in a "people also liked" list.
    """

    def __init__(self, user_ids: Sequence[str], video_ids: Sequence[str],
                 positive: npt.NDArray[np.bool_]) -> None:
        codes: dict[str, int] = {}
        by_video: dict[str, tuple[list[int], list[int]]] = {}
        self.by_user: dict[str, list[tuple[int, str]]] = {}
        seen: set[tuple[str, str]] = set()
        for i in np.flatnonzero(positive).tolist():
            user, video = user_ids[i], video_ids[i]
            if (user, video) in seen:
                continue
            seen.add((user, video))
            code = codes.setdefault(user, len(codes))
            users, at = by_video.setdefault(video, ([], []))
            users.append(code)
            at.append(i)
            self.by_user.setdefault(user, []).append((i, video))
        self.codes = codes
        self.by_video = {
            v: (np.asarray(u, dtype=np.int64), np.asarray(a, dtype=np.int64))
            for v, (u, a) in by_video.items()
        }

    def _likers(self, video: str, before: int) -> npt.NDArray[np.int64]:
        found = self.by_video.get(video)
        if found is None:
            return np.zeros(0, dtype=np.int64)
        users, at = found
        return users[: int(np.searchsorted(at, before))]

    def scores(self, user: str, candidates: Sequence[str], before: int) -> Floats:
        """Each candidate's co-occurrence score for ``user`` at sample index ``before``."""
        overlap = np.zeros(len(self.codes), dtype=np.float64)
        """Per other user: how many of ``user``'s earlier videos they liked (before)."""
        for at, video in self.by_user.get(user, ()):
            if at >= before:
                break
            overlap[self._likers(video, before)] += 1.0
        own = self.codes.get(user)
        if own is not None:
            overlap[own] = 0.0
        return np.fromiter(
            (overlap[self._likers(c, before)].sum() for c in candidates),
            np.float64, len(candidates),
        )
