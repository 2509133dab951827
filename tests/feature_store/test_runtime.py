"""open_resources: whoever opens closes, even when opening fails half-way."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import feature_store.catalog
import feature_store.eventlog
from feature_store.errors import ConfigurationError
from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings
from tests.factories import make_event


def test_a_failure_half_way_closes_what_was_already_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []
    real_open = feature_store.eventlog.open_event_log

    def tracked_event_log(*args: Any, **kwargs: Any) -> Any:
        log = real_open(*args, **kwargs)
        real_close = log.close

        def close() -> None:
            closed.append("event log")
            real_close()

        log.close = close  # type: ignore[method-assign]
        return log

    def broken_catalog(*args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError("catalog: cannot open")

    monkeypatch.setattr(feature_store.eventlog, "open_event_log", tracked_event_log)
    monkeypatch.setattr(feature_store.catalog, "open_catalog", broken_catalog)
    with pytest.raises(ConfigurationError, match="catalog: cannot open"):
        with open_resources(Settings(data_dir=tmp_path)):
            pytest.fail("opened despite the broken catalog")
    assert closed == ["event log"]


def test_every_part_comes_in_at_construction_and_none_is_set_from_outside(
    tmp_path: Path,
) -> None:
    """The control channel, the trainer's series and the families exist as soon as the
    resources do (one object each, whoever asks), and no module can swap a part."""
    with open_resources(Settings(data_dir=tmp_path)) as resources:
        assert resources.families.tables(resources.settings.sparse.model_name) is resources.tables
        resources.trainer_series.append({"ts_ms": 1, "auc": 0.5})
        assert resources.trainer_series.latest() == {"ts_ms": 1, "auc": 0.5}
        with pytest.raises(dataclasses.FrozenInstanceError):
            resources.control = resources.control  # type: ignore[misc]


def test_a_restart_reads_the_series_the_last_run_wrote(tmp_path: Path) -> None:
    with open_resources(Settings(data_dir=tmp_path)) as resources:
        resources.trainer_series.append({"ts_ms": 1, "auc": 0.5})
    with open_resources(Settings(data_dir=tmp_path)) as resources:
        assert resources.trainer_series.latest() == {"ts_ms": 1, "auc": 0.5}


@pytest.mark.parametrize("persist", [True, False])
def test_the_in_process_log_is_kept_on_disk_unless_told_not_to(
    tmp_path: Path, persist: bool
) -> None:
    """``event_log.memory_persist`` off (``vidrec eval``'s throwaway replay): a restart finds
    neither the records nor the committed offsets."""
    settings = Settings(data_dir=tmp_path, event_log={"memory_persist": persist})
    with open_resources(settings) as resources:
        resources.event_log.produce([make_event()])
        consumer = resources.event_log.consumer("g")
        assert len(consumer.poll(10, 1.0)) == 1
        consumer.commit()
        consumer.close()
    with open_resources(settings) as resources:
        fresh = resources.event_log.consumer("h")
        assert len(fresh.poll(10, 0.2)) == (1 if persist else 0)
        fresh.close()
    events_dir = tmp_path / "eventlog" / settings.event_log.topic_namespace
    assert events_dir.exists() == persist  # the served log keeps its own (not asked here)
