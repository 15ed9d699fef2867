"""The service image, really built and run; skipped (with the reason) without a Docker engine.

The base image comes from GRADVAULT_TEST_BASE_IMAGE, else the first of
``gradvault-base:bookworm`` (deploy/build-base-image.sh) and ``python:3.11-slim`` that
the engine already has: nothing is pulled from a registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TAG = "gradvault:test"
#: bounds every wait on the container; a test that hits it fails
HEALTHY_DEADLINE_SECONDS = 120
LOCAL_BASES = ("gradvault-base:bookworm", "python:3.11-slim")


def _docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed:\n{result.stderr}")
    return result


def _base_image() -> str:
    """A base image the engine has, or a skip saying why there is none."""
    if shutil.which("docker") is None:
        pytest.skip("no docker command on PATH")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        pytest.skip(f"no Docker engine reachable: {reason}")
    wanted = os.environ.get("GRADVAULT_TEST_BASE_IMAGE")
    for image in [wanted] if wanted else LOCAL_BASES:
        if _docker("image", "inspect", image, check=False).returncode == 0:
            return image
    pytest.skip(
        f"the Docker engine has none of {wanted or ', '.join(LOCAL_BASES)}; build one with "
        "deploy/build-base-image.sh (no image is pulled by the tests)"
    )


@pytest.fixture(scope="module")
def image() -> str:
    base = _base_image()
    build = _docker("build", "--build-arg", f"BASE_IMAGE={base}", "-t", TAG, ".", timeout=540)
    assert "Successfully" in build.stdout or build.returncode == 0
    return TAG


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = f"gradvault-test-{uuid.uuid4().hex[:12]}"
    _docker(
        "run", "--detach", "--name", name, "--publish", "127.0.0.1::8000",
        "--env", "GRADVAULT_TOKENS=image-test-token:write", image,
    )  # fmt: skip
    try:
        yield name
    finally:
        _docker("rm", "--force", name, check=False)


def _state(name: str) -> dict:
    return json.loads(_docker("inspect", "--format", "{{json .State}}", name).stdout)


def test_the_image_serves_becomes_healthy_and_stops_on_sigterm(container: str) -> None:
    deadline = time.monotonic() + HEALTHY_DEADLINE_SECONDS
    while (state := _state(container))["Health"]["Status"] != "healthy":
        assert state["Running"], _docker("logs", container).stderr
        assert time.monotonic() < deadline, f"not healthy: {state['Health']}"
        time.sleep(0.5)
    port = _docker("port", container, "8000/tcp").stdout.split()[0].rpartition(":")[2]
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/healthz", timeout=10) as response:
        assert json.load(response) == {"status": "ok"}
    with pytest.raises(urllib.error.HTTPError) as refused:  # tokens came from the environment
        urllib.request.urlopen(f"{base}/v1/snapshots", timeout=10)
    assert refused.value.code == 401
    assert _docker("exec", container, "id", "-u").stdout.strip() != "0"
    # tini passes SIGTERM on, the server shuts down and tini reports success; a server
    # that ignored it would be killed after the grace period (exit code 137)
    _docker("stop", "--time", "30", container, timeout=60)
    state = _state(container)
    assert not state["Running"] and state["ExitCode"] == 0, state


def test_the_image_refuses_to_serve_open_on_all_addresses(image: str) -> None:
    result = _docker("run", "--rm", image, check=False, timeout=120)
    assert result.returncode == 2, result
    assert "GRADVAULT_TOKENS" in result.stderr and "GRADVAULT_ALLOW_OPEN" in result.stderr
