"""Request and response bodies of the HTTP API (what ``/docs`` shows).

Every request model forbids unknown fields, so a typo is a 422 naming the
field rather than a silently ignored option. Events and videos arrive as raw
JSON objects and are validated one by one (``feature_store.events``,
``feature_store.catalog``), so one bad item does not sink its batch; the
document still describes each item (the ``Event`` and ``Video`` components,
added with their configured limits by :mod:`app.openapi`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
)

from feature_store.catalog.base import Video
from feature_store.events import ID_CHARSET, INTEGRAL, EventContext


class _Request(BaseModel):
    # strict: JSON's types as the schema says them ("5" is not an integer, 1 not a boolean)
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


class _Response(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)


class Filters(_Request):
    categories: list[str] | None = Field(None, max_length=100)
    """Only videos of these categories."""
    max_duration_ms: Annotated[int, Field(gt=0), INTEGRAL] | None = None
    """Only videos at most this long, ms."""


CandidateId = Annotated[
    str, StringConstraints(min_length=1, max_length=1024, pattern=ID_CHARSET.pattern)
]
"""A video id in the charset the catalog accepts, checked by pydantic-core while parsing
(500 ids: about 40 us less than a regex pass afterwards). ``limits.max_id_length``
is checked after parsing (:meth:`app.recommender.Recommender.validate`)."""


class RecommendRequest(_Request):
    user_id: str = Field(min_length=1, max_length=1024)
    count: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    """Items wanted (default ``api.default_count``, at most ``api.max_count``)."""
    candidates: list[CandidateId] | None = None
    """Video ids to rank; without them the service retrieves its own."""
    context: EventContext = EventContext()
    exclude_seen: bool = True
    """Drop videos in the user's recent history."""
    exclude_served: bool | None = None
    """Drop videos served to the user within ``rerank.served_window_s`` that got no
    engagement (None: the ``rerank.exclude_served`` setting)."""
    filters: Filters = Filters()
    explain: bool = False
    """Add an ``explanation`` to each item and to the response: why it was shown (its
    sources, each head's probability, the bonus terms, what the rerank did). Costs every
    head's output and a larger response; for debugging and support tools."""


class RerankNote(_Response):
    """What the rerank did to one item (docs/rerank.md)."""

    new_video: bool = False
    """Exposure below ``rerank.new_video_impressions``: scored its prior moved by the
    user's lifts, blending into the model's score with exposure."""
    prior: float | None = None
    """A new video's calibrated posterior mean."""
    lift: float | None = None
    """A new video's lift: log-odds of the model's score for this user minus for an
    anonymous user."""
    own_lift: float | None = None
    """A new video's own lift: log-odds of the user's shrunk share of positive entries in
    its category and creator against their share overall (0 without a history)."""
    explored: bool = False
    """Took one of the ``rerank.exploration_budget`` slots (Thompson sampling)."""
    creator_factor: float | None = None
    """The factor the score was multiplied by because the user disliked the creator."""


class ItemExplanation(_Response):
    """Why one item was shown (``explain: true``)."""

    sources: list[str]
    """Every candidate source that proposed the video (``request``: the caller's)."""
    heads: dict[str, float]
    """Each ranking head's prediction (engagement, watch, negative) the version has."""
    model_score: float
    """The heads fused (``api.ranking_weights`` or the experiment arm's), before the rerank."""
    affinity_bonus: float
    """``retrieval_weight * (cosine - best cosine)``: the two-tower term of the ranking."""
    covisit_bonus: float
    """``covisit_weight * log1p(co-visitation cosine / 0.1)``: the co-visitation term."""
    sequence_bonus: float = 0.0
    """``sequence_weight * (logit - best logit)``: the sequence tower's term (0 when the
    version has none or the user has no view it knows)."""
    factorization_bonus: float = 0.0
    """``factorization_weight * (standardised score - best)``: the live matrix
    factorisation's term (0 when the user or the video has no factor yet)."""
    ranking: float
    """The sort key: ``log(score) + affinity_bonus + covisit_bonus + sequence_bonus +
    factorization_bonus``."""
    rerank: RerankNote


class ResponseExplanation(_Response):
    """What applies to every item of an explained response."""

    fusion: dict[str, float]
    """The weights over the heads that made ``model_score``."""
    retrieval_weight: float
    covisit_weight: float
    sequence_weight: float = 0.0
    factorization_weight: float = 0.0
    candidates: int
    """Candidates scored (after the filters)."""
    excluded: int
    """Candidates the rerank excluded (disliked; served without engagement)."""


class RecommendItem(_Response):
    video_id: str
    score: float
    """Predicted probability of a positive outcome (0..1: the ranking heads' fusion,
    ``api.ranking_weights``, after the rerank's adjustments); 0 in fallbacks without a
    model. Not the sort key: ``items`` come in the ranking order, which adds the
    retrieval and co-visitation bonuses, exploration slots and the creator cap, so an
    item may follow one with a lower score."""
    source: str
    """Candidate source: embedding, covisit, categories, creators, trending, fresh or
    request (the first of several that proposed it)."""
    explanation: ItemExplanation | None = None
    """Why it was shown (with ``explain: true`` only)."""


class ExperimentArm(_Response):
    id: str
    """The experiment (``docs/experiments.md``)."""
    arm: str
    """The user's arm: its model family ranked the items."""


class RecommendResponse(_Response):
    recommendation_id: str
    """Pass back in events as ``recommendation_id`` to attribute them."""
    model_version: str | None
    """Model that ranked the items; None when no model was available."""
    items: list[RecommendItem]
    """Best first, in the ranking order, which is **not** ``score`` order: the fused
    ranking (log ``score`` plus the two-tower affinity and co-visitation bonuses), then
    the exploration slots for new videos and the per-creator cap (docs/serving.md, *The
    ranking order*; docs/rerank.md). Fallbacks without a model keep their candidate
    source's order. Show them in this order; do not re-sort by ``score``."""
    fallback: bool = False
    """True when the normal path could not be used (see ``fallback_reason``)."""
    fallback_reason: str | None = None
    """``unknown_user``, ``no_model``, ``degraded`` (a backend is down) or ``error``."""
    degraded: bool = False
    """True when the items come from the in-process popular list (backend down or error)."""
    experiment: ExperimentArm | None = None
    """The experiment arm whose model ranked the items; None outside any experiment (and
    in fallbacks)."""
    explanation: ResponseExplanation | None = None
    """With ``explain: true`` on a model-ranked response: what applies to every item."""


class BatchRecommendRequest(_Request):
    """Body of ``POST /v1/recommend/batch``: many users in one request (e-mail, push)."""

    requests: list[RecommendRequest] = Field(min_length=1)
    """One request per user, each as ``POST /v1/recommend`` takes it, with the same limits;
    at most ``api.max_recommend_batch``. Answered in this order."""


class BatchRecommendation(RecommendResponse):
    """One user's answer in a batch: a recommend response naming its user."""

    user_id: str
    """The request's ``user_id``."""


class BatchRecommendResponse(_Response):
    results: list[BatchRecommendation]
    """One answer per request, in the order of ``requests``; each is a whole
    recommendation (its own ``recommendation_id``, fallbacks and experiment arm)."""


def _items(component: str) -> WithJsonSchema:
    """A raw list documented as a list of ``component`` (validated item by item)."""
    return WithJsonSchema(
        {"type": "array", "items": {"$ref": f"#/components/schemas/{component}"}}
    )


class EventBatch(_Request):
    """Body of ``POST /v1/events``."""

    events: Annotated[list[Any], _items("Event")]
    """Events, each validated on its own: invalid ones are reported, the rest kept."""


class ItemError(_Response):
    index: int
    """Position of the rejected item in the request's list."""
    id: str | None
    """Its ``event_id`` / ``video_id`` when it had a readable one."""
    field: str
    """Dotted path of the offending field (``ts``, ``context.device``...)."""
    message: str


class BatchResult(_Response):
    """Answer to a batch write: 200 when at least one item was kept, else 422.

    ``accepted`` items were written (events: durable in the event log);
    ``errors`` lists every rejected item with its index and the field at fault.
    """

    accepted: int
    rejected: int
    errors: list[ItemError]
    warnings: list[ItemError] = []
    """Accepted items kept with a change, and why (events: a ``recommendation_id`` the
    service never issued, dropped so the event is not attributed to a response)."""


class VideoBatch(_Request):
    """Body of ``PUT /v1/videos``."""

    videos: Annotated[list[Any], _items("Video")]
    """Videos, each validated on its own: invalid ones are reported, the rest kept."""


class VideoOut(Video):
    """A catalog record as returned by ``GET /v1/videos/{id}``."""


class ErrorBody(_Response):
    """The one shape of every error answer."""

    error: str
    """Error class: ``InvalidInput``, ``PayloadTooLarge``, ``NotFound``, ``MethodNotAllowed``,
    ``Unauthorized``, ``Forbidden``, ``Conflict``, ``BackendUnavailable`` (or a subclass)."""
    message: str
    """What went wrong, for a person."""
    field: str | None = None
    """Dotted path of the offending input (``body``, ``events.3.ts``, ``user_id``...);
    with ``InvalidInput`` only."""


class BatchRejected(ErrorBody):
    """422 of a batch write: the error fields, and when every item was rejected the
    batch result too (``accepted`` 0; ``errors`` lists each item and its field)."""

    accepted: int = 0
    rejected: int = 0
    errors: list[ItemError] = []


class Liveness(_Response):
    """Answer of ``GET /healthz``: 200 ``ok``; 503 ``stuck`` once one scoring has run
    ``api.liveness_stuck_s`` (a restart is the way out)."""

    status: str
    """``ok`` or ``stuck``."""
    scoring_busy_s: float | None = None
    """With ``stuck``: seconds the current scoring has run."""


class Readiness(_Response):
    """Answer of ``GET /readyz``: 200 once the service can answer, degraded or not; 503
    while it is starting or stopping."""

    ready: bool
    degraded: bool = False
    """True while a dependency is down or no model is loaded: answers come from fallbacks."""
    checks: dict[str, str]
    """One entry per dependency: ``ok`` or ``down: why`` (``model``: the version and provider)."""
    dependencies: dict[str, dict[str, Any]] = {}
    """Each dependency's breaker state: ``state`` (``up``/``down``), ``down_for_s``,
    ``error``, ``trips`` (times it went down)."""
    process: int | None = None
    """The id of the process that answered (which worker, with ``vidrec serve --workers``)."""
