"""The event log on Apache Kafka (or any Kafka-protocol broker), via kafka-python.

Records are keyed by ``user_id`` (the default murmur2 partitioner keeps one
user in one partition), produced with ``acks="all"`` and confirmed before
``produce`` returns. Consumers join a group with auto-commit off and commit
explicitly. Bad records are produced to the dead-letter topic with the
reason and source in headers, then skipped.

Every kafka-python error is translated at this boundary into
:class:`~feature_store.errors.EventLogUnavailable` (or
:class:`~feature_store.errors.Conflict` for a commit the group refused after a
rebalance), raised ``from`` the original.

Broker quirks handled here (found against Tansu, the test broker; harmless on
Apache Kafka):

- ``ListOffsets(latest)`` may answer the base offset of the last record batch
  plus one instead of the high watermark, so a batch of many records looks
  like one. :meth:`KafkaEventLog._end_offsets` corrects it by fetching from
  the answer minus one and reading the high watermark of that fetch (one small
  fetch per call; Kafka answers right and the fetch confirms it).
- ``offsets_for_times`` may match on the broker's append time at batch
  granularity and answers "no such record" as offset 0 with timestamp -1.
  The broker's offset is never later than the right one (a record is appended
  after it is created), so the consumer seeks there and then skips the
  leading records whose timestamp is before the target; "none" seeks to the
  true end. With a producer clock ahead of the broker's the answer may come
  late; keep clocks in sync.
- A group's first join waits about half the session timeout (at most 3 s)
  before the broker answers, and a rebalance as long again: small
  ``session_timeout_ms``/``heartbeat_interval_ms`` make tests quick.
  ``api_version`` auto-detection, record headers and the idempotent producer
  (kafka-python 3's default) work unchanged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import (
    CommitFailedError,
    KafkaError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
)
from kafka.structs import OffsetAndMetadata

from feature_store.constants import DLQ_GROUP_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER
from feature_store.errors import Conflict, EventLogUnavailable
from feature_store.eventlog.base import (
    ConsumedEvent,
    DeadLetter,
    DeadRuns,
    Position,
    past_dead_letters,
)
from feature_store.eventlog.codec import BadRecord, source_of
from feature_store.eventlog.streams import StreamSpec, stream_spec
from feature_store.runtime import tracing
from feature_store.runtime.breaker import Breaker
from feature_store.runtime.worker import Worker
from feature_store.settings import KafkaSettings, Settings

DEAD_LETTER_PARTITIONS = 1
"""The dead-letter topic is low-volume; one partition keeps it in arrival order."""
MAX_DEAD_VALUE_BYTES = 900 * 1024
"""A dead letter's value is cut to this, under the producer's 1 MiB request limit."""


def client_config(kafka: KafkaSettings) -> dict[str, Any]:
    """Connection and security settings of every producer, consumer and admin client."""
    config: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers.split(","),
        "client_id": kafka.client_id,
        "request_timeout_ms": kafka.request_timeout_ms,
        # Without this an unreachable broker hangs each client for 30 s.
        "bootstrap_timeout_ms": kafka.request_timeout_ms,
        "security_protocol": kafka.security_protocol,
    }
    if kafka.sasl_mechanism is not None:
        config["sasl_mechanism"] = kafka.sasl_mechanism
        config["sasl_plain_username"] = kafka.sasl_username
        assert kafka.sasl_password is not None  # KafkaSettings checks it
        config["sasl_plain_password"] = kafka.sasl_password.get_secret_value()
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        config["ssl_check_hostname"] = kafka.ssl_check_hostname
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(kafka, name)
            if path is not None:
                config[name] = str(path)
        if kafka.ssl_password is not None:
            config["ssl_password"] = kafka.ssl_password.get_secret_value()
    return config


def producer_config(kafka: KafkaSettings) -> dict[str, Any]:
    """How records are produced so that an acknowledged one is never lost.

    ``acks="all"``, retried until delivered, and **idempotence off**:
    kafka-python's idempotent producer counts the broker's
    ``DUPLICATE_SEQUENCE_NUMBER`` (error 46) as a success, and across a
    restart of the test broker (Tansu) that lost acknowledged records (2 of
    1,200 in issue #13's runs). Without it a retried batch may be stored
    twice, never dropped (``tests/faults/test_outages.py`` kills and
    restarts the broker under load and counts); the trainer drops the
    repeats by ``event_id`` (``trainer/dedupe.py``), so training stays
    exactly-once. One request in flight per connection keeps a retried batch
    from overtaking the next one (a user's events stay in order).
    ``max_block_ms`` bounds ``send`` when metadata or buffer space is
    missing, to the ingest route's budget.
    """
    return {
        "acks": "all",
        "enable_idempotence": False,
        "max_in_flight_requests_per_connection": 1,
        "retries": 2**31 - 1,
        "retry_backoff_ms": 100,
        "linger_ms": kafka.linger_ms,
        "max_block_ms": kafka.produce_timeout_ms,
    }


@contextmanager
def _kafka_errors(action: str) -> Iterator[None]:
    """Translate kafka-python errors raised while doing ``action``."""
    try:
        yield
    except CommitFailedError as exc:
        raise Conflict(
            f"{action}: the group rebalanced and refused the commit; the partition's "
            f"new owner resumes from the last committed offset ({exc})"
        ) from exc
    except KafkaError as exc:
        raise EventLogUnavailable(f"kafka {action} failed: {exc}") from exc


class KafkaEventLog:
    """Producer, topic setup and consumer factory over one Kafka cluster.

    Construction does no I/O; :meth:`start` (or entering the context)
    connects, creates missing topics and fails fast with
    :class:`EventLogUnavailable` when no broker answers within
    ``kafka.request_timeout_ms``.
    """

    def __init__(self, settings: Settings, stream: StreamSpec | None = None) -> None:
        self.settings = settings
        stream = stream or stream_spec(settings, "events")
        self.stream = stream
        self.topic = stream.topic
        self.dead_letter_topic = stream.dead_letter_topic
        self._codec = stream.codec
        self._timeout_s = settings.kafka.request_timeout_ms / 1000
        self._producer: KafkaProducer | None = None
        self._probe: KafkaConsumer | None = None
        """Group-less consumer for end offsets; kafka-python clients are not thread-safe."""
        self._probe_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._consumers: list[KafkaEventConsumer] = []
        self._closed = False
        self.breaker = Breaker("kafka", probe=self._probe_broker)
        """Down after a produce failed or was not acknowledged within its budget; while
        down every produce is refused at once, and a background probe brings it back."""
        self._connector: Worker | None = None

    def client_config(self) -> dict[str, Any]:
        """Connection settings shared by every client this log makes."""
        return client_config(self.settings.kafka)

    # --- lifecycle -------------------------------------------------------

    def start(self) -> KafkaEventLog:
        """Connect, create the topics if missing, open the producer. Idempotent."""
        with self._start_lock:
            return self._start()

    def _start(self) -> KafkaEventLog:
        if self._closed:
            raise EventLogUnavailable("the event log is closed")
        if self._producer is not None:
            return self
        kafka = self.settings.kafka
        try:
            with _kafka_errors("start"):
                self._create_topics()
                self._probe = KafkaConsumer(
                    **self.client_config(),
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    # It fetches only to read high watermarks: keep fetches small.
                    max_partition_fetch_bytes=64 * 1024,
                )
                self._producer = KafkaProducer(**self.client_config(), **producer_config(kafka))
        except BaseException:
            self._release()  # not closed: start() may be tried again
            raise
        return self

    def start_in_background(self, retry_s: float = 2.0) -> KafkaEventLog:
        """Connect from a daemon thread, retrying every ``retry_s`` until a broker answers.

        For the service (``vidrec serve``), which must start and answer
        recommendations while no broker is reachable: until the first
        connect succeeds, producing and making consumers raise
        :class:`EventLogUnavailable` at once instead of waiting on the broker.
        """
        if self._connector is not None or self._producer is not None:
            return self
        self.breaker.failed(EventLogUnavailable("not connected to the broker yet"))

        def connect(stop: threading.Event) -> None:
            while not stop.is_set():
                try:
                    self.start()
                except EventLogUnavailable as exc:
                    self.breaker.failed(exc)
                    stop.wait(retry_s)
                    continue
                if stop.is_set():  # closed while this attempt connected: let nothing leak
                    self._release()
                    return
                self.breaker.succeeded()
                return

        self._connector = Worker("vidrec-kafka-connect", connect)
        self._connector.start()
        return self

    def _create_topics(self) -> None:
        kafka = self.settings.kafka
        admin = KafkaAdminClient(**self.client_config())
        try:
            wanted = [
                NewTopic(
                    self.topic,
                    kafka.partitions,
                    kafka.replication_factor,
                    topic_configs=dict(self.stream.topic_config),
                ),
                NewTopic(self.dead_letter_topic, DEAD_LETTER_PARTITIONS, kafka.replication_factor),
            ]
            for topic in wanted:
                # One request per topic: an "already exists" for one must not
                # hide the outcome of the other.
                try:
                    admin.create_topics([topic], timeout_ms=kafka.request_timeout_ms)
                except TopicAlreadyExistsError:
                    pass
        finally:
            admin.close()

    def close(self) -> None:
        """Close consumers, flush and close the producer. Idempotent.

        Every client is closed even when an earlier one fails; the failure
        is raised afterwards.
        """
        self._closed = True
        if self._connector is not None:
            # Not joined: an attempt in flight may take the bootstrap timeout (about 30 s);
            # the thread releases what that attempt opens and ends.
            self._connector.stop(timeout_s=0)
        self._release()

    def _release(self) -> None:
        producer, self._producer = self._producer, None
        probe, self._probe = self._probe, None
        with ExitStack() as stack:  # callbacks run last-pushed first, each one regardless
            if probe is not None:
                stack.callback(probe.close, autocommit=False)
            if producer is not None:
                stack.callback(producer.close, timeout=self._timeout_s)
                stack.enter_context(_kafka_errors("flush"))
                stack.callback(producer.flush, timeout=self._timeout_s)
            for consumer in list(self._consumers):
                stack.callback(consumer.close)

    def __enter__(self) -> KafkaEventLog:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _ready_producer(self) -> KafkaProducer:
        if self._closed:
            raise EventLogUnavailable("the event log is closed")
        if self._producer is None:
            if self._connector is not None:  # connecting in the background: do not wait here
                raise EventLogUnavailable(
                    f"not connected to the broker yet ({self.breaker.last_error})",
                    retry_after_s=self.breaker.retry_after_s(),
                )
            self.start()
        assert self._producer is not None
        return self._producer

    # --- producing -------------------------------------------------------

    def produce(self, events: Sequence[Any], timeout_s: float | None = None) -> None:
        """Append items of this log's stream (events, or served records); waits for acks
        (at most ``timeout_s``, default the request timeout), through the breaker.

        A wait that ends without every acknowledgement before ``kafka.produce_timeout_ms``
        does not mark the broker down: the caller's deadline was nearer than the
        broker's budget (an overloaded API), which says nothing of the broker; under
        load, blaming it refused the next requests too."""
        if not events:
            return
        if not self.breaker.allow():
            raise EventLogUnavailable(
                f"the broker is down ({self.breaker.last_error}); nothing was written",
                retry_after_s=self.breaker.retry_after_s(),
            )
        codec = self._codec
        with tracing.producing(self.topic, len(events)) as headers:
            records = [
                (self.topic, codec.key(item), codec.encode(item), headers) for item in events
            ]
            wait_s = self._timeout_s if timeout_s is None else timeout_s
            started = time.monotonic()
            try:
                self._send(records, wait_s)
            except EventLogUnavailable as exc:
                budget_s = self.settings.kafka.produce_timeout_ms / 1000
                had_budget = max(wait_s, time.monotonic() - started) >= budget_s
                if had_budget or not isinstance(exc.__cause__, KafkaTimeoutError):
                    self.breaker.failed(exc)
                exc.retry_after_s = self.breaker.retry_after_s()
                raise
        self.breaker.succeeded()

    def produce_raw(self, key: bytes | None, value: bytes) -> None:
        self._send([(self.topic, key, value, None)], self._timeout_s)

    def _send(
        self,
        records: Sequence[tuple[str, bytes | None, bytes, list[tuple[str, bytes]] | None]],
        timeout_s: float,
    ) -> None:
        """Send and wait at most ``timeout_s`` for every acknowledgement (a return: durable).

        Past the deadline the records stay queued in the producer and may
        still be delivered: the caller was told nothing is acknowledged.
        """
        if not records:
            return
        deadline = time.monotonic() + timeout_s
        producer = self._ready_producer()
        with _kafka_errors("produce"):
            futures = [
                producer.send(topic, key=key, value=value, headers=headers)
                for topic, key, value, headers in records
            ]
            for future in futures:
                future.get(timeout=max(0.0, deadline - time.monotonic()))

    def _dead_letter(self, letters: list[DeadLetter]) -> None:
        self._send(
            [
                (
                    self.dead_letter_topic,
                    letter.key,
                    letter.value[:MAX_DEAD_VALUE_BYTES],
                    [
                        (DLQ_REASON_HEADER, letter.reason.encode()),
                        (DLQ_SOURCE_HEADER, letter.source.encode()),
                        (DLQ_GROUP_HEADER, letter.group.encode()),
                    ],
                )
                for letter in letters
            ],
            self._timeout_s,
        )

    # --- consuming -------------------------------------------------------

    def consumer(self, group_id: str) -> KafkaEventConsumer:
        """A new group member; while connecting in the background, waits for the connection
        (up to ``kafka.request_timeout_ms``: consumers run in threads of their own)."""
        connecting = self._connector.thread if self._connector is not None else None
        if connecting is not None and self._producer is None:
            connecting.join(self._timeout_s)
        self._ready_producer()
        consumer = KafkaEventConsumer(self, group_id)
        self._consumers.append(consumer)
        return consumer

    def reader(self, partitions: Sequence[int] | None = None) -> KafkaEventConsumer:
        """A consumer of ``partitions`` (default: all) in no group, from their start.

        It commits nothing; it is for readers that keep their own positions,
        such as the trainer following the served log beside its events.
        """
        self._ready_producer()
        chosen = (
            [tp.partition for tp in self._partitions(self.topic)]
            if partitions is None
            else list(partitions)
        )
        consumer = KafkaEventConsumer(self, None, chosen)
        self._consumers.append(consumer)
        return consumer

    def partition_count(self) -> int:
        return len(self._partitions(self.topic))

    def _forget(self, consumer: KafkaEventConsumer) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)

    def _partitions(self, topic: str) -> list[TopicPartition]:
        probe = self._ready_probe()
        with self._probe_lock, self._guarded("metadata"):
            partitions = probe.partitions_for_topic(topic) or set()
        return [TopicPartition(topic, p) for p in sorted(partitions)]

    def _probe_broker(self) -> None:
        """The breaker's probe, from its thread while the broker is down: every leader of
        the topic's partitions answers an offsets request within the produce budget (so
        no client request is the one that finds out, at the cost of its budget)."""
        probe = self._probe
        if probe is None:
            raise EventLogUnavailable("not connected to the broker yet")
        timeout_ms = max(1000, 2 * self.settings.kafka.produce_timeout_ms)
        with self._probe_lock, _kafka_errors("probe"):
            partitions = probe.partitions_for_topic(self.topic) or set()
            probe.end_offsets(
                [TopicPartition(self.topic, p) for p in sorted(partitions)], timeout_ms=timeout_ms
            )

    def _ready_probe(self) -> KafkaConsumer:
        self._ready_producer()
        assert self._probe is not None
        return self._probe

    @contextmanager
    def _guarded(self, action: str) -> Iterator[None]:
        """Metadata and offset reads through the breaker: refused at once while the broker
        is known down (one read per interval tries it), and their failures count."""
        if not self.breaker.allow():
            raise EventLogUnavailable(f"the broker is down ({self.breaker.last_error})")
        try:
            with _kafka_errors(action):
                yield
        except EventLogUnavailable as exc:
            self.breaker.failed(exc)
            raise
        self.breaker.succeeded()

    def _end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """True next offsets (see the module docstring for why a fetch confirms them)."""
        probe = self._ready_probe()
        with self._probe_lock, self._guarded("end offsets"):
            ends: dict[TopicPartition, int] = dict(
                probe.end_offsets(list(partitions), timeout_ms=self._timeout_ms)
            )
            pending = [tp for tp in partitions if ends.get(tp, 0) > 0]
            if not pending:
                return ends
            probe.assign([])  # fresh partition state: no stale high watermarks
            probe.assign(pending)
            for tp in pending:
                probe.seek(tp, ends[tp] - 1)
            deadline = time.monotonic() + self._timeout_s
            while pending and time.monotonic() < deadline:
                probe.poll(timeout_ms=100)
                for tp in list(pending):
                    high = probe.highwater(tp)
                    if high is not None:
                        ends[tp] = max(ends[tp], high)
                        pending.remove(tp)
            probe.assign([])
            return ends

    @property
    def _timeout_ms(self) -> int:
        return self.settings.kafka.request_timeout_ms

    def _beginning_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        probe = self._ready_probe()
        with self._probe_lock, self._guarded("beginning offsets"):
            return dict(probe.beginning_offsets(list(partitions), timeout_ms=self._timeout_ms))

    # --- inspection ------------------------------------------------------

    def end_offsets(self) -> dict[int, int]:
        ends = self._end_offsets(self._partitions(self.topic))
        return {tp.partition: offset for tp, offset in ends.items()}

    def beginning_offsets(self) -> dict[int, int]:
        starts = self._beginning_offsets(self._partitions(self.topic))
        return {tp.partition: offset for tp, offset in starts.items()}

    def dead_letter_count(self) -> int:
        partitions = self._partitions(self.dead_letter_topic)
        ends = self._end_offsets(partitions)
        starts = self._beginning_offsets(partitions)
        return sum(ends[tp] - starts.get(tp, 0) for tp in partitions)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Read the dead-letter topic from its start with a group-less consumer."""
        partitions = self._partitions(self.dead_letter_topic)
        ends = self._end_offsets(partitions)
        found: list[tuple[int, int, int, DeadLetter]] = []
        with _kafka_errors("read dead letters"):
            reader = KafkaConsumer(
                **self.client_config(), enable_auto_commit=False, auto_offset_reset="earliest"
            )
            try:
                reader.assign(partitions)
                reader.seek_to_beginning(*partitions)
                todo = {tp for tp in partitions if ends.get(tp, 0) > 0}
                deadline = time.monotonic() + self._timeout_s
                while todo and time.monotonic() < deadline:
                    for tp, records in reader.poll(timeout_ms=100).items():
                        for record in records:
                            found.append(
                                (record.timestamp, tp.partition, record.offset, _letter(record))
                            )
                    for tp in list(todo):
                        if reader.position(tp) >= ends[tp] or len(found) >= limit:
                            todo.discard(tp)
            finally:
                reader.close(autocommit=False)
        found.sort(key=lambda item: item[:3])
        return [letter for *_, letter in found[:limit]]


def _letter(record: Any) -> DeadLetter:
    headers = {name: value for name, value in (record.headers or [])}
    return DeadLetter(
        reason=headers.get(DLQ_REASON_HEADER, b"").decode(errors="replace"),
        source=headers.get(DLQ_SOURCE_HEADER, b"").decode(errors="replace"),
        key=record.key,
        value=record.value or b"",
        group=headers.get(DLQ_GROUP_HEADER, b"").decode(errors="replace"),
    )


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Keeps a consumer's per-partition state in step with group rebalances."""

    def __init__(self, owner: KafkaEventConsumer) -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked: Any) -> None:
        for tp in revoked:
            self.owner._floors.pop(tp.partition, None)
            self.owner._passed.pop(tp.partition, None)
            self.owner._first_seen.pop(tp.partition, None)
            self.owner._last_commit.pop(tp.partition, None)

    def on_partitions_assigned(self, assigned: Any) -> None:
        if self.owner._holding and assigned:
            # wait_for_assignment joins without consuming: paused partitions
            # are not fetched by the same poll that completed the join.
            self.owner._consumer.pause(*assigned)
            self.owner._held.update(assigned)


class KafkaEventConsumer:
    """One member of a Kafka consumer group on a stream's topic (one thread at a time), or,
    without a group, a reader of fixed partitions (:meth:`KafkaEventLog.reader`)."""

    def __init__(
        self, log: KafkaEventLog, group_id: str | None, partitions: list[int] | None = None
    ) -> None:
        self._log = log
        self.group_id = group_id
        kafka = log.settings.kafka
        self._floors: dict[int, int] = {}
        """Per partition, skip leading records older than this (ms): seek_to_timestamp's fix."""
        self._holding = False
        self._held: set[TopicPartition] = set()
        self._closed = False
        self._dead = DeadRuns()
        self._first_seen: dict[int, int] = {}
        """Per partition, offset of the first record polled since assignment or seek."""
        self._last_commit: dict[int, int] = {}
        self._passed: dict[int, int] = {}
        """Per partition, the group's committed offset, read when a bad record is met: one
        below it was dead-lettered when the group first passed it (see :meth:`_behind`)."""
        self.dead_lettered = 0
        with _kafka_errors("join group"):
            self._consumer = KafkaConsumer(
                **log.client_config(),
                group_id=group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=kafka.session_timeout_ms,
                heartbeat_interval_ms=kafka.heartbeat_interval_ms,
                max_poll_interval_ms=kafka.max_poll_interval_ms,
            )
            if group_id is None:
                fixed = [TopicPartition(log.topic, p) for p in partitions or []]
                self._consumer.assign(fixed)
                if fixed:
                    self._consumer.seek_to_beginning(*fixed)
            else:
                self._consumer.subscribe([log.topic], listener=_Rebalance(self))

    def _check_open(self) -> None:
        if self._closed:
            raise EventLogUnavailable(f"consumer of group {self.group_id!r} is closed")

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self._log.topic, partition)

    def _assigned(self) -> list[TopicPartition]:
        return sorted(self._consumer.assignment(), key=lambda tp: tp.partition)

    # --- reading ---------------------------------------------------------

    def poll(self, max_records: int, timeout_s: float) -> list[ConsumedEvent]:
        self._check_open()
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            with _kafka_errors("poll"):
                batches = self._consumer.poll(timeout_ms=remaining_ms, max_records=max_records)
            events, dead = self._decode(batches)
            if dead:
                try:
                    self._log._dead_letter([letter for _, _, letter in dead])
                except BaseException:
                    # The batch was not handed out: re-read it next time rather
                    # than let a later commit() skip past it.
                    self._rewind(batches)
                    raise
                for partition, offset, _ in dead:
                    self._dead.add(partition, offset)
                self.dead_lettered += len(dead)
            if events or remaining_ms == 0:
                return events

    def _decode(
        self, batches: dict[Any, list[Any]]
    ) -> tuple[list[ConsumedEvent], list[tuple[int, int, DeadLetter]]]:
        """Valid events, and (partition, offset, letter) of the bad records met first here."""
        events: list[ConsumedEvent] = []
        dead: list[tuple[int, int, DeadLetter]] = []
        decoder = self._log._codec
        for tp, records in batches.items():
            floor = self._floors.get(tp.partition)
            if records:
                self._first_seen.setdefault(tp.partition, records[0].offset)
            for record in records:
                if floor is not None:
                    if record.timestamp < floor:
                        continue  # before the seek_to_timestamp target
                    floor = None
                    self._floors.pop(tp.partition, None)
                try:
                    event = decoder.decode(record.value)
                except BadRecord as bad:
                    if self._dead.holds(tp.partition, record.offset):
                        continue  # this group dead-lettered it already (a rebalance re-read)
                    if self._behind(tp, record.offset):
                        # Behind the group's commit: dead-lettered when first passed. Held
                        # as dead-lettered here too, so a commit moves past it again.
                        self._dead.add(tp.partition, record.offset)
                        continue
                    source = source_of(tp.topic, tp.partition, record.offset)
                    letter = DeadLetter(
                        bad.reason, source, record.key, record.value or b"", self.group_id or ""
                    )
                    dead.append((tp.partition, record.offset, letter))
                    continue
                events.append(ConsumedEvent(
                    event, tp.partition, record.offset, record.timestamp, record.headers or None
                ))
        return events, dead

    def _behind(self, tp: TopicPartition, offset: int) -> bool:
        """Whether ``offset`` lies behind the group's committed offset of ``tp`` (a restart's
        warm-up or a retrain seeking back re-reads what the group passed long ago)."""
        if self.group_id is None:
            return False
        if tp.partition not in self._passed:
            try:
                committed = self._consumer.committed(tp, timeout_ms=self._log._timeout_ms)
            except KafkaError:  # unknown: dead-letter it (an entry twice at worst)
                return False
            self._passed[tp.partition] = -1 if committed is None else int(committed)
        return offset < self._passed[tp.partition]

    def _rewind(self, batches: dict[Any, list[Any]]) -> None:
        with _kafka_errors("rewind"):
            for tp, records in batches.items():
                if records:
                    self._consumer.seek(tp, records[0].offset)

    # --- positions -------------------------------------------------------

    def _owned(self, partitions: Sequence[int]) -> None:
        if any(p not in self.assignment() for p in partitions):
            self.wait_for_assignment(self._join_timeout_s)
        missing = sorted(set(partitions) - set(self.assignment()))
        if missing:
            raise Conflict(
                f"partitions {missing} are not assigned to this member of {self.group_id!r} "
                f"(assigned: {self.assignment()})"
            )

    @property
    def _join_timeout_s(self) -> float:
        kafka = self._log.settings.kafka
        return (kafka.session_timeout_ms + kafka.request_timeout_ms) / 1000

    def commit(self, positions: Sequence[Position] | None = None) -> None:
        self._check_open()
        if self.group_id is None:
            raise Conflict("a reader in no group commits nothing; it keeps its own positions")
        with _kafka_errors("commit"):
            if positions is None:
                self._consumer.commit(timeout_ms=self._log._timeout_ms)
                self._dead = DeadRuns()  # everything polled is committed, bad records too
                self._passed.clear()  # read again when next needed
                return
            self._owned([p.partition for p in positions])
            chosen = past_dead_letters(
                positions, self._dead, self.assignment(), self._last_commit, self._first_seen
            )
            if chosen:
                self._consumer.commit(
                    {self._tp(p): OffsetAndMetadata(o, "", -1) for p, o in chosen.items()},
                    timeout_ms=self._log._timeout_ms,
                )
            self._last_commit.update(chosen)
            self._passed.update(chosen)

    def committed(self) -> list[Position]:
        self._check_open()
        if self.group_id is None:
            return []
        positions = []
        with _kafka_errors("committed"):
            for tp in self._assigned():
                offset = self._consumer.committed(tp, timeout_ms=self._log._timeout_ms)
                if offset is not None:
                    positions.append(Position(tp.partition, offset))
        return positions

    def assignment(self) -> list[int]:
        self._check_open()
        return [tp.partition for tp in self._assigned()]

    def wait_for_assignment(self, timeout_s: float) -> list[int]:
        self._check_open()
        deadline = time.monotonic() + timeout_s
        self._holding = True
        try:
            while not self._consumer.assignment() and time.monotonic() < deadline:
                with _kafka_errors("join group"):
                    stray = self._consumer.poll(timeout_ms=100, max_records=1)
                self._rewind(stray)  # none expected: assigned partitions start paused
        finally:
            self._holding = False
            if self._held:
                self._consumer.resume(*self._held)
                self._held.clear()
        return self.assignment()

    def seek(self, positions: Sequence[Position]) -> None:
        self._check_open()
        self._owned([p.partition for p in positions])
        ends = self._log._end_offsets([self._tp(p.partition) for p in positions])
        with _kafka_errors("seek"):
            for position in positions:
                tp = self._tp(position.partition)
                # Clamp as the memory backend does; Kafka would otherwise reset
                # an out-of-range position to the beginning.
                self._consumer.seek(tp, min(max(position.offset, 0), ends[tp]))
                self._floors.pop(position.partition, None)
                self._first_seen.pop(position.partition, None)
                self._last_commit.pop(position.partition, None)

    def seek_to_timestamp(self, ts_ms: int) -> None:
        self._check_open()
        if not self._consumer.assignment():
            self.wait_for_assignment(self._join_timeout_s)
        partitions = self._assigned()
        if not partitions:
            return
        with _kafka_errors("offsets for times"):
            found = self._consumer.offsets_for_times(
                {tp: ts_ms for tp in partitions}, timeout_ms=self._log._timeout_ms
            )
        ends: dict[TopicPartition, int] | None = None
        with _kafka_errors("seek"):
            for tp in partitions:
                hit = found.get(tp)
                if hit is None or hit.timestamp < 0:  # Tansu's "none": offset 0, ts -1
                    ends = ends or self._log._end_offsets(partitions)
                    self._consumer.seek(tp, ends[tp])
                else:
                    self._consumer.seek(tp, hit.offset)
                self._floors[tp.partition] = ts_ms
                self._first_seen.pop(tp.partition, None)
                self._last_commit.pop(tp.partition, None)

    def seek_to_beginning(self) -> None:
        self._check_open()
        if not self._consumer.assignment():
            self.wait_for_assignment(self._join_timeout_s)
        partitions = self._assigned()
        with _kafka_errors("seek"):
            if partitions:
                self._consumer.seek_to_beginning(*partitions)
        for tp in partitions:
            self._floors.pop(tp.partition, None)
            self._first_seen.pop(tp.partition, None)
            self._last_commit.pop(tp.partition, None)

    def lag(self) -> dict[int, int]:
        self._check_open()
        partitions = self._assigned()
        ends = self._log._end_offsets(partitions)
        lag: dict[int, int] = {}
        with _kafka_errors("position"):
            for tp in partitions:
                position = self._consumer.position(tp, timeout_ms=self._log._timeout_ms) or 0
                lag[tp.partition] = max(0, ends[tp] - position)
        return lag

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._log._forget(self)
        with _kafka_errors("close consumer"):
            self._consumer.close(autocommit=False)

    def __enter__(self) -> KafkaEventConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
