"""Target: which places are a service and which a store, what each refuses, and the
Snapshotter taking one. How the Snapshotter and the Hugging Face callback read a URL or a
path through it: tests/client/test_snapshotter.py and
tests/integrations/test_transformers_setup.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gradvault.client import Target
from gradvault.core import InvalidArgumentError, InvalidArgumentTypeError

from .conftest import WRITE_TOKEN
from .test_snapshotter import Driver, training_gradients


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "https://vault.example:443/base", "HTTP://127.0.0.1:8000"]
)
def test_service_urls(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRADVAULT_TOKEN", raising=False)
    target = Target(url, "t0k")
    assert (target.is_service, target.location, target.token) == (True, url, "t0k")
    assert target.local_folder is None
    assert Target.service(url).token is None


def test_a_service_token_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADVAULT_TOKEN", "from-env")
    assert Target("http://127.0.0.1:8000").token == "from-env"
    assert Target("http://127.0.0.1:8000", "given").token == "given"
    assert Target("/tmp/store").token is None  # a store takes none, and ignores the variable
    monkeypatch.setenv("GRADVAULT_TOKEN", "")
    assert Target("http://127.0.0.1:8000").token is None


@pytest.mark.parametrize(
    ("location", "folder"),
    [
        ("/data/store", Path("/data/store")),
        (Path("relative/store"), Path("relative/store")),
        ("~/store", Path("~/store").expanduser()),
        ("file:///data/my%20store", Path("/data/my store")),
        ("FILE:///data/store", Path("/data/store")),
        ("file:/data/store", Path("/data/store")),
        ("s3://bucket/prefix", None),
    ],
)
def test_stores(location: str | os.PathLike[str], folder: Path | None) -> None:
    target = Target.store(location)
    assert (target.is_service, target.location) == (False, os.fspath(location))
    assert target.local_folder == folder


@pytest.mark.parametrize(
    ("location", "error", "words"),
    [
        (3, InvalidArgumentTypeError, "a target is a service URL .* or a store .*; got int 3"),
        (None, InvalidArgumentTypeError, "got NoneType None"),
        (b"/store", InvalidArgumentTypeError, "got bytes"),
        ("", InvalidArgumentError, "the target is empty"),
        ("http://", InvalidArgumentError, r"a service URL names its host .*; got 'http://'"),
        ("ftp://host/x", InvalidArgumentError, "got 'ftp://host/x'"),
        ("s3:bucket", InvalidArgumentError, "got 's3:bucket'; a URL has '//' after its scheme"),
    ],
)
def test_what_is_refused(location: Any, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        Target(location)


def test_the_kind_asked_for_is_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="a service is an http:// or https:// URL"):
        Target.service("/data/store")
    with pytest.raises(InvalidArgumentError, match="got the service URL 'http://h:1'"):
        Target.store("http://h:1")
    with pytest.raises(InvalidArgumentError, match="a token is for a service URL"):
        Target("/data/store", "t0k")
    target = Target("http://h:1", "t0k")
    assert Target.of(target) is target
    with pytest.raises(InvalidArgumentError, match="a token goes into the Target itself"):
        Target.of(target, "other")
    with pytest.raises(InvalidArgumentError, match="is a store, not a service URL"):
        Target("/data/store").client()
    with pytest.raises(InvalidArgumentError, match="is a service URL, not a store"):
        Target("http://h:1").recorder()


def test_target_imports_without_httpx() -> None:
    """A store is named where only the core is installed (``gradvault ls --store``)."""
    program = (
        "import sys; sys.modules['httpx'] = None\n"
        "from gradvault.client import Target\n"
        "print(Target('/data/store').is_service)\n"
        "try:\n"
        "    from gradvault.client import Client\n"
        "except ImportError as error:\n"
        "    print('ImportError', error.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "ImportError", "httpx"]


async def test_snapshotter_takes_a_target(kind: str, service_url: str, tmp_path: Path) -> None:
    grads, _ = training_gradients()
    for target in (Target(service_url, WRITE_TOKEN), Target(tmp_path / "store")):
        snap = Driver(kind, target, run="target")
        await snap.step(0, grads)
        assert (await snap.close()).committed == 1
    assert (tmp_path / "store").is_dir()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param
