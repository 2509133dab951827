"""Schemathesis, every check, against the service on a real socket: zero failures.

The run is the ``st`` command line (as an API user would run it) against
the embedded service with a model loaded, a bounded number of examples per
operation and a fixed seed, so that it takes well under a minute and fails
the same way twice. ``checks all`` includes ``positive_data_acceptance``
(schema-valid bodies are accepted), ``negative_data_rejection``,
``status_code_conformance`` / ``response_schema_conformance`` /
``content_type_conformance`` (every answer is documented), ``ignored_auth``
(security declared where it is not enforced) and ``unsupported_method``.

``schemathesis.toml`` adds 413 to the statuses that count as a rejection
(a batch over its item limit); ``schemathesis_hooks.py`` says the two things
JSON Schema cannot (see its docstring).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.main import create_app
from tests.app.conftest import make_settings, publish_model, serve_in_thread, wait_for

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
EXAMPLES = 20
"""Generated cases per operation and phase: about 2,000 requests, 15 s on 2 cores."""
SEED = 20260115


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The embedded service with a model loaded (so ``/readyz`` is 200), on a socket."""
    settings = make_settings(
        tmp_path_factory.mktemp("schemathesis") / "data",
        # No trainer listens: a trainer action times out (a 200 saying so) at once.
        dashboard={"ack_timeout_s": 0.01},
    )
    app = create_app(settings)
    with serve_in_thread(app) as url:
        service = app.state.service
        publish_model(service.resources.registry, service.resources.schema)
        wait_for(lambda: service.model is not None, timeout_s=30)
        yield url


def test_schemathesis_finds_nothing(live_url: str, tmp_path: Path) -> None:
    st = Path(sys.executable).parent / "st"
    if not st.exists():
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SCHEMATHESIS_HOOKS": "tests.app.schemathesis_hooks",
        "NO_COLOR": "1",
    }
    command = [
        str(st), "--config-file", str(HERE / "schemathesis.toml"), "run",
        f"{live_url}/openapi.json", "--checks", "all", "--workers", "1",
        "--max-examples", str(EXAMPLES), "--seed", str(SEED),
        "--header", "X-API-Key: vidrec-dev-key", "--request-timeout", "10",
    ]
    result = subprocess.run(
        # cwd: st keeps a cache of its own (.schemathesis/) where it runs
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-12_000:]
    assert "No issues found" in output or " passed" in output, output[-3_000:]
