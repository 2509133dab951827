"""Every Redis key prefix and Kafka topic name, versioned in one place.

A change of storage layout bumps ``LAYOUT_VERSION`` so that old and new
processes never read each other's bytes by mistake.
"""

from __future__ import annotations

LAYOUT_VERSION = "v1"
"""Version of the on-Redis and on-topic layouts below."""

# --- Redis ---------------------------------------------------------------
REDIS_ROOT = f"vidrec:{LAYOUT_VERSION}"

SPARSE_ROWS = "r"
"""A sparse row, its weights then its optimizer state (one value, so one ``SET`` writes
both and one TTL expires both): ``{root}:sp:{model}:{table}:r:`` + 8 key bytes. Serving
reads it too and keeps the weights. (Earlier versions used ``w`` and ``s`` for weights and
state under separate keys; the new letter keeps the two layouts from reading each other.)"""
SPARSE_SIGHTINGS = "c"
"""Admission counter of a key not yet admitted: ``...:c:`` + 8 key bytes."""


def sparse_prefix(model: str, table: str, kind: str) -> bytes:
    """Key prefix of one table's keys of one ``kind`` (rows, counters)."""
    return f"{REDIS_ROOT}:sp:{model}:{table}:{kind}:".encode()


SPARSE_CLUSTER_BUCKETS = 64
"""Hash-tag buckets per table on Redis Cluster (part of the cluster layout: changing
it moves every row to another key, so it is a constant, not a setting)."""


def sparse_cluster_prefix(model: str, table: str, bucket: int, kind: str) -> bytes:
    """Redis Cluster key prefix of one table's keys of one ``kind`` in one bucket.

    ``{root}:sp:{{model:table:bucket}}:{kind}:`` + 8 key bytes, where bucket =
    key mod ``SPARSE_CLUSTER_BUCKETS``: the hash tag puts a bucket's rows and
    counters in one slot, so one ``MGET`` or ``MULTI``/``EXEC`` covers
    them (see :mod:`feature_store.sparse.cluster`). A single Redis keeps the
    untagged layout of :func:`sparse_prefix`.
    """
    return f"{REDIS_ROOT}:sp:{{{model}:{table}:{bucket}}}:{kind}:".encode()


def factors_prefix(model: str) -> str:
    """Key prefix of one family's live factorisation (``feature_store/factors/redis.py``):
    ``{root}:mf:{{model}}:``, the hash tag keeping its keys in one Cluster slot."""
    return f"{REDIS_ROOT}:mf:{{{model}}}:"


CATALOG_VIDEO = f"{REDIS_ROOT}:cat:video:"
"""JSON of one video: ``{CATALOG_VIDEO}{video_id}``."""
CATALOG_IDS = f"{REDIS_ROOT}:cat:ids"
"""Sorted set of visible video ids scored by ``uploaded_at`` (ms), for fresh uploads."""
CATALOG_HIDDEN = f"{CATALOG_IDS}:hidden"
"""Sorted set of hidden video ids, same scores; with CATALOG_IDS, every video."""

HISTORY = f"{REDIS_ROOT}:hist:"
"""A user's recent watches, newest first: list at ``{HISTORY}{user_id}``."""
VIDEO_STATS = f"{REDIS_ROOT}:vstat:"
"""A video's counters: hash at ``{VIDEO_STATS}{video_id}``."""
TRAINING_HISTORY = f"{REDIS_ROOT}:train:hist:"
TRAINING_VIDEO_STATS = f"{REDIS_ROOT}:train:vstat:"
"""The trainer's own copy of the histories and counters (point in time: as of the events it
trained), beside serving's ``HISTORY``/``VIDEO_STATS``, which the signal feed writes
(``feature_store/runtime/resources.py``, ``Resources.training_activity``)."""

TRAINER_METRICS = f"{REDIS_ROOT}:trainer:metrics:"
"""Capped stream of a trainer's metric points: ``{TRAINER_METRICS}{group_id}``."""
TRAINER_STATUS = f"{REDIS_ROOT}:trainer:status:"
"""A trainer's heartbeat (JSON, with a TTL): ``{TRAINER_STATUS}{group_id}``."""
TRAINER_PROGRESS = f"{REDIS_ROOT}:trainer:progress:"
"""Hash of partition -> next offset trained by any member of a group (scale-out):
``{TRAINER_PROGRESS}{group_id}``; see ``trainer/distributed.py``."""
TRAINER_DENSE = f"{REDIS_ROOT}:trainer:dense:"
"""Hash of member -> its latest dense parameters (scale-out averaging):
``{TRAINER_DENSE}{group_id}``; see ``trainer/distributed.py``."""
TRAINER_EXPORTER = f"{REDIS_ROOT}:trainer:exporter:"
"""The member of a group that exports and activates versions (a lease with a TTL):
``{TRAINER_EXPORTER}{group_id}``; see ``trainer/distributed.py``."""
TRAINER_SEQUENCE_VIEWS = f"{REDIS_ROOT}:trainer:sequence-views:"
"""Capped stream of a group's chosen views, one ``u``/``v`` entry each, which every member
reads back into its sequence tower's views: ``{TRAINER_SEQUENCE_VIEWS}{group_id}``; see
``trainer/sequence_share.py``."""

CONTROL_COMMANDS = f"{REDIS_ROOT}:control:cmd"
"""Capped stream of operator commands to trainers (``feature_store.ops.control``)."""
CONTROL_ACKS = f"{REDIS_ROOT}:control:ack"
"""Capped stream of trainers' acknowledgements of those commands."""
DASHBOARD_AUDIT = f"{REDIS_ROOT}:dashboard:audit"
"""Capped stream of the dashboard's audit log (who did what, when, with what outcome)."""
EXPERIMENT_FEED = f"{REDIS_ROOT}:exp:feed"
"""Hash of event-log partition -> the experiment feed's checkpoint of it (JSON: offset, log
time, per-arm totals); see ``app/experiments/checkpoints.py``."""

# --- Kafka topics --------------------------------------------------------


def events_topic(namespace: str) -> str:
    """User events, keyed by user_id."""
    return f"{namespace}.events.{LAYOUT_VERSION}"


def dead_letter_topic(namespace: str) -> str:
    """Records that failed to decode or validate, with the reason in headers."""
    return f"{namespace}.events.dlq.{LAYOUT_VERSION}"


def served_topic(namespace: str) -> str:
    """What the service recommended and the features it scored, keyed by user_id."""
    return f"{namespace}.served.{LAYOUT_VERSION}"


def served_dead_letter_topic(namespace: str) -> str:
    """Served-log records that failed to decode, with the reason in headers."""
    return f"{namespace}.served.dlq.{LAYOUT_VERSION}"


def control_topic(namespace: str) -> str:
    """Operator commands to trainers and their acknowledgements."""
    return f"{namespace}.control.{LAYOUT_VERSION}"


DLQ_REASON_HEADER = "vidrec-dlq-reason"
DLQ_SOURCE_HEADER = "vidrec-dlq-source"
"""``topic:partition:offset`` of the record that was dead-lettered."""
DLQ_GROUP_HEADER = "vidrec-dlq-group"
"""Consumer group that met the bad record (each group dead-letters it once)."""

# --- candidate signals (feature_store.signals) ---------------------------
TRENDING = f"{REDIS_ROOT}:sig:trend"
"""Sorted set of video ids scored by forward-decayed engagement (see signals.base)."""
TRENDING_LANDMARK = f"{REDIS_ROOT}:sig:trend:landmark"
"""Event time (ms) that the trending scores' exponent is measured from."""
COVISIT = f"{REDIS_ROOT}:sig:covis:"
"""Sorted set of a video's co-visited neighbours: ``{COVISIT}{video_id}``."""
COVISIT_VISITS = f"{REDIS_ROOT}:sig:visits"
"""Hash of each video's visits counted by co-visitation (the cosine's denominators)."""
CREATOR_VIDEOS = f"{REDIS_ROOT}:sig:creator:"
"""A creator's visible uploads by ``uploaded_at``: sorted set ``{CREATOR_VIDEOS}{creator_id}``."""
CATEGORY_OF = f"{REDIS_ROOT}:sig:catof"
"""Hash of each indexed visible video's category (what category trending is counted by)."""
CATEGORY_TRENDING = f"{REDIS_ROOT}:sig:cattrend:"
"""A category's videos by forward-decayed engagement, like :data:`TRENDING` and under its
landmark: sorted set ``{CATEGORY_TRENDING}{category}``."""
CATEGORIES = f"{REDIS_ROOT}:sig:categories"
"""Set of the categories with a trending set (the rescale walks them)."""

# --- per-user feedback (feature_store.signals.feedback) -------------------
FEEDBACK_SERVED = f"{REDIS_ROOT}:sig:served:"
"""Videos served to a user and not engaged with, scored by when they were served (ms):
sorted set ``{FEEDBACK_SERVED}{user_id}``."""
FEEDBACK_DISLIKED = f"{REDIS_ROOT}:sig:disliked:"
"""Videos a user disliked, scored by the dislike's time (ms): ``{FEEDBACK_DISLIKED}{user_id}``."""
FEEDBACK_DISLIKED_CREATORS = f"{REDIS_ROOT}:sig:dislikedc:"
"""Creators of videos a user disliked, scored by the latest such dislike (ms):
``{FEEDBACK_DISLIKED_CREATORS}{user_id}``."""
