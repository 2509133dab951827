"""Feature sources: the one declaration of where each feature value comes from.

A column of the schema (:mod:`feature_store.features.columns`) names a
*source*; a source is one function plus its declaration, registered here
with :func:`source`:

- ``kind``: ``categorical`` (one string per row, hashed to a key),
  ``multi`` (a list of strings per row) or ``dense`` (a number per row,
  computed column-wise over :class:`~feature_store.features.dense.DenseInputs`);
- ``reads``: the scopes its value depends on (:class:`Scope`);
- ``fields``: the catalog fields it reads (:class:`~feature_store.catalog.base.Video`
  attributes), required exactly when it reads :attr:`Scope.VIDEO`.

Everything that must agree between training and serving is derived from these
declarations instead of being kept in step by hand:

- the trainer's extractor evaluates each source on rows of
  :class:`~feature_store.features.columns.FeatureRow`;
- the request extractor (``app/scoring/features.py``) computes a source once
  per request when it reads no video (:attr:`Source.per_request`), once per
  video and caches it in the video's row when it reads only the video
  (:attr:`Source.per_video`), and otherwise (dense sources mixing the clock
  and the video) per request over arrays;
- the video rows' fingerprint (:func:`video_fields`): a catalog edit of any
  declared field gives the video a fresh row, so cached keys never go stale;
- the numeric catalog fields dense sources see (:func:`dense_fields`): a dense
  source reads only what it declared, by construction;
- the served log's split of a row into the part shared by every item of a
  response and the part per item (:mod:`feature_store.features.rows`).

A schema naming a source that is not declared, or declared with another kind,
fails at start (:func:`declared`, called by the schema's validation) with an
error that names the column and the source.

Categorical and multi-valued sources read either the request and the user or
one video's catalog fields, never both and never the counters: the value of
an interaction belongs in a :class:`~feature_store.features.columns.Crossed`
column, and a key that changed with every counter update could not be cached
per video. Dense sources may read anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from feature_store.errors import ConfigurationError

if TYPE_CHECKING:
    from feature_store.features.columns import Categorical, Dense, MultiValued
    from feature_store.features.schema import FeatureSchema

Kind = Literal["categorical", "multi", "dense"]

F = TypeVar("F", bound=Callable[..., Any])


class Scope(StrEnum):
    """What a feature value may depend on."""

    REQUEST = "request"
    """The user id, the request's (or event's) context and the clock (``ts_ms``)."""
    USER = "user"
    """The user's recent history."""
    VIDEO = "video"
    """The video's catalog record: only the fields the source declares."""
    VIDEO_STATS = "video_stats"
    """The video's counters (impressions, plays, likes...)."""
    AFFINITY = "affinity"
    """What the user's recent actions (the history the model reads) say about the
    video's category and creator: counts of positive and negative entries of the same
    category, of the same creator (:data:`~feature_store.features.dense.AFFINITY_FIELDS`).
    Dense sources only; the extractors count them (per user, not per candidate)."""


VIDEO_SCOPES = frozenset({Scope.VIDEO, Scope.VIDEO_STATS})
REQUEST_SCOPES = frozenset({Scope.REQUEST, Scope.USER})
AFFINITY_FIELDS_READ = ("category", "creator_id")
"""The catalog fields behind :attr:`Scope.AFFINITY` (part of the video rows' fingerprint)."""


@dataclass(frozen=True)
class Source:
    """A declared feature source (see the module docstring)."""

    name: str
    kind: Kind
    reads: frozenset[Scope]
    fields: tuple[str, ...]
    """Catalog fields read, in declaration order."""
    compute: Callable[..., Any]
    """``FeatureRow -> str`` (categorical), ``FeatureRow -> list[str]`` (multi) or
    ``DenseInputs -> float64 array`` (dense)."""

    @property
    def per_request(self) -> bool:
        """Reads nothing of the video: one value serves every candidate of a request."""
        return not self.reads & (VIDEO_SCOPES | {Scope.AFFINITY})

    @property
    def per_video(self) -> bool:
        """Reads only the video (record, counters): its value can be cached per video."""
        return self.reads <= VIDEO_SCOPES


SOURCES: dict[str, Source] = {}
"""Every declared source by name (filled by :func:`source` at import)."""


def _video_field_names() -> dict[str, Any]:
    from feature_store.catalog.base import Video

    return {name: info.annotation for name, info in Video.model_fields.items()}


def source(
    name: str, kind: Kind, reads: Iterable[Scope], fields: Iterable[str] = ()
) -> Callable[[F], F]:
    """Register the decorated function as source ``name`` (see the module docstring).

    Refuses, at import, a declaration that serving could not honour: an unknown
    catalog field, fields without :attr:`Scope.VIDEO` (or the reverse), a
    categorical or multi-valued source mixing the video with the request, or
    reading the counters; a dense source reading a non-numeric field.
    """
    scopes = frozenset(Scope(s) for s in reads)
    declared_fields = tuple(fields)
    if kind not in get_args(Kind):
        raise ConfigurationError(f"source {name!r}: unknown kind {kind!r}")
    known = _video_field_names()
    unknown = [f for f in declared_fields if f not in known]
    if unknown:
        raise ConfigurationError(f"source {name!r}: {unknown} are not catalog fields")
    if (Scope.VIDEO in scopes) != bool(declared_fields):
        raise ConfigurationError(
            f"source {name!r}: declare the catalog fields read exactly when it reads the video"
        )
    if kind != "dense" and Scope.AFFINITY in scopes:
        raise ConfigurationError(f"source {name!r}: only dense sources read the affinity")
    if kind != "dense" and not (scopes <= REQUEST_SCOPES or scopes == {Scope.VIDEO}):
        raise ConfigurationError(
            f"source {name!r}: a {kind} source reads the request and user, or the video's "
            "catalog fields, not both nor the counters (cross two columns for an interaction)"
        )
    if kind == "dense":
        text = [f for f in declared_fields if known[f] not in (int, float)]
        if text:
            raise ConfigurationError(f"source {name!r}: dense sources read numbers, not {text}")
    if not scopes:
        raise ConfigurationError(f"source {name!r}: declare what it reads")

    def register(fn: F) -> F:
        if name in SOURCES:
            raise ConfigurationError(f"source {name!r} is declared twice")
        SOURCES[name] = Source(name, kind, scopes, declared_fields, fn)
        return fn

    return register


def declared(name: str, kind: Kind, column: str) -> Source:
    """The declaration of source ``name`` used by ``column``; a clear error if there is none."""
    found = SOURCES.get(name)
    if found is None:
        raise ConfigurationError(
            f"column {column!r}: source {name!r} is not declared (declare it with "
            "feature_store.features.sources.source; known: "
            f"{sorted(n for n, s in SOURCES.items() if s.kind == kind)})"
        )
    if found.kind != kind:
        raise ConfigurationError(
            f"column {column!r}: source {name!r} is a {found.kind} source, not {kind}"
        )
    return found


def video_fields(schema: FeatureSchema) -> tuple[str, ...]:
    """Catalog fields any of the schema's sources reads, in first-use order.

    The serving video rows compare these to decide whether an edited catalog
    record needs a fresh row (its cached keys and values would be stale).
    """
    out: dict[str, None] = {}
    columns: list[Categorical | MultiValued | Dense] = [
        *schema.categorical, *schema.multi_valued, *schema.dense
    ]
    for col in columns:
        declared = SOURCES[col.source]
        out.update(dict.fromkeys(declared.fields))
        if Scope.AFFINITY in declared.reads:
            out.update(dict.fromkeys(AFFINITY_FIELDS_READ))
    return tuple(out)


def dense_fields(schema: FeatureSchema) -> tuple[str, ...]:
    """Numeric catalog fields the schema's dense sources read, in first-use order."""
    out: dict[str, None] = {}
    for col in schema.dense:
        out.update(dict.fromkeys(SOURCES[col.source].fields))
    return tuple(out)
