"""Retraining: a fresh model family replaying the event log beside the live one.

An operator picks a time; :class:`RetrainManager` (started with the control
listener, in whichever process runs the live trainer) builds a second
trainer with the same factory over a copy of the live
:class:`~feature_store.runtime.resources.Resources` in which:

- the sparse tables live under another ``sparse.model_name`` (the family
  id, ``r<UTC yyyymmddHHMMSS>``), so the two families never share a row;
- the consumer group is ``<live group>-<family>`` and its consumer is moved
  to the chosen time (``seek_to_timestamp``, by the log's record time)
  before the first poll; the checkpoints and metrics series follow the group;
- exports land in the shared registry under the family's name and are
  activated automatically only while the family is the active one (an
  operator promoted it, or an experiment concluded with it): until then the
  operator compares (or runs an experiment) and chooses;
- the trainer's activity store (user histories, video counters) is a
  **private, in-process** one, rebuilt from the replay, instead of the live
  trainer's copy.

Trade-offs of that last point, on purpose: the live trainer's copy holds the
state as of the events it trained (and serving's, as of now), so a replay
writing old events into it would corrupt it (histories would go back in
time, counters would count events twice). A private store gives the replayed model honest
features (each event sees the history as it was then) at the cost of memory
in the trainer process (about what the embedded store holds for the same
users) and of starting empty: events older than the chosen time are not in
it. It is not checkpointed across a restart of the trainer process: a retrain
is a one-off run; start it again after a restart.

Serving: the family's tables are registered with the process's
:class:`~feature_store.runtime.resources.Families` when it starts, so a service in this
process can serve (after an operator's promotion) a version of the family
against them; a Redis service in another process opens them under the
family's ``model_name`` itself. Stopping a family stops its trainer but keeps
its tables readable (frozen), so a promoted family goes on serving.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from feature_store.activity.memory import MemoryActivity
from feature_store.errors import Conflict, InvalidInput, NotFound
from feature_store.factors import open_factors
from feature_store.ops.control import Command
from feature_store.ops.timeseries import open_timeseries
from feature_store.runtime.resources import Resources, table_specs
from feature_store.sparse import open_table
from trainer.control import TrainerHandle

if TYPE_CHECKING:
    from feature_store.eventlog.base import EventConsumer, EventLog
    from feature_store.ops.timeseries import MetricsSeries

log = logging.getLogger(__name__)

TrainerFactory = Callable[[Resources], TrainerHandle]
"""Builds a family's trainer on its resources (the root passes ``TrainerComponent``)."""


class ReplayLog:
    """The live event log, whose new consumers start at ``from_ts_ms`` (see the module doc)."""

    def __init__(self, log: EventLog, from_ts_ms: int, join_timeout_s: float = 30.0) -> None:
        self._log = log
        self.from_ts_ms = from_ts_ms
        self.join_timeout_s = join_timeout_s

    def consumer(self, group_id: str) -> EventConsumer:
        consumer = self._log.consumer(group_id)
        consumer.wait_for_assignment(self.join_timeout_s)
        consumer.seek_to_timestamp(self.from_ts_ms)
        return consumer

    def close(self) -> None:
        pass  # the live log is the live resources' to close

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


@dataclasses.dataclass
class Family:
    """One retrain family and its trainer."""

    id: str
    group_id: str
    from_ts_ms: int
    issuer: str
    started_at_ms: int
    resources: Resources
    trainer: TrainerHandle
    stopped: bool = False

    @property
    def series(self) -> MetricsSeries | None:
        return self.resources.trainer_series

    def describe(self) -> dict[str, Any]:
        try:
            status = self.trainer.status()
        except Exception as exc:  # a status must always render
            status = {"state": "failed", "last_error": str(exc)}
        return {
            "id": self.id, "group_id": self.group_id, "from_ts_ms": self.from_ts_ms,
            "issuer": self.issuer, "started_at_ms": self.started_at_ms,
            "state": "stopped" if self.stopped else status.get("state"),
            "last_version": status.get("last_version"),
            "latest": status.get("metrics") or {},
        }


class RetrainManager:
    """Starts, steers and stops retrain families; a ``control.Retrainer``."""

    def __init__(
        self, factory: TrainerFactory, resources: Resources, *, max_running: int = 1
    ) -> None:
        self.factory = factory
        self.live = resources
        self.max_running = max_running
        """Families training at once; each costs a trainer's CPU and memory."""
        self.families: dict[str, Family] = {}
        self._lock = threading.Lock()

    # --- control.Retrainer ------------------------------------------------

    def targets(self) -> set[str]:
        return set(self.families)

    def handle(self, command: Command) -> tuple[str, dict[str, Any]]:
        if command.action == "retrain":
            family = self.start(int(command.args["from_ts_ms"]), command.issuer)
            return f"retrain {family.id} started from {family.from_ts_ms}", {
                "family": family.id, "group_id": family.group_id,
                "from_ts_ms": family.from_ts_ms,
            }
        family = self._family(command.target)
        if command.action == "retrain_stop":
            self.stop(family.id)
            return f"retrain {family.id} stopped", {"family": family.id}
        trainer = family.trainer
        if command.action == "pause":
            trainer.pause()
            return f"retrain {family.id} paused", {"state": "paused"}
        if command.action == "resume":
            trainer.resume()
            return f"retrain {family.id} resumed", {"state": "running"}
        if command.action == "export":
            version = trainer.export_now(activate=False)
            return f"exported {version} (not activated)", {"version": version}
        if command.action == "status":
            return "status", {"status": family.describe()}
        raise InvalidInput("action", f"{command.action!r} does not apply to a retrain family")

    def close(self) -> None:
        for family in list(self.families.values()):
            self.stop(family.id)

    # --- families -----------------------------------------------------------

    def start(self, from_ts_ms: int, issuer: str = "unknown") -> Family:
        now = int(time.time() * 1000)
        if from_ts_ms > now:
            raise InvalidInput("from_ts_ms", "the replay must start in the past")
        with self._lock:
            running = [f for f in self.families.values() if not f.stopped]
            if len(running) >= self.max_running:
                raise Conflict(
                    f"retrain {running[0].id} is still running; stop it first "
                    f"(at most {self.max_running} at once)"
                )
            family_id = "r" + time.strftime("%Y%m%d%H%M%S", time.gmtime(now / 1000))
            if family_id in self.families:
                raise Conflict(f"retrain {family_id} was started this second; try again")
            resources = self._resources_for(family_id, from_ts_ms)
            trainer = self.factory(resources)
            family = Family(
                family_id, resources.settings.trainer.group_id, from_ts_ms, issuer, now,
                resources, trainer,
            )
            self.families[family_id] = family
            self.live.families.register(family_id, resources.tables)
        trainer.start()
        log.info("retrain %s started from %d by %s", family_id, from_ts_ms, issuer)
        return family

    def stop(self, family_id: str) -> None:
        family = self._family(family_id)
        if family.stopped:
            return
        family.trainer.stop()
        family.stopped = True
        for table in family.resources.tables.values():
            table.close()
        family.resources.trainer_series.close()  # opened with the family's resources
        log.info("retrain %s stopped", family_id)

    def describe(self) -> list[dict[str, Any]]:
        return [f.describe() for f in sorted(self.families.values(), key=lambda f: f.id)]

    def _family(self, family_id: str) -> Family:
        family = self.families.get(family_id)
        if family is None:
            raise NotFound(f"no retrain family {family_id!r} in this trainer process")
        return family

    def _resources_for(self, family_id: str, from_ts_ms: int) -> Resources:
        live = self.live
        settings = live.settings
        sparse = settings.sparse.model_copy(update={"model_name": family_id})
        group = f"{settings.trainer.group_id}-{family_id}"[:64]
        trainer = settings.trainer.model_copy(update={"group_id": group})
        fam_settings = settings.model_copy(update={"sparse": sparse, "trainer": trainer})
        tables = {
            spec.name: open_table(spec, fam_settings, redis_client=live.redis_client)
            for spec in table_specs(live.schema, fam_settings)
        }
        for table in tables.values():
            table.clear()  # a fresh model: nothing from an earlier family of the same name
        # Its own live factorisation: the family's fits must never replace the live ones.
        stores = live.redis_client if settings.stores.backend == "redis" else None
        factors = open_factors(fam_settings, stores)
        factors.clear()
        return dataclasses.replace(
            live,
            settings=fam_settings,
            event_log=ReplayLog(live.event_log, from_ts_ms),  # type: ignore[arg-type]
            training_activity=MemoryActivity(settings.features),
            tables=tables,
            factors=factors,
            # The family's own series (its group's name); closed by stop with its tables.
            # The rest (catalog, registry, control channel...) is the live resources'.
            trainer_series=open_timeseries(fam_settings, live.redis_client),
        )
