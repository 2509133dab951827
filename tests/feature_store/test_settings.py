"""One settings tree: env prefix, nesting, unknown keys refused, unsafe values refused."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from pydantic import ValidationError

from feature_store.errors import ConfigurationError
from feature_store.eventlog.kafka import KafkaEventLog, client_config, producer_config
from feature_store.keys import MIN_KEY_BITS, key_bits, key_weakness
from feature_store.settings import KafkaSettings, Settings


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


def _production(**api: object) -> Settings:
    return Settings(
        environment="production", event_log={"backend": "kafka"}, api=api  # type: ignore[arg-type]
    )


GUESSABLE_KEYS = (
    # issue #22: each passed the length and character-entropy rules
    "0123456789abcdef", "Password123!Password123!", "changeme-changeme-changeme",
    "vidrec-production-api-key",
    # repeats, a short alphabet, keyboard walks, words, the development default
    " " * 24, "a" * 40, "abababababababababab", "01101001100101101001011001101001",
    "qwertyuiopasdfghjklzxcvbnm", "password-password-password1", "vidrec-dev-key", "shortkey",
)


@pytest.mark.parametrize("weak", GUESSABLE_KEYS)
def test_production_refuses_guessable_keys_and_says_how_to_make_one(weak: str) -> None:
    other = secrets.token_urlsafe(24)
    with pytest.raises(ConfigurationError, match="api.api_key") as refused:
        _production(api_key=weak, admin_key=other)
    message = str(refused.value)
    assert "openssl rand -hex 32" in message
    assert weak not in message  # names the pattern, never a piece of the key


def test_production_accepts_random_keys_and_refuses_shared_ones() -> None:
    strong, other = secrets.token_hex(32), secrets.token_urlsafe(24)
    assert _production(api_key=strong, admin_key=other).api.admin_key.get_secret_value() == other
    for _ in range(20):  # random keys pass every time, not by luck
        assert key_weakness(secrets.token_hex(32)) is None
        assert key_weakness(secrets.token_urlsafe(24)) is None
    with pytest.raises(ConfigurationError, match="same key"):
        _production(api_key=strong, admin_key=strong)
    with pytest.raises(ConfigurationError, match="same key"):
        _production(api_key=strong, admin_key=other, read_key=strong)
    assert key_bits(" " * 16) == 0 and key_bits(secrets.token_hex(32)) > 2 * MIN_KEY_BITS


def test_a_refusal_names_what_gives_the_key_away() -> None:
    assert "repeat" in (key_weakness("changeme-changeme-changeme") or "")
    assert "sequence" in (key_weakness("0123456789abcdefghij") or "")
    assert "dictionary words" in (key_weakness("vidrec-production-api-key") or "")


def test_kafka_security_reaches_every_client(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    kafka = KafkaSettings(
        security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="vidrec",
        sasl_password="s3cret", ssl_cafile=ca,  # type: ignore[arg-type]
    )
    config = client_config(kafka)
    assert config["security_protocol"] == "SASL_SSL"
    assert config["sasl_mechanism"] == "SCRAM-SHA-512"
    assert config["sasl_plain_username"] == "vidrec" and config["sasl_plain_password"] == "s3cret"
    assert config["ssl_cafile"] == str(ca) and config["ssl_check_hostname"] is True
    # The log builds its producer, consumers, admin and readers from this one config.
    log = KafkaEventLog(Settings(kafka=kafka))
    assert log.client_config() == config
    producer = producer_config(kafka)
    assert producer["acks"] == "all" and producer["enable_idempotence"] is False
    for broken in (
        {"security_protocol": "SASL_SSL"},  # no credentials
        {"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"},  # PLAINTEXT
        {"security_protocol": "SSL", "ssl_cafile": tmp_path / "missing.pem"},
        {"ssl_cafile": ca},  # TLS files without TLS
    ):
        with pytest.raises(ConfigurationError):
            KafkaSettings(**broken)  # type: ignore[arg-type]


def test_listeners_bind_this_host_unless_configured() -> None:
    from app.cli import build_parser

    for command in ("up", "serve"):
        assert build_parser().parse_args([command]).host == "127.0.0.1"
    assert Settings().trainer.metrics_host == "127.0.0.1"
