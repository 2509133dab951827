"""The durable broker of the production-topology tests: Tansu on an S3-compatible store,
started once per session (each test gets a topic namespace of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import S3Store, TansuBroker


@pytest.fixture(scope="session")
def durable_broker() -> Iterator[TansuBroker]:
    with S3Store() as store, TansuBroker(storage=store) as broker:
        yield broker
