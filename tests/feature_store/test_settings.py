"""One settings tree: env prefix, nesting, unknown keys refused, unsafe values refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from feature_store.errors import ConfigurationError
from feature_store.settings import Settings


def test_environment_variables_fill_nested_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIDREC_SPARSE__BACKEND", "redis")
    monkeypatch.setenv("VIDREC_REDIS__URL", "redis://example:6380/1")
    monkeypatch.setenv("VIDREC_SPARSE__ADMISSION_THRESHOLD", "3")
    settings = Settings()
    assert settings.sparse.backend == "redis"
    assert settings.redis.url == "redis://example:6380/1"
    assert settings.sparse.admission_threshold == 3


def test_unknown_keys_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError):
        Settings(sparse={"backnd": "redis"})  # type: ignore[arg-type]
    monkeypatch.setenv("VIDREC_SPARSE__BACKND", "redis")
    with pytest.raises(ValidationError):
        Settings()


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(sparse={"backend": "cassandra"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Settings(sparse={"admission_threshold": 0})  # type: ignore[arg-type]


def test_production_refuses_the_embedded_event_log() -> None:
    with pytest.raises(ConfigurationError):
        Settings(environment="production")
