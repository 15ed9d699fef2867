"""docker-compose.yml and the Dockerfiles: what they promise, checked without a Docker engine.

``docker-compose config`` validates the file where Debian's docker-compose is installed
(skipped, with the reason, elsewhere); tests/deploy/test_image.py builds and runs the
image where a Docker engine answers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gradvault.core import store as store_package
from gradvault.service import Settings

ROOT = Path(__file__).resolve().parents[2]
SERVICE_REPLICAS = ("gradvault", "replica")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env_file_names(service: dict[str, Any]) -> list[str]:
    env_file = service.get("env_file", [])
    return [env_file] if isinstance(env_file, str) else list(env_file)


def _env_file_variables(name: str) -> dict[str, str]:
    """The variables an env file sets, read from its committed example."""
    variables = {}
    for line in (ROOT / f"{name}.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            variables[key] = value
    return variables


def test_the_stack_has_its_services_and_the_scaled_profile(compose) -> None:
    services = compose["services"]
    assert set(services) == {"seaweedfs", "bucket-init", "gradvault", "replica", "nginx"}
    assert {name for name, s in services.items() if "scaled" in s.get("profiles", [])} == {
        "replica",
        "nginx",
    }
    assert "profiles" not in services["gradvault"]  # a plain `up` serves


def test_ports_are_published_on_loopback_only(compose) -> None:
    published = {
        name: service["ports"]
        for name, service in compose["services"].items()
        if "ports" in service
    }
    assert set(published) == {"gradvault", "nginx"}
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port!r}"


def test_start_up_is_ordered_by_health(compose) -> None:
    services = compose["services"]
    assert services["bucket-init"]["depends_on"] == {"seaweedfs": {"condition": "service_healthy"}}
    assert services["gradvault"]["depends_on"] == {
        "seaweedfs": {"condition": "service_healthy"},
        "bucket-init": {"condition": "service_completed_successfully"},
    }
    assert services["replica"]["depends_on"] == {"gradvault": {"condition": "service_healthy"}}
    assert services["nginx"]["depends_on"] == {
        "gradvault": {"condition": "service_healthy"},
        "replica": {"condition": "service_healthy"},
    }
    assert services["bucket-init"]["restart"] == "no"  # one-shot


def test_seaweedfs_keeps_its_data_in_a_named_volume(compose) -> None:
    volume, _, target = compose["services"]["seaweedfs"]["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == "/data"


def test_every_image_builds_from_the_base_image_argument(compose) -> None:
    builds = [s["build"] for s in compose["services"].values() if "build" in s]
    assert len(builds) == 3  # service, SeaweedFS, nginx
    for build in builds:
        assert build["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"
        dockerfile = ROOT / build["context"] / build.get("dockerfile", "Dockerfile")
        text = dockerfile.read_text()
        assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M), dockerfile
        assert all(
            line == "FROM ${BASE_IMAGE}" or line.startswith("FROM ${BASE_IMAGE} AS ")
            for line in re.findall(r"^FROM .*$", text, re.M)
        ), dockerfile


def test_secrets_come_from_env_files_whose_examples_are_committed(compose) -> None:
    for name, service in compose["services"].items():
        for env_file in _env_file_names(service):
            assert (ROOT / f"{env_file}.example").is_file(), (name, env_file)
            ignored = subprocess.run(["git", "check-ignore", "-q", env_file], cwd=ROOT, check=False)
            assert ignored.returncode == 0, f"{env_file} (secrets) is not git-ignored"
        for key in service.get("environment", {}):
            assert "SECRET" not in key and "TOKEN" not in key, (name, key)
    assert "GRADVAULT_TOKENS" in _env_file_variables("deploy/gradvault.env")


def test_every_variable_set_for_the_service_is_one_it_reads(compose) -> None:
    # the store's settings: open_store, and the S3 backend it hands S3 URLs to (read as
    # text, the package's every module, wherever the store keeps them)
    store_folder = Path(store_package.__file__).parent
    store_source = "".join(path.read_text() for path in sorted(store_folder.rglob("*.py")))
    for name in SERVICE_REPLICAS:
        service = compose["services"][name]
        variables = dict(service["environment"])
        for env_file in _env_file_names(service):
            variables.update(_env_file_variables(env_file))
        for key in variables:
            if key.startswith("GRADVAULT_"):
                field = key.removeprefix("GRADVAULT_").lower()
                assert field in Settings.model_fields, f"{name}: {key} is no setting"
            else:
                assert f'"{key}"' in store_source, f"{name}: open_store does not read {key}"
    assert compose["services"]["gradvault"]["environment"]["GRADVAULT_STORE"].startswith("s3://")


def test_the_service_image_is_non_root_with_init_healthcheck_and_runtime_extra() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER gradvault$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.M)
    entrypoint = re.search(r"^ENTRYPOINT (.*)$", text, re.M)
    assert entrypoint and entrypoint[1].startswith('["tini", "-e", "143", "--"'), entrypoint
    installs = re.findall(r"pip install [^\n]*", text)
    assert installs == ['pip install --no-cache-dir "/tmp/gradvault-src[service]" \\'], installs


def test_the_compose_file_validates(tmp_path: Path) -> None:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (Debian package docker-compose)")
    # the real env files hold secrets and are not committed: validate with the examples
    shutil.copy(ROOT / "docker-compose.yml", tmp_path)
    (tmp_path / "deploy").mkdir()
    for example in (ROOT / "deploy").glob("*.env.example"):
        shutil.copy(example, tmp_path / "deploy" / example.name.removesuffix(".example"))
    for profile in ([], ["--profile", "scaled"]):
        result = subprocess.run(
            ["docker-compose", *profile, "config", "-q"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr


def test_the_image_gets_every_package_folder_of_the_project() -> None:
    """A package folder that the Dockerfile leaves out breaks `pip install` inside the build:
    the package root (pyproject's `where`) and every folder one of its links points to."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (where,) = project["tool"]["setuptools"]["packages"]["find"]["where"]
    folders = {where}
    for entry in (ROOT / where / "gradvault").iterdir():
        if entry.is_symlink():
            folders.add(str(entry.resolve().relative_to(ROOT)))
    assert {"src", "core", "service", "client", "integrations"} <= folders, folders
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) /tmp/gradvault-src/\1$", dockerfile, re.M))
    assert folders <= copied, f"the Dockerfile does not copy {sorted(folders - copied)}"
    kept = {
        line.strip().removeprefix("!").rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert folders <= kept, f".dockerignore leaves out {sorted(folders - kept)}"
