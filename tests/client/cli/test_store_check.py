"""A store that cannot work is refused before anything serves or reads it: ``gradvault
serve`` (and ``python -m gradvault.service``) over an S3 store without an endpoint or
credentials, or over a path that is a file, exit at once with one line naming what is
missing; ``gradvault ls`` of a file says it is a file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import S3_BUCKET, S3_CREDENTIALS

from .conftest import clean_environment


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _aws_free_environment(**extra: str) -> dict[str, str]:
    """No AWS_* or GRADVAULT_* variable, and the instance metadata service (where S3
    credentials come from when none are given) at a closed loopback port, so that nothing
    leaves the machine."""
    environment = {k: v for k, v in clean_environment().items() if not k.startswith("AWS_")}
    environment["AWS_METADATA_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    environment.update(extra)
    return environment


def _serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gradvault", "serve", *args, "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _assert_refused_in_one_line(done: subprocess.CompletedProcess[str], *names: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert "Uvicorn running" not in done.stderr and "API docs at" not in done.stderr
    for name in names:
        assert name in lines[0], lines[0]
    assert "Debug source" not in lines[0] and len(lines[0]) < 400, lines[0]
    return lines[0]


def test_serve_refuses_an_s3_store_with_no_endpoint_and_no_credentials() -> None:
    done = _serve("--store", "s3://some-bucket/x", env=_aws_free_environment())
    line = _assert_refused_in_one_line(
        done, "will not serve", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
    )
    assert line.startswith("gradvault serve: error: will not serve: cannot list the object store")


def test_serve_refuses_an_s3_endpoint_that_is_not_there() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    environment = _aws_free_environment(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID=S3_CREDENTIALS["access_key_id"],
        AWS_SECRET_ACCESS_KEY=S3_CREDENTIALS["secret_access_key"],
    )
    done = _serve("--store", f"s3://{S3_BUCKET}/x", env=environment)
    line = _assert_refused_in_one_line(done, "connection was refused")
    assert "not set" not in line  # endpoint and credentials were given


def test_serve_refuses_credentials_the_s3_server_does_not_know(s3_endpoint: str) -> None:
    environment = _aws_free_environment(
        AWS_ENDPOINT_URL=s3_endpoint, AWS_ACCESS_KEY_ID="nobody", AWS_SECRET_ACCESS_KEY="nothing"
    )
    done = _serve("--store", f"s3://{S3_BUCKET}/x", env=environment)
    _assert_refused_in_one_line(done, "answered 403", "InvalidAccessKeyId")


def test_serve_over_s3_with_what_it_needs_still_starts(s3_endpoint: str) -> None:
    from .conftest import ServeProcess

    environment = _aws_free_environment(
        AWS_ENDPOINT_URL=s3_endpoint,
        AWS_ACCESS_KEY_ID=S3_CREDENTIALS["access_key_id"],
        AWS_SECRET_ACCESS_KEY=S3_CREDENTIALS["secret_access_key"],
    )
    served = ServeProcess("--store", f"s3://{S3_BUCKET}/check-ok", env=environment)
    assert served.stop() == 0, "".join(served.log)


def test_serve_refuses_a_store_path_that_is_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a store")
    done = _serve("--store", str(afile), env=clean_environment())
    line = _assert_refused_in_one_line(done, str(afile), "is a file, not a folder")
    assert afile.read_text() == "not a store", line


def test_serve_refuses_a_store_under_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    done = _serve("--store", str(afile / "store"), env=clean_environment())
    _assert_refused_in_one_line(done, f"{afile}, on its path, is a file, not a folder")


def test_python_m_gradvault_service_refuses_a_store_path_that_is_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "gradvault.service", "--store", str(afile), "--port", "0"],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"gradvault.service: local store {afile}: it is a file, not a folder"
    ]


def test_a_store_folder_not_created_yet_still_serves(tmp_path: Path) -> None:
    from .conftest import ServeProcess

    served = ServeProcess("--store", str(tmp_path / "new" / "store"))
    assert served.stop() == 0, "".join(served.log)


@pytest.mark.parametrize("command", [["ls"], ["gc"], ["show", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]])
def test_commands_say_a_store_path_that_is_a_file_is_a_file(
    gradvault, tmp_path: Path, command: list[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    result = gradvault(*command, "--store", os.fspath(afile))
    assert result.code == 1, result.err
    assert result.error_lines == [
        f"gradvault {command[0]}: error: the store is a file, not a folder: {afile}"
    ]
