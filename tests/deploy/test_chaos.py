"""deploy/chaos.py's parts that run without Docker: SeaweedFS's view read, attempts counted.

The chaos phase itself runs in ``make deploy-check`` (root, Docker); docs/DEPLOY.md.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from gradvault.client import Client

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_chaos", ROOT / "deploy" / "chaos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _node(url: str) -> dict:
    return {"Url": url, "PublicUrl": url, "Volumes": 0}


def _copy(vid: int, files: int, node: int = 1) -> dict:
    return {"Id": vid, "FileCount": files, "ReplicaPlacement": {"node": node}}


def test_the_view_names_every_server_and_every_copy(chaos) -> None:
    topology = {
        "DataCenters": [
            {
                "Racks": [
                    {
                        "DataNodes": [
                            _node("volume-1:8080"),
                            _node("volume-2:8080"),  # holds no volume: still a server
                            _node("volume-3:8080"),
                        ]
                    }
                ]
            }
        ],
        "Layouts": [{"writables": [1]}, {"writables": None}],
    }
    volumes = {
        "DataCenters": {
            "DefaultDataCenter": {
                "DefaultRack": {
                    "volume-1:8080": [_copy(1, 5), _copy(2, 3), _copy(4, 0), _copy(4, 0)],
                    "volume-3:8080": [_copy(1, 5), _copy(3, 1, node=0), _copy(2, 3)],
                }
            }
        }
    }
    view = chaos.VolumeView.parse(topology, volumes)
    assert view.servers == ["volume-1", "volume-2", "volume-3"]
    assert view.writable == {1}
    assert view.copies == {
        1: ["volume-1", "volume-3"],
        2: ["volume-1", "volume-3"],
        3: ["volume-3"],
        4: ["volume-1", "volume-1"],
    }
    assert view.wanted == {1: 2, 2: 2, 3: 1, 4: 2}  # 001: two copies; 000: one
    assert view.under() == [4]  # two copies, one server
    assert view.doubled() == [4]
    assert view.over() == []
    assert view.files[(1, "volume-3")] == 5
    described = view.describe()
    assert "volume servers volume-1, volume-2, volume-3" in described
    assert "volume   1: 2/2 copies, writable: volume-1(5 files),volume-3(5 files)" in described
    assert "volume   2: 2/2 copies, read-only" in described


def test_a_copy_too_many_is_over_replicated(chaos) -> None:
    volumes = {
        "DataCenters": {"dc": {"rack": {f"volume-{n}:8080": [_copy(7, 2)] for n in (1, 2, 3)}}}
    }
    view = chaos.VolumeView.parse({"DataCenters": [], "Layouts": []}, volumes)
    assert view.over() == [7] and view.under() == [] and view.servers == []


def test_the_check_repairs_with_the_masters_own_maintenance_script(chaos) -> None:
    config = tomllib.loads((ROOT / "deploy/seaweedfs/master.toml").read_text())
    maintenance = config["master"]["maintenance"]
    script = [line.strip() for line in maintenance["scripts"].splitlines() if line.strip()]
    assert script == chaos.REPAIR_SCRIPT.splitlines()
    assert maintenance["sleep_minutes"] >= 1


@pytest.fixture
def flaky_service() -> Iterator[tuple[str, list[str]]]:
    """A server on loopback that answers 503 to a snapshot's first GET, then its manifest."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            status, body = (503, b'{"detail": "busy"}') if len(seen) == 1 else (200, b"{}")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_transport_counts_each_attempt_and_each_retried_failure(chaos, flaky_service) -> None:
    url, seen = flaky_service
    tally = chaos.Tally()
    transport = chaos.CountingTransport(tally)
    with Client(url, "token", transport=transport, backoff_seconds=0.01) as client:
        assert client.info("snap") == {}
    assert seen == ["/v1/snapshots/snap", "/v1/snapshots/snap"]
    assert tally.requests == 2
    assert dict(tally.failed) == {"HTTP 503": 1}
