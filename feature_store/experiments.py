"""Experiments: users split between model families by a salted hash of their id.

An experiment names two or more **arms**; each arm serves a model family (the
sparse-table namespace a trainer trains, ``Manifest.family``) to its share
of users. A user's arm is a pure function of the experiment's salt and the
user id (:func:`arm_index`: xxh64, the same in every process and after any
restart), so a user sees one arm for the whole experiment and every serving
replica agrees without talking to the others. The salt is per experiment
(the id by default), so the users of arm ``b`` in one experiment are not
the users of arm ``b`` in the next.

An arm serves its family's **active version** when the family is the active
one, else the family's **newest version** in the registry: both families
keep training online and exporting, and each arm follows its own family's
exports (:mod:`app.experiments.arms`). Fusion weights will be one more field
of :class:`Arm` once the ranker has several heads: the arm already travels
with the model to the scorer (``Assignment``), so the weights ride along.

Definitions are kept in the model registry's directory
(``<registry>/experiments.json``), which every serving process and trainer
already shares (a volume in Kubernetes, the data directory embedded), and
written by one writer at a time (an exclusive ``flock``) and atomically
(the file is replaced whole), so a reader sees the old book or the new one.
At most one experiment runs at a time: a request is ranked by one model,
so two experiments on the same traffic would compete for it.

Lifecycle: ``running`` -> ``stopped`` (everyone back on the active version)
or ``concluded`` (an arm won: its version was made active for everyone, so
its family is the one that goes on serving and learning). Ended experiments
are kept for their figures (the newest :data:`KEEP_ENDED`).
"""

from __future__ import annotations

import bisect
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import xxhash
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    WithJsonSchema,
    model_serializer,
)

from feature_store.atomic import atomic_text
from feature_store.errors import Conflict, InvalidInput, NotFound, StoreUnavailable
from feature_store.heads import HEAD_NAMES

FILE = "experiments.json"
LOCK_FILE = ".experiments.lock"
KEEP_ENDED = 50
"""Ended experiments kept in the book (oldest forgotten first)."""
NAME = r"^[A-Za-z0-9_-]{1,64}$"
FAMILY = r"^[A-Za-z0-9_-]{1,32}$"
"""A model family: the pattern of ``sparse.model_name``."""
_SPACE = 2**64



def _known_head(name: str) -> str:
    if name not in HEAD_NAMES:
        raise ValueError(f"no ranking head {name!r}; the heads are {', '.join(HEAD_NAMES)}")
    return name


Head = Annotated[
    str, AfterValidator(_known_head), WithJsonSchema({"type": "string", "enum": list(HEAD_NAMES)})
]
"""The name of a ranking head of the model (:data:`feature_store.heads.HEADS`)."""


def _nonzero(weight: float) -> float:
    if weight == 0:
        raise ValueError("a weight of 0: leave the head out instead")
    return weight


HeadWeight = Annotated[
    float,
    Field(ge=-100, le=100, allow_inf_nan=False, json_schema_extra={"not": {"const": 0}}),
    AfterValidator(_nonzero),
]
"""One head's weight: non-zero, so that weights naming at least one head (``min_length``)
always rank by something; the OpenAPI schema says the same (``not: {const: 0}``)."""
RankingWeights = Annotated[dict[Head, HeadWeight], Field(min_length=1)]
"""Weight of each ranking head in the served score (``app/scoring/fusion.py``): a head
absent weighs 0; a negative weight rewards a *low* probability of that head."""


class Arm(BaseModel):
    """One arm: a share of users and the model family they are served by."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    family: str = Field(pattern=FAMILY)
    """Model family served to this arm (``main``, a retrain ``r2026...``)."""
    weight: float = Field(1.0, gt=0, le=1000)
    """Relative share of users (two arms of weight 1: half each)."""
    fusion: RankingWeights | None = None
    """Weights over the ranking heads for this arm's users (None: ``api.ranking_weights``):
    an arm may differ from another by its model family, its weights, or both."""

    @model_serializer(mode="wrap")
    def _without_default_fusion(self, handler: SerializerFunctionWrapHandler) -> Any:
        """No ``fusion`` key when unset: a book written here stays readable by a server
        from before the field (its ``extra="forbid"`` would refuse the key)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("fusion") is None:
            data.pop("fusion", None)
        return data


class ExperimentSpec(BaseModel):
    """What an operator (or the settings) asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    id: str = Field(pattern=NAME)
    arms: tuple[Arm, ...] = Field(min_length=2, max_length=8)
    """Two to eight arms with distinct names. The first is the control: the dashboard shows
    every other arm's difference to it."""
    salt: str | None = Field(None, pattern=NAME)
    """Salt of the assignment hash; the id when absent."""

    def check(self) -> None:
        """What the schema cannot say: :class:`InvalidInput` for repeated arm names (checked
        when an experiment starts, so a request body that fits the schema still parses)."""
        names = [arm.name for arm in self.arms]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvalidInput(f"experiment.arms.{i}.name", f"arm {name!r} is named twice")

    @property
    def hash_salt(self) -> str:
        return self.salt or self.id


Status = Literal["running", "stopped", "concluded"]


class Experiment(ExperimentSpec):
    """An experiment as stored: the spec, who started it and how it ended."""

    status: Status = "running"
    started_at_ms: int
    started_by: str
    ended_at_ms: int | None = None
    ended_by: str | None = None
    winner: str | None = None
    """The arm whose version was made active (``concluded``)."""
    winner_version: str | None = None

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise NotFound(f"experiment {self.id!r} has no arm {name!r}")


def thresholds(arms: Sequence[Arm]) -> tuple[int, ...]:
    """Upper bounds of each arm's slice of the 64-bit hash space (cumulative weights)."""
    total = sum(arm.weight for arm in arms)
    bounds: list[int] = []
    running = 0.0
    for arm in arms:
        running += arm.weight
        bounds.append(int(_SPACE * running / total))
    bounds[-1] = _SPACE  # no rounding gap at the top
    return tuple(bounds)


def arm_index(salt: bytes, user_id: str, bounds: Sequence[int]) -> int:
    """The arm of ``user_id``: where xxh64(salt + user) falls among ``bounds``.

    ``salt`` is the experiment's salt as UTF-8 followed by a NUL (so that no
    salt is a prefix of another's salted id); about 0.3 us.
    """
    return bisect.bisect_right(bounds, xxhash.xxh64_intdigest(salt + user_id.encode()))


def salt_bytes(spec: ExperimentSpec) -> bytes:
    return spec.hash_salt.encode() + b"\0"


class ExperimentStore:
    """The experiment book in ``<registry root>/experiments.json`` (see the module doc).

    Reads are cached by the file's identity (inode, size, mtime), so a serving
    process may poll it every second for the cost of a ``stat``.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / FILE
        self._cached: tuple[tuple[int, int, int], tuple[Experiment, ...]] | None = None

    # --- reading -------------------------------------------------------------

    def all(self) -> tuple[Experiment, ...]:
        """Every experiment in the book, oldest first."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise StoreUnavailable(f"experiments {self.path}: {exc}") from exc
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._cached
        if cached is not None and cached[0] == stamp:
            return cached[1]
        book = self._read()
        self._cached = (stamp, book)
        return book

    def running(self) -> Experiment | None:
        return next((e for e in self.all() if e.status == "running"), None)

    def get(self, experiment_id: str) -> Experiment:
        for experiment in self.all():
            if experiment.id == experiment_id:
                return experiment
        raise NotFound(f"no experiment {experiment_id!r}")

    def _read(self) -> tuple[Experiment, ...]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return ()
        except (OSError, ValueError) as exc:
            raise StoreUnavailable(f"experiments {self.path} unreadable: {exc}") from exc
        try:
            return tuple(Experiment.model_validate(e) for e in data.get("experiments", []))
        except (AttributeError, ValidationError) as exc:
            raise StoreUnavailable(f"experiments {self.path} malformed: {exc}") from exc

    # --- writing -------------------------------------------------------------

    def start(self, spec: ExperimentSpec, issuer: str, now_ms: int) -> Experiment:
        """Add ``spec`` as the running experiment; :class:`Conflict` if one runs or the id
        was used before (ids name figures: reusing one would mix two experiments)."""
        spec.check()
        with self._locked() as book:
            running = next((e for e in book if e.status == "running"), None)
            if running is not None:
                raise Conflict(f"experiment {running.id!r} is running; stop or conclude it first")
            if any(e.id == spec.id for e in book):
                raise Conflict(f"experiment id {spec.id!r} was used before; choose another")
            experiment = Experiment(
                **spec.model_dump(), started_at_ms=now_ms, started_by=issuer
            )
            book.append(experiment)
            return experiment

    def end(
        self,
        experiment_id: str,
        issuer: str,
        now_ms: int,
        winner: str | None = None,
        winner_version: str | None = None,
    ) -> Experiment:
        """Stop the running ``experiment_id`` (``concluded`` when a winner is named)."""
        with self._locked() as book:
            for i, experiment in enumerate(book):
                if experiment.id != experiment_id:
                    continue
                if experiment.status != "running":
                    raise Conflict(f"experiment {experiment_id!r} is {experiment.status} already")
                if winner is not None:
                    experiment.arm(winner)  # NotFound for an unknown arm
                ended = experiment.model_copy(update={
                    "status": "concluded" if winner else "stopped", "ended_at_ms": now_ms,
                    "ended_by": issuer, "winner": winner, "winner_version": winner_version,
                })
                book[i] = ended
                return ended
        raise NotFound(f"no experiment {experiment_id!r}")

    def ensure(self, specs: Sequence[ExperimentSpec], issuer: str, now_ms: int) -> list[str]:
        """Start each of ``specs`` whose id the book does not hold yet; returns the ids
        that could not start because another experiment runs (the caller says so)."""
        waiting = []
        known = {e.id for e in self.all()}
        for spec in specs:
            if spec.id in known:
                continue
            try:
                self.start(spec, issuer, now_ms)
            except Conflict:
                waiting.append(spec.id)
        return waiting

    @contextmanager
    def _locked(self) -> Iterator[list[Experiment]]:
        """The book as a list to change; written back (atomically) if the block succeeds."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            lock = open(self.root / LOCK_FILE, "a")
        except OSError as exc:
            raise StoreUnavailable(f"experiments lock in {self.root}: {exc}") from exc
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            book = list(self._read())
            before = list(book)
            yield book
            if book == before:
                return
            ended = [e for e in book if e.status != "running"]
            dropped = {id(e) for e in ended[: max(0, len(ended) - KEEP_ENDED)]}
            kept = [e.model_dump(mode="json") for e in book if id(e) not in dropped]
            try:
                with atomic_text(self.path) as out:
                    json.dump({"experiments": kept}, out, indent=1)
            except OSError as exc:
                raise StoreUnavailable(f"experiments {self.path}: {exc}") from exc
            self._cached = None

