"""``SnapshotStore.check``: a store that cannot be listed raises StoreUnavailableError in one
readable line naming what is wrong; obstore's debug text stays on the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradvault.core import StoreUnavailableError, open_store

from ..conftest import S3_BUCKET, S3_CREDENTIALS


async def _check(url: str, **options: object) -> None:
    store = open_store(url, **options)
    try:
        await store.check()
    finally:
        await store.close()


async def test_a_folder_and_a_folder_not_created_yet_pass(tmp_path: Path) -> None:
    await _check(str(tmp_path))
    await _check(str(tmp_path / "not" / "yet"))
    assert not (tmp_path / "not").exists()  # nothing written


async def test_a_file_or_a_file_on_the_path_is_named(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(StoreUnavailableError) as raised:
        await _check(str(afile))
    assert str(raised.value) == f"local store {afile}: it is a file, not a folder"
    with pytest.raises(StoreUnavailableError) as raised:
        await _check(str(afile / "store"))
    assert str(raised.value) == (
        f"local store {afile / 'store'}: {afile}, on its path, is a file, not a folder"
    )


async def test_an_s3_store_with_what_it_needs_passes(s3_endpoint: str) -> None:
    await _check(f"s3://{S3_BUCKET}/checked", endpoint=s3_endpoint, **S3_CREDENTIALS)


@pytest.mark.parametrize(
    ("bucket", "credentials", "said"),
    [
        (S3_BUCKET, {"access_key_id": "nobody", "secret_access_key": "x"}, "InvalidAccessKeyId"),
        ("no-such-bucket-here", S3_CREDENTIALS, "answered 404 (NoSuchBucket"),
    ],
    ids=["unknown-credentials", "no-bucket"],
)
async def test_an_s3_store_the_server_refuses_is_one_readable_line(
    s3_endpoint: str, bucket: str, credentials: dict[str, str], said: str
) -> None:
    with pytest.raises(StoreUnavailableError) as raised:
        await _check(f"s3://{bucket}/x", endpoint=s3_endpoint, **credentials)
    message = str(raised.value)
    assert message.startswith(f"cannot list the object store s3://{bucket}/x: the server")
    assert said in message and "\n" not in message and len(message) < 300, message
    assert "Debug source" in str(raised.value.__cause__)  # for the log, not the message
