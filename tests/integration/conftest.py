"""A real Qdrant server for the integration tests.

Where it comes from, in order: ``RMQ_QDRANT_URL`` (a server you started), else
``docker/compose.yaml`` through pytest-docker when a Docker engine answers. With
neither, the tests skip with the reason, unless ``RMQ_REQUIRE_SERVER=1`` says a
server is required, in which case they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "compose.yaml"


def _docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(COMPOSE)


@pytest.fixture(scope="session")
def server_url(request: pytest.FixtureRequest) -> str:
    url = os.environ.get("RMQ_QDRANT_URL")
    if url:
        url = url.rstrip("/")
        if not _healthy(url):
            pytest.fail(f"RMQ_QDRANT_URL={url} is set but no Qdrant server answers there")
        return url
    if _docker_engine_answers():
        services = request.getfixturevalue("docker_services")
        url = f"http://127.0.0.1:{services.port_for('qdrant', 6333)}"
        services.wait_until_responsive(timeout=90, pause=1, check=lambda: _healthy(url))
        return url
    reason = "no Qdrant server: RMQ_QDRANT_URL is unset and no Docker engine is reachable"
    if os.environ.get("RMQ_REQUIRE_SERVER") == "1":
        pytest.fail(f"RMQ_REQUIRE_SERVER=1 but {reason}")
    pytest.skip(reason)
