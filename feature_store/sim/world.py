"""A synthetic video world with known tastes: catalog, users and their events.

Why: online learning needs a stream whose signal is known. Here each user has
latent tastes over categories and a few favourite creators, videos have a
Zipf-distributed popularity and a quality, and whether a user plays a video,
how much of it they watch, and whether they like it all depend on how well
the video matches the user. A model that learns the match beats a model that
only knows which videos are popular; the tests and the benchmark rely on it,
and ``vidrec up --demo`` uses the same world to simulate users.

Deterministic by seed (numpy's PCG64): the same config gives the same
catalog and the same event stream, event ids included. Torch-free, so the
serving process can import it.

How a session unfolds (event times in ms):

- the user is shown ``impressions_per_session`` videos at once (a feed page,
  positions 0..K-1): half drawn by popularity, half from their favourite
  categories (what a recommender would surface);
- for each shown video, ``p(play) = sigmoid(1.6 * match - 1.2 - 0.08 * position)``;
  a played video gets a ``click`` a second later, then a ``play`` carrying
  ``watch_ms`` when the user stops watching (ratio rises with the match), a
  ``finish`` if they watched to the end, and a ``like`` with
  ``p = sigmoid(2 * match - 2.5)``. An unplayed video gets an explicit
  ``skip`` with probability 0.3, else nothing (its impression times out);
- ``match = 1.4 * taste(category) + 1.0 * favourite creator + quality + user
  bias``, with ``taste = clip(log(categories * dirichlet share), -3, 2)``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from feature_store.catalog.base import Video
from feature_store.events import Event, EventContext, EventType

_DEVICES = ("phone", "tv", "desktop", "tablet")
_OS = {"phone": ("android", "ios"), "tv": ("tizen", "webos"), "desktop": ("web",),
       "tablet": ("android", "ios")}
_COUNTRIES = ("US", "BR", "IN", "DE", "JP", "FR", "GB", "MX")
_SURFACES = ("home", "home", "home", "related", "search")
_SYLLABLES = ("ka", "lo", "mi", "ru", "te", "zo", "pa", "ni", "so", "ve", "da", "fu")
_SHARED_WORDS = ("live", "best", "new", "top", "full", "official", "short", "daily")


@dataclass(frozen=True)
class WorldConfig:
    """Size and shape of a synthetic world."""

    users: int = 2_000
    videos: int = 5_000
    creators: int = 300
    categories: int = 20
    tags_per_category: int = 6
    zipf_exponent: float = 1.1
    """Video popularity: the video of rank r is shown with weight r^-exponent."""
    taste_concentration: float = 0.3
    """Dirichlet alpha of a user's category shares; small = narrow tastes."""
    impressions_per_session: int = 8
    session_gap_ms: int = 500
    """Mean gap between session starts across the whole world (ms)."""
    start_ts: int = 1_700_000_000_000
    """Event time of the first session (ms since epoch)."""
    seed: int = 0


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class SyntheticWorld:
    """Catalog, users with ground-truth tastes, and their event stream."""

    def __init__(self, config: WorldConfig | None = None) -> None:
        self.config = cfg = config or WorldConfig()
        rng = np.random.default_rng(cfg.seed)
        c, k = cfg.categories, cfg.creators
        self.creator_category = rng.integers(0, c, size=k)
        creator_weight = 1.0 / np.arange(1, k + 1) ** 0.8
        creator_weight /= creator_weight.sum()
        self.video_creator = rng.choice(k, size=cfg.videos, p=creator_weight)
        own = rng.random(cfg.videos) < 0.85
        self.video_category = np.where(
            own, self.creator_category[self.video_creator], rng.integers(0, c, size=cfg.videos)
        )
        self.video_quality = rng.normal(0.0, 0.5, size=cfg.videos)
        self.video_duration_ms = np.clip(
            rng.lognormal(math.log(45_000), 0.7, size=cfg.videos), 8_000, 600_000
        ).astype(np.int64)
        self.video_uploaded = cfg.start_ts - rng.integers(3_600_000, 30 * 86_400_000, cfg.videos)
        ranks = rng.permutation(cfg.videos) + 1
        popularity = 1.0 / ranks.astype(np.float64) ** cfg.zipf_exponent
        self.video_popularity = popularity / popularity.sum()
        self.video_tags = [
            tuple(
                f"t{cat}_{t}"
                for t in sorted(set(rng.integers(0, cfg.tags_per_category, size=3).tolist()))
            )
            for cat in self.video_category.tolist()
        ]
        shares = rng.dirichlet(np.full(c, cfg.taste_concentration), size=cfg.users)
        self.user_taste = np.clip(np.log(shares * c + 1e-9), -3.0, 2.0)
        self.user_bias = rng.normal(0.0, 0.3, size=cfg.users)
        self.user_favourites = [
            set(rng.choice(k, size=3, replace=False).tolist()) for _ in range(cfg.users)
        ]
        activity = 1.0 / np.arange(1, cfg.users + 1) ** 0.5
        self.user_activity = rng.permutation(activity / activity.sum())
        self.user_device = rng.integers(0, len(_DEVICES), size=cfg.users)
        self.user_country = rng.integers(0, len(_COUNTRIES), size=cfg.users)
        self._by_category = [np.flatnonzero(self.video_category == i) for i in range(c)]
        self.video_titles = self._titles(np.random.default_rng(cfg.seed + 2))
        self._rng = np.random.default_rng(cfg.seed + 1)
        self._event_seq = 0

    def _titles(self, rng: np.random.Generator) -> list[str]:
        """A title per video: three words of its category's vocabulary and one shared
        word, so a title says something of the category (from its own generator, so the
        catalog and the stream are what they were before titles)."""
        cfg = self.config
        vocabulary = [[f"{_SYLLABLES[(c * 7 + k) % len(_SYLLABLES)]}{_SYLLABLES[k]}{c}"
                       for k in range(8)] for c in range(cfg.categories)]
        titles = []
        for category in self.video_category.tolist():
            own = rng.choice(vocabulary[category], size=3, replace=False).tolist()
            titles.append(" ".join([*own, _SHARED_WORDS[int(rng.integers(len(_SHARED_WORDS)))]]))
        return titles

    # --- ground truth -----------------------------------------------------

    def match(self, user: int, video: int) -> float:
        """How well ``video`` suits ``user`` (the latent score behind every reaction)."""
        favourite = 1.0 if int(self.video_creator[video]) in self.user_favourites[user] else 0.0
        return float(
            1.4 * self.user_taste[user, self.video_category[video]]
            + favourite
            + self.video_quality[video]
            + self.user_bias[user]
        )

    def play_probability(self, user: int, video: int, position: int = 0) -> float:
        return _sigmoid(1.6 * self.match(user, video) - 1.2 - 0.08 * position)

    # --- catalog ----------------------------------------------------------

    def videos(self) -> list[Video]:
        return [self.video(i) for i in range(self.config.videos)]

    def video(self, index: int) -> Video:
        return Video(
            video_id=f"v{index}",
            creator_id=f"c{int(self.video_creator[index])}",
            category=f"cat{int(self.video_category[index])}",
            tags=self.video_tags[index],
            duration_ms=int(self.video_duration_ms[index]),
            uploaded_at=int(self.video_uploaded[index]),
            title=self.video_titles[index],
        )

    @staticmethod
    def user_id(index: int) -> str:
        return f"u{index}"

    @staticmethod
    def video_index(video_id: str) -> int:
        return int(video_id[1:])

    # --- events -----------------------------------------------------------

    def _event(self, **fields: object) -> Event:
        self._event_seq += 1
        return Event(event_id=f"s{self.config.seed}-{self._event_seq}", **fields)  # type: ignore[arg-type]

    def context(self, user: int, surface: str, position: int) -> EventContext:
        device = _DEVICES[int(self.user_device[user])]
        os_choices = _OS[device]
        return EventContext(
            device=device,
            os=os_choices[user % len(os_choices)],
            country=_COUNTRIES[int(self.user_country[user])],
            surface=surface,
            position=position,
        )

    def respond(
        self, user: int, videos: list[int], ts_ms: int, surface: str = "home"
    ) -> list[Event]:
        """Events of ``user`` shown ``videos`` (in rank order) at ``ts_ms``, in time order."""
        rng = self._rng
        uid = self.user_id(user)
        events: list[Event] = []
        cursor = ts_ms
        for position, video in enumerate(videos):
            vid = f"v{video}"
            ctx = self.context(user, surface, position)
            events.append(self._event(user_id=uid, video_id=vid, type=EventType.IMPRESSION,
                                      ts=ts_ms, context=ctx))
            match = self.match(user, video)
            duration = int(self.video_duration_ms[video])
            if rng.random() < _sigmoid(1.6 * match - 1.2 - 0.08 * position):
                ratio = float(np.clip(_sigmoid(1.2 * match + rng.normal(0.0, 0.8)) * 1.15, 0.02, 1))
                watch = int(ratio * duration)
                cursor += 1_000
                events.append(self._event(user_id=uid, video_id=vid, type=EventType.CLICK,
                                          ts=cursor))
                cursor += watch
                events.append(self._event(user_id=uid, video_id=vid, type=EventType.PLAY,
                                          ts=cursor, watch_ms=watch, duration_ms=duration))
                if ratio >= 0.95:
                    events.append(self._event(user_id=uid, video_id=vid, type=EventType.FINISH,
                                              ts=cursor, watch_ms=watch, duration_ms=duration))
                if rng.random() < _sigmoid(2.0 * match - 2.5):
                    cursor += 500
                    events.append(self._event(user_id=uid, video_id=vid, type=EventType.LIKE,
                                              ts=cursor))
            elif rng.random() < 0.3:
                events.append(self._event(user_id=uid, video_id=vid, type=EventType.SKIP,
                                          ts=ts_ms + 1_500 + 200 * position))
        events.sort(key=lambda e: e.ts)  # stable: ties keep generation order
        return events

    def candidates(self, user: int, count: int) -> list[int]:
        """Half popular videos, half from the user's favourite categories, no repeats."""
        rng = self._rng
        popular = rng.choice(self.config.videos, size=count, p=self.video_popularity).tolist()
        tastes = self.user_taste[user]
        top = np.argsort(-tastes)[:3]
        chosen: list[int] = []
        for i in range(count):
            if i % 2 == 0:
                pool = self._by_category[int(top[rng.integers(0, len(top))])]
                chosen.append(int(pool[rng.integers(0, len(pool))]) if len(pool) else popular[i])
            else:
                chosen.append(int(popular[i]))
        return list(dict.fromkeys(chosen))

    def sessions(self) -> Iterator[list[Event]]:
        """Endless sessions, each a list of events; session starts increase."""
        cfg = self.config
        rng = self._rng
        ts = cfg.start_ts
        while True:
            ts += int(rng.exponential(cfg.session_gap_ms)) + 1
            user = int(rng.choice(cfg.users, p=self.user_activity))
            surface = _SURFACES[int(rng.integers(0, len(_SURFACES)))]
            yield self.respond(user, self.candidates(user, cfg.impressions_per_session), ts,
                               surface)

    def events(self, count: int) -> list[Event]:
        """The first ``count`` events of the stream, in event-time order."""
        heap: list[tuple[int, int, Event]] = []
        out: list[Event] = []
        order = 0
        for session in self.sessions():
            start = session[0].ts
            while heap and heap[0][0] <= start and len(out) < count:
                out.append(heapq.heappop(heap)[2])
            if len(out) >= count:
                break
            for event in session:
                order += 1
                heapq.heappush(heap, (event.ts, order, event))
        return out
