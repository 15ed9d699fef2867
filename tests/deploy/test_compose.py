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
from tests.s3server import weed_binary

ROOT = Path(__file__).resolve().parents[2]
SERVICE_REPLICAS = ("gradvault", "replica", "cluster-gradvault", "cluster-replica")
MASTERS = ("master-1", "master-2", "master-3")
VOLUME_SERVERS = ("volume-1", "volume-2", "volume-3")
CLUSTER = {
    *MASTERS,
    *VOLUME_SERVERS,
    "filer",
    "s3",
    "cluster-bucket-init",
    "cluster-gradvault",
    "cluster-replica",
    "cluster-nginx",
}
HEALTHY = {"condition": "service_healthy"}


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


def _profile(compose: dict[str, Any], profile: str) -> set[str]:
    return {name for name, s in compose["services"].items() if profile in s.get("profiles", [])}


def _command(compose: dict[str, Any], name: str) -> list[str]:
    return [str(word) for word in compose["services"][name]["command"]]


def _flag(command: list[str], flag: str) -> str:
    """The value of ``-flag=value`` or ``-flag value`` in a SeaweedFS command line."""
    for i, word in enumerate(command):
        if word.startswith(f"-{flag}="):
            return word.partition("=")[2]
        if word == f"-{flag}":
            return command[i + 1]
    raise AssertionError(f"no -{flag} in {command}")


def test_the_stack_has_its_services_and_profiles(compose) -> None:
    services = compose["services"]
    single = {"seaweedfs", "bucket-init", "gradvault", "replica", "nginx"}
    assert set(services) == single | CLUSTER
    assert _profile(compose, "scaled") == {"replica", "nginx"}
    assert _profile(compose, "cluster") == CLUSTER
    assert "profiles" not in services["gradvault"]  # a plain `up` serves
    for name in CLUSTER:  # one profile each: `--profile cluster` adds nothing to `scaled`
        assert services[name]["profiles"] == ["cluster"], name


def test_ports_are_published_on_loopback_only(compose) -> None:
    published = {
        name: service["ports"]
        for name, service in compose["services"].items()
        if "ports" in service
    }
    assert set(published) == {"gradvault", "nginx", "cluster-nginx"}
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


def test_the_cluster_starts_in_order_of_health(compose) -> None:
    services = compose["services"]
    masters = {name: HEALTHY for name in MASTERS}
    for name in (*VOLUME_SERVERS, "filer"):
        assert services[name]["depends_on"] == masters, name
    assert services["s3"]["depends_on"] == {"filer": HEALTHY}
    # the bucket, then a write: every volume server up, so that a write finds two of them
    assert services["cluster-bucket-init"]["depends_on"] == {
        **{name: HEALTHY for name in VOLUME_SERVERS},
        "s3": HEALTHY,
    }
    assert services["cluster-bucket-init"]["restart"] == "no"
    assert services["cluster-bucket-init"]["entrypoint"][0] == "create-bucket"
    # the service waits for a store that took a write (create-bucket's probe)
    assert services["cluster-gradvault"]["depends_on"] == {
        "cluster-bucket-init": {"condition": "service_completed_successfully"}
    }
    assert services["cluster-replica"]["depends_on"] == {"cluster-gradvault": HEALTHY}
    assert services["cluster-nginx"]["depends_on"] == {
        "cluster-gradvault": HEALTHY,
        "cluster-replica": HEALTHY,
    }
    probe = (ROOT / "deploy/seaweedfs/create-bucket.sh").read_text()
    assert re.search(r"signed PUT \"\$endpoint/\$bucket/write-probe\"", probe)


def test_the_cluster_runs_seaweedfs_as_its_parts_on_one_image(compose) -> None:
    services = compose["services"]
    image = services["seaweedfs"]["image"]
    parts = {*MASTERS, *VOLUME_SERVERS, "filer", "s3"}
    for name in parts:
        assert services[name]["image"] == image, name
    peers = ",".join(f"{name}:9333" for name in MASTERS)
    for name in MASTERS:
        command = _command(compose, name)
        assert command[0] == "master", command
        assert _flag(command, "ip") == name
        assert _flag(command, "peers") == peers  # three masters: Raft, one may be lost
        # two copies of every volume, on two servers of one rack (docs/DEPLOY.md)
        assert _flag(command, "defaultReplication") == "001"
    for name in VOLUME_SERVERS:
        command = _command(compose, name)
        assert command[0] == "volume" and _flag(command, "ip") == name, command
        assert _flag(command, "master") == peers
    filer = _command(compose, "filer")
    assert filer[0] == "filer" and _flag(filer, "master") == peers
    s3 = _command(compose, "s3")
    assert s3[0] == "s3" and _flag(s3, "filer") == "filer:8888"
    assert _flag(s3, "port") == "8333"


def test_every_seaweedfs_part_has_a_health_check(compose) -> None:
    services = compose["services"]
    image_check = re.search(
        r"^HEALTHCHECK .*\n?.*(http://127\.0\.0\.1:\d+/healthz)",
        (ROOT / "deploy/seaweedfs/Dockerfile").read_text(),
        re.M,
    )
    assert image_check and image_check[1].endswith(":8333/healthz")
    ports = {"master": "9333", "volume": "8080", "filer": "8888", "s3": "8333"}
    for name in (*MASTERS, *VOLUME_SERVERS, "filer", "s3"):
        command = _command(compose, name)
        port = ports[command[0]]
        assert _flag(command, "port") == port, name
        if "healthcheck" in services[name]:
            url = services[name]["healthcheck"]["test"][-1]
        else:  # the image's own: the S3 gateway's port
            url = image_check[1]
        assert url.startswith(f"http://127.0.0.1:{port}/"), (name, url)


def test_each_volume_server_master_and_filer_keeps_its_data_in_its_named_volume(
    compose,
) -> None:
    seen = set()
    for name in (*MASTERS, *VOLUME_SERVERS, "filer"):
        mounts = [m for m in compose["services"][name]["volumes"] if m.endswith(":/data")]
        assert len(mounts) == 1, (name, mounts)
        volume = mounts[0].partition(":")[0]
        assert volume in compose["volumes"] and volume not in seen, (name, volume)
        seen.add(volume)
    for name in MASTERS:  # the maintenance script, read-only
        assert (
            "./deploy/seaweedfs/master.toml:/etc/seaweedfs/master.toml:ro"
            in (compose["services"][name]["volumes"])
        )


def test_on_the_cluster_network_the_single_server_names_are_the_clusters(compose) -> None:
    """nginx.conf and the service's AWS_ENDPOINT_URL name seaweedfs, gradvault and replica."""
    services = compose["services"]
    for name in CLUSTER:
        networks = services[name]["networks"]
        assert list(networks) == ["cluster"], name
    aliases = {
        name: services[name]["networks"]["cluster"]["aliases"]
        for name in ("s3", "cluster-gradvault", "cluster-replica")
    }
    assert aliases == {
        "s3": ["seaweedfs"],
        "cluster-gradvault": ["gradvault"],
        "cluster-replica": ["replica"],
    }
    upstreams = re.findall(
        r"^\s*server (\S+):8000;", (ROOT / "deploy/nginx/nginx.conf").read_text(), re.M
    )
    assert upstreams == ["gradvault", "replica"]
    for name in SERVICE_REPLICAS:
        assert services[name]["environment"]["AWS_ENDPOINT_URL"] == "http://seaweedfs:8333"
    for name in ("seaweedfs", "bucket-init", "gradvault", "replica", "nginx"):
        assert "networks" not in services[name], name  # the default network


def test_the_single_seaweedfs_keeps_its_data_in_a_named_volume(compose) -> None:
    volume, _, target = compose["services"]["seaweedfs"]["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == "/data"


def test_every_image_builds_from_the_base_image_argument(compose) -> None:
    builds = [s["build"] for s in compose["services"].values() if "build" in s]
    # service, SeaweedFS, nginx; the cluster's services build the same three images
    dockerfiles = {build.get("dockerfile", "Dockerfile") for build in builds}
    assert dockerfiles == {"Dockerfile", "deploy/seaweedfs/Dockerfile", "deploy/nginx/Dockerfile"}
    images = {s["image"] for s in compose["services"].values() if "build" in s}
    assert images == {"gradvault:local", "gradvault-seaweedfs:local", "gradvault-nginx:local"}
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


def test_every_variable_set_for_seaweedfs_is_one_it_reads(compose) -> None:
    """The S3 gateway reads the key pair (weed's own code), create-bucket its variables."""
    weed = Path(weed_binary()).read_bytes()
    create_bucket = (ROOT / "deploy/seaweedfs/create-bucket.sh").read_text()
    checked = 0
    for name, service in compose["services"].items():
        if service.get("image") != "gradvault-seaweedfs:local":
            continue
        variables = dict(service.get("environment") or {})
        for env_file in _env_file_names(service):
            variables.update(_env_file_variables(env_file))
        for key in variables:
            checked += 1
            if service.get("entrypoint", [""])[0] == "create-bucket":
                assert f"${{{key}" in create_bucket, f"{name}: create-bucket does not read {key}"
            else:
                assert key.encode() in weed, f"{name}: weed never names {key}"
    assert checked >= 6  # seaweedfs, s3: the key pair; both bucket-inits: the pair and region


def test_every_variable_the_compose_file_reads_is_documented() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    deploy_doc = (ROOT / "docs/DEPLOY.md").read_text()
    variables = set(re.findall(r"\$\{(\w+)", text))
    assert variables == {
        "BASE_IMAGE",
        "S3_BUCKET",
        "PUBLISH_PORT",
        "LB_PUBLISH_PORT",
        "CLUSTER_PUBLISH_PORT",
    }
    for name in variables:
        assert name in header and f"`{name}`" in deploy_doc, name
    check = (ROOT / "deploy/check.sh").read_text()
    for name in variables - {"S3_BUCKET"}:  # make deploy-check sets them (free ports, base)
        assert re.search(rf"export [^\n]*\b{name}\b", check), name


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
    profiles = ([], ["--profile", "scaled"], ["--profile", "cluster"])
    for profile in (*profiles, ["--profile", "scaled", "--profile", "cluster"]):
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
    # the build's own files: pyproject.toml, and setup.py with the C extension's definition
    build = re.search(r"^COPY (.+) /tmp/gradvault-src/$", dockerfile, re.M)
    assert build is not None and {"pyproject.toml", "setup.py"} <= set(build[1].split())
    assert {"pyproject.toml", "setup.py"} <= kept
