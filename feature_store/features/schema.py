"""The feature schema: which columns the model has, and its fingerprint.

The schema's hash is written into every exported model's manifest; the
server refuses to serve a model whose schema differs from its own, because
its keys and index tensors would not mean what the model learnt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import cached_property

from feature_store.errors import ConfigurationError
from feature_store.features.columns import (
    Attention,
    Categorical,
    Column,
    Crossed,
    Dense,
    Dot,
    MultiValued,
)
from feature_store.features.sources import declared
from feature_store.settings import FeatureSettings

WIDE_TABLE = "wide"
"""Sparse table holding every wide (FTRL) weight, one float per key."""


@dataclass(frozen=True)
class FeatureSchema:
    """An ordered, validated set of columns."""

    columns: tuple[Column, ...]
    history_len: int = 20
    """History entries the model reads (``features.history_in_model``): the user's
    most recent ones, cut once by whoever builds the feature rows (the trainer's
    moments, the service's request), so both see the same entries."""

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"duplicate column names in {names}")
        categorical = {c.name for c in self.categorical}
        for col in self.columns:
            if isinstance(col, Categorical):
                declared(col.source, "categorical", col.name)
            elif isinstance(col, MultiValued):
                declared(col.source, "multi", col.name)
            elif isinstance(col, Dense):
                declared(col.source, "dense", col.name)
            if isinstance(col, Crossed) and not set(col.columns) <= categorical:
                raise ConfigurationError(f"{col.name}: crosses must name categorical columns")
        for block in self.attention:
            self._check_attention(block)
        for dot in self.dots:
            self._check_dot(dot)
        dims: dict[str, int] = {}
        for col in self.embedded:
            table = col.table_name()
            if table == WIDE_TABLE:
                raise ConfigurationError(f"{col.name}: table name {WIDE_TABLE!r} is reserved")
            if dims.setdefault(table, col.dim) != col.dim:
                raise ConfigurationError(f"{col.name}: table {table!r} shared with another dim")

    def _check_attention(self, block: Attention) -> None:
        """Refuse a block the model could not build (see :class:`Attention`)."""
        multi = {c.name: c for c in self.multi_valued}
        categorical = {c.name: c for c in self.categorical}
        sequence = [multi.get(n) for n in (*block.keys, *block.extras)]
        if not block.keys or None in sequence:
            raise ConfigurationError(
                f"{block.name}: keys and extras must name multi-valued columns, at least one key"
            )
        lengths = {c.max_len for c in sequence if c is not None}
        if len(lengths) != 1 or any(c.pooling != "attention" for c in sequence if c):
            raise ConfigurationError(
                f"{block.name}: its columns need pooling='attention' and one max_len"
            )
        if len(block.queries) != len(block.keys):
            raise ConfigurationError(f"{block.name}: one query column per key column")
        for key, query in zip(block.keys, block.queries, strict=True):
            q = categorical.get(query)
            if q is None or q.table_name() != multi[key].table_name():
                raise ConfigurationError(
                    f"{block.name}: query {query!r} must be a categorical column in the "
                    f"table of key {key!r}"
                )
        if block.width % block.heads:
            raise ConfigurationError(f"{block.name}: width must be a multiple of heads")

    def _check_dot(self, dot: Dot) -> None:
        embedded = {c.name: c for c in self.embedded}
        found = [embedded.get(name) for name in dot.columns]
        ok = all(c is not None and not (isinstance(c, MultiValued) and c.pooling == "attention")
                 for c in found)
        if not ok or len({c.dim for c in found if c is not None}) != 1:
            raise ConfigurationError(
                f"{dot.name}: a dot takes two embedded (not attention) columns of one width"
            )

    # The views below are computed once per schema (its columns are a tuple of frozen
    # dataclasses): a request reads them a few dozen times (the features, the ONNX feed),
    # and each pass over the columns cost microseconds. Each call returns its own list.

    @property
    def dots(self) -> list[Dot]:
        return list(self._dots)

    @cached_property
    def _dots(self) -> tuple[Dot, ...]:
        return tuple(c for c in self.columns if isinstance(c, Dot))

    @property
    def attention(self) -> list[Attention]:
        return list(self._attention)

    @cached_property
    def _attention(self) -> tuple[Attention, ...]:
        return tuple(c for c in self.columns if isinstance(c, Attention))

    @property
    def categorical(self) -> list[Categorical]:
        return list(self._categorical)

    @cached_property
    def _categorical(self) -> tuple[Categorical, ...]:
        return tuple(c for c in self.columns if isinstance(c, Categorical))

    @property
    def multi_valued(self) -> list[MultiValued]:
        return list(self._multi_valued)

    @cached_property
    def _multi_valued(self) -> tuple[MultiValued, ...]:
        return tuple(c for c in self.columns if isinstance(c, MultiValued))

    @property
    def embedded(self) -> list[Categorical | MultiValued]:
        """Columns with an embedding, in schema order (the deep part's inputs)."""
        return list(self._embedded)

    @cached_property
    def _embedded(self) -> tuple[Categorical | MultiValued, ...]:
        return tuple(c for c in self.columns if isinstance(c, Categorical | MultiValued))

    @property
    def crossed(self) -> list[Crossed]:
        return list(self._crossed)

    @cached_property
    def _crossed(self) -> tuple[Crossed, ...]:
        return tuple(c for c in self.columns if isinstance(c, Crossed))

    @property
    def dense(self) -> list[Dense]:
        return list(self._dense)

    @cached_property
    def _dense(self) -> tuple[Dense, ...]:
        return tuple(c for c in self.columns if isinstance(c, Dense))

    @property
    def wide_width(self) -> int:
        """Wide keys per row: wide categorical columns plus crosses."""
        return sum(1 for c in self.categorical if c.wide) + len(self.crossed)

    def table_dims(self) -> dict[str, int]:
        """Embedding tables and their row width, in first-use order."""
        return dict(self._table_dims)

    @cached_property
    def _table_dims(self) -> dict[str, int]:
        # The attention blocks and dots were checked when the schema was made.
        dims: dict[str, int] = {}
        for col in self.embedded:
            dims.setdefault(col.table_name(), col.dim)
        return dims

    def describe(self) -> list[dict[str, object]]:
        return [{"kind": type(c).__name__, **asdict(c)} for c in self.columns]

    def schema_hash(self) -> str:
        """sha256 of the canonical JSON of the columns and the history length (first
        16 hex digits)."""
        described: list[object] = [*self.describe(), {"history_len": self.history_len}]
        text = json.dumps(described, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


RECENT_VIEWS = 5
"""Valued videos in the ``recent`` column, newest first; its dot with the candidate's row
is the ranker's "like what they just watched" term. Measured on ml-100k leave-one-out
(docs/benchmarks.md, *Personal feeds*): the ranker alone's HR@10 0.5408 without it,
0.5684 with it (matrix factorisation 0.5429)."""


USER_ATTRIBUTE_COLUMNS: tuple[Column, ...] = (
    Categorical("age_group", "age_group", dim=4),
    Categorical("gender", "gender", dim=4),
    Categorical("occupation", "occupation", dim=4),
    Crossed("age_group_x_category", ("age_group", "category")),
    Crossed("gender_x_category", ("gender", "category")),
    Crossed("occupation_x_category", ("occupation", "category")),
)
"""Columns added by ``features.user_attributes`` (appended: the others keep their order)."""


def sequence_columns(length: int) -> tuple[Column, ...]:
    """The user's ``length`` most recent actions, attended by the candidate (DIN-style):
    each position's video, creator and category rows (the candidate's own tables) and
    an embedding of its action and age (see :class:`~feature_store.features.columns.Attention`)."""
    return (
        MultiValued("seq_video", "recent_videos", dim=16, max_len=length, table="video",
                    pooling="attention"),
        MultiValued("seq_creator", "recent_creators", dim=16, max_len=length, table="creator",
                    pooling="attention"),
        MultiValued("seq_category", "recent_categories", dim=8, max_len=length,
                    table="category", pooling="attention"),
        MultiValued("seq_action", "recent_actions", dim=8, max_len=length, pooling="attention"),
        Attention(
            "interest",
            keys=("seq_video", "seq_creator", "seq_category"),
            queries=("video", "creator", "category"),
            extras=("seq_action",),
        ),
    )


def default_schema(features: FeatureSettings | None = None) -> FeatureSchema:
    """vidrec's standard Wide&Deep columns for video recommendation."""
    features = features or FeatureSettings()
    history_len = features.history_in_model
    extra = USER_ATTRIBUTE_COLUMNS if features.user_attributes else ()
    return FeatureSchema(
        columns=(
            Categorical("user", "user_id", dim=16),
            Categorical("video", "video_id", dim=16),
            Categorical("creator", "creator_id", dim=16),
            Categorical("category", "category", dim=8),
            Categorical("device", "device", dim=4),
            Categorical("os", "os", dim=4, wide=False),
            Categorical("country", "country", dim=4),
            Categorical("surface", "surface", dim=4),
            Categorical("hour", "hour_of_day", dim=4),
            Categorical("position", "position_bucket", dim=4),
            Categorical("duration", "duration_bucket", dim=4),
            MultiValued("tags", "tags", dim=8, max_len=8),
            MultiValued("title", "title_tokens", dim=8, max_len=16),
            # Shares the video table: a watched video and a candidate video
            # are the same row, so history pooling speaks the video's language.
            MultiValued("history", "history_videos", dim=16, max_len=history_len, table="video"),
            # The last few valued videos alone: what the user is watching *now* (the
            # next view on ml-100k resembles the last ones more than the 20-view mean).
            MultiValued("recent", "history_videos", dim=16, max_len=RECENT_VIEWS, table="video"),
            *sequence_columns(history_len),
            Dot("user_dot_video", ("user", "video")),
            Dot("history_dot_video", ("history", "video")),
            Dot("recent_dot_video", ("recent", "video"), initial_scale=0.1),
            Crossed("user_x_category", ("user", "category")),
            Crossed("user_x_creator", ("user", "creator")),
            Crossed("video_x_device", ("video", "device")),
            Crossed("video_x_surface", ("video", "surface")),
            Crossed("category_x_hour", ("category", "hour")),
            Crossed("country_x_video", ("country", "video")),
            Dense("video_age", "video_age_log_hours"),
            Dense("duration_s", "duration_log_s"),
            Dense("log_engagements", "log_engagements"),
            Dense("log_impressions", "log_impressions"),
            Dense("finish_rate", "finish_rate"),
            Dense("like_rate", "like_rate"),
            Dense("skip_rate", "skip_rate"),
            Dense("history_length", "history_length_log"),
            Dense("recency", "recency_log_hours"),
            Dense("category_engaged", "category_engaged_log"),
            Dense("category_rejected", "category_rejected_log"),
            Dense("creator_engaged", "creator_engaged_log"),
            Dense("creator_rejected", "creator_rejected_log"),
            *extra,
        ),
        history_len=history_len,
    )
