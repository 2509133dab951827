"""Harnesses for ``vidrec eval``: the online loop replayed, and Wide&Deep trained offline.

The composition root hands both to the evaluation (``app.wiring.eval_trainers``),
so ``app.evaluation`` never imports ``trainer``; what they return
(:mod:`feature_store.models.scored`) is in the contract both sides build on.

:class:`OnlineReplay` is the real online trainer (:class:`~trainer.loop.OnlineTrainer`:
its stages: dedupe, label joiner, features from the stores' pre-batch
state, step, activity record, towers; the idle batch too) consuming the
event log in the caller's thread instead of its own, so an evaluation can
interleave training with requests to the service at known moments. Each
step's pre-update scores come back through the loop's ``on_scored`` hook:
prequential (test-then-train) by construction.

:func:`train_offline` is the comparison a batch pipeline would make: the same
samples (same label policy, same features as they stood at each event's
moment, built by replaying the stream into a fresh activity store), the same
:class:`~trainer.model.WideDeep` and :class:`~trainer.step.Trainer` step on
fresh sparse tables, but several shuffled epochs over the training rows,
early-stopped on the validation rows' AUC. Test scores are those of the epoch
with the best validation AUC; the test rows never choose anything.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Collection, Sequence
from functools import partial

import numpy as np
import torch

from feature_store.activity.base import ActivityStore
from feature_store.events import Event
from feature_store.features.extract import FeatureExtractor
from feature_store.features.values import FeatureValues
from feature_store.models.quality import roc_auc
from feature_store.models.scored import OfflineResult, ScoredSamples
from feature_store.runtime.resources import Resources
from trainer.labels import Joiner, LabelPolicy, Moments, Sample
from trainer.loop import OnlineTrainer
from trainer.model import WideDeep
from trainer.samples import Lookup, featurise, labelled_rows
from trainer.stages.base import Batch
from trainer.step import Trainer

log = logging.getLogger(__name__)

_SCORE_BATCH = 4096


def _scored(samples: Sequence[Sample], scores: np.ndarray) -> ScoredSamples:
    return ScoredSamples(
        event_ids=[s.event.event_id for s in samples],
        user_ids=[s.event.user_id for s in samples],
        video_ids=[s.event.video_id for s in samples],
        ts_ms=np.fromiter((s.event.ts for s in samples), np.int64, len(samples)),
        labels=np.fromiter((s.label for s in samples), np.float64, len(samples)),
        weights=np.fromiter((s.weight for s in samples), np.float64, len(samples)),
        scores=np.asarray(scores, dtype=np.float64),
    )


class OnlineReplay:
    """:class:`OnlineTrainer` driven from the caller's thread; see the module doc.

    Consumes ``resources.event_log`` with the trainer's own consumer group,
    ``trainer.batch_size`` events per step, until the log is drained; then,
    as the loop does when a poll finds nothing, runs an idle batch (the
    same stages) that resolves the impressions older than the join window.
    The replay's clock is event time, not the wall clock (a replay of last
    year's log would otherwise time out every impression still waiting for
    its response at each drain): ``now_ms`` of :meth:`drain`, by default the
    newest event drained.
    """

    def __init__(self, resources: Resources) -> None:
        self._parts: list[ScoredSamples] = []
        self.loop = OnlineTrainer(resources, on_scored=self._collect)
        self.loop.restore()
        self.consumer = resources.event_log.consumer(self.loop.cfg.group_id)
        self.batch_size = self.loop.cfg.batch_size
        self._newest_ms = 0
        """Event time (ms) of the newest event drained: the replay's clock."""

    def _collect(self, samples: list[Sample], scores: np.ndarray) -> None:
        self._parts.append(_scored(samples, scores))

    def drain(self, now_ms: int | None = None) -> ScoredSamples:
        """Train every event in the log, then the idle batch at ``now_ms`` (default: the
        newest event's time); the samples trained, scored before training."""
        gc_before = gc.get_threshold()
        if self.loop.cfg.gc_threshold:
            gc.set_threshold(self.loop.cfg.gc_threshold, 20, 100)
        try:
            while records := self.consumer.poll(self.batch_size, 0.0):
                self._newest_ms = max(self._newest_ms, max(r.event.ts for r in records))
                self.loop.train(Batch(records))
                self.consumer.commit()
            self.loop.train(Batch.idle(self._newest_ms if now_ms is None else now_ms))
        finally:
            gc.set_threshold(*gc_before)
        out, self._parts = ScoredSamples.concat(self._parts), []
        return out

    def export(self) -> str:
        return self.loop.export(activate=True)

    def heads(self) -> dict[str, float]:
        return self.loop.metrics.head_window()

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.loop.close()


def build_samples(
    resources: Resources, events: Sequence[Event], batch_size: int, engagement_only: bool = True
) -> tuple[list[Sample], FeatureValues]:
    """The online loop's samples and their feature values, without training.

    Same joiner and label policy, same point-in-time values (the pre-batch
    store state of each batch of ``batch_size`` events, at the moment each
    video was shown), recorded into ``resources.training_activity`` (which must start
    empty) after each batch, as the loop does; the impressions still pending at
    the end time out, as in the evaluation's last drain. Values are packed rows (about
    0.4 KB a sample), not row objects, so a long stream fits in memory.
    ``engagement_only`` leaves out the samples with no engagement label (an
    ambiguous play, a sample for the watch head only): the offline harness
    compares the engagement head.
    """
    settings = resources.settings
    cfg = settings.trainer
    policy = LabelPolicy(cfg, settings.features)
    joiner = Joiner(policy, cfg.join_window_ms, cfg.joiner_max_entries)
    extractor = FeatureExtractor(resources.schema)
    samples: list[Sample] = []
    for start in range(0, len(events), batch_size):
        chunk = list(events[start : start + batch_size])
        lookup = Lookup(resources.catalog, chunk)
        moments = partial(_moments, extractor, chunk, lookup, resources.training_activity)
        samples += joiner.observe(chunk, [0] * len(chunk), lookup.durations, moments)
        resources.training_activity.record(chunk, lookup.videos)
    if events:  # the end of the stream: what still waits times out, as in the replay's last drain
        samples += joiner.flush_idle(events[-1].ts + cfg.join_window_ms + 1)
    if engagement_only:
        samples = [s for s in samples if s.label == s.label]
    return samples, labelled_rows(samples, extractor.layout).values


def _moments(
    extractor: FeatureExtractor,
    chunk: list[Event],
    lookup: Lookup,
    activity: ActivityStore,
    positions: list[int],
) -> Moments:
    values = featurise(extractor, [chunk[i] for i in positions], lookup, activity)
    return Moments(values, np.full(len(positions), np.nan))  # scored by the epochs, not here


def _score(trainer: Trainer, values: FeatureValues) -> np.ndarray:
    parts = [
        trainer.score(values.take(np.arange(i, min(i + _SCORE_BATCH, len(values)))).to_batch())
        for i in range(0, len(values), _SCORE_BATCH)
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


def train_offline(
    resources: Resources,
    events: Sequence[Event],
    train_ids: Collection[str],
    valid_ids: Collection[str],
    test_ids: Collection[str],
    *,
    max_epochs: int = 10,
    patience: int = 2,
    batch_size: int = 256,
    seed: int = 0,
) -> OfflineResult:
    """Wide&Deep trained in epochs on ``train_ids``, early-stopped on ``valid_ids``.

    ``resources`` must be fresh (empty activity store and sparse tables, the
    catalog loaded); ids name the samples' label-carrying events. Rows are
    shuffled each epoch (``seed``); the dense network and the sparse tables'
    optimizers are the online trainer's (``settings.trainer``, ``.sparse``).
    """
    cfg = resources.settings.trainer
    samples, values = build_samples(resources, events, cfg.batch_size)
    index = {s.event.event_id: i for i, s in enumerate(samples) if s.weight > 0}
    train = np.array([index[i] for i in train_ids if i in index], dtype=np.int64)
    valid = [index[i] for i in valid_ids if i in index]
    test = [index[i] for i in test_ids if i in index]
    labels = np.fromiter((s.label for s in samples), np.float32, len(samples))
    weights = np.fromiter((s.weight for s in samples), np.float32, len(samples))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(seed)
    model = WideDeep(resources.schema, cfg.hidden)
    trainer = Trainer(resources.schema, resources.tables, model, cfg.dense_learning_rate)
    rng = np.random.default_rng(seed)
    valid_labels = labels[valid].astype(np.float64)
    best_auc, best_epoch, best_scores = -1.0, 0, np.zeros(len(test))
    epochs: list[dict[str, float]] = []
    for epoch in range(1, max_epochs + 1):
        started = time.perf_counter()
        order = rng.permutation(train)
        loss = 0.0
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            loss += trainer.step(values.take(idx).to_batch(), labels[idx], weights[idx]).loss
        auc = roc_auc(_score(trainer, values.take(valid)), valid_labels)
        epochs.append({"epoch": epoch, "train_loss": loss / max(1, len(order)),
                       "valid_auc": auc, "seconds": time.perf_counter() - started})
        log.info("offline epoch %d: valid AUC %.4f", epoch, auc)
        if auc > best_auc:
            best_auc, best_epoch = auc, epoch
            best_scores = _score(trainer, values.take(test))
        elif epoch - best_epoch >= patience:
            break
    trainer.close()
    return OfflineResult(
        test=_scored([samples[j] for j in test], best_scores), epochs=epochs, best_epoch=best_epoch
    )
