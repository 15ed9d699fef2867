"""Where the snapshot commands go: retention over the service as the store's own pass does
it, and ``--store`` read as the store reads it."""

from __future__ import annotations

from pathlib import Path
from urllib.request import pathname2url

from gradvault.client import Client
from gradvault.client.cli.targets import ServiceTarget
from gradvault.service import Settings, create_app
from tests.client.conftest import WRITE_TOKEN
from tests.client.test_retention import DeletesTheNewestAfterTheListing, push_run
from tests.service.conftest import UvicornThread

from .test_commands import one_error_line


def test_gc_over_the_service_decides_again_when_the_newest_goes(tmp_path: Path) -> None:
    """``gc --keep-last 2 --url``: someone else deletes the newest snapshot once the pass has
    listed; the pass keeps the two newest left, as the store's own pass does
    (tests/client/test_retention.py), instead of the one its listing would leave."""
    settings = Settings(
        store=str(tmp_path / "store"), index_refresh_seconds=0, tokens=f"{WRITE_TOKEN}:write"
    )
    server = UvicornThread(create_app(settings))
    server.start()
    try:
        ids = push_run(server.base_url, "gc")  # steps 4, 3, 2, 1, 0
        target = ServiceTarget(server.base_url, WRITE_TOKEN)
        transport = DeletesTheNewestAfterTheListing(server.base_url)
        target.client.close()
        target.client = Client(server.base_url, WRITE_TOKEN, transport=transport)
        try:
            deleted = target.apply_retention(2, None, "gc")
            kept = [info.step for info in target.list("gc", None, None, None)]
        finally:
            target.close()
    finally:
        server.stop()
    assert transport.deleted == [ids[0]]
    assert kept == [3, 2]
    assert deleted == ids[3:]


def test_store_as_a_file_url_is_the_folder_the_store_opens(gradvault, tmp_path: Path) -> None:
    """``file://`` URLs escape a space as %20; the folder check reads it as the store does."""
    folder = tmp_path / "my store"
    folder.mkdir()
    url = "file://" + pathname2url(str(folder))
    assert "%20" in url
    result = gradvault("ls", "--store", url)
    assert result.code == 0, result.err
    assert result.out.strip() == f"no snapshots at {url}"


def test_store_that_is_a_url_missing_its_slashes_says_so(gradvault, tmp_path: Path) -> None:
    result = gradvault("ls", "--store", "s3:bucket")
    assert result.code == 1
    one_error_line(result, "gradvault ls: error:", "got 's3:bucket'", "'//' after its scheme")
