"""Both clients against a real service on loopback: push, read back, list, delete, errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import (
    AuthError,
    ClientRequestError,
    GradientsParams,
    SnapshotNotFoundError,
)
from gradvault.core.records.safetensors_file import record_from_safetensors
from tests.service.conftest import make_record

from .conftest import READ_TOKEN, ClientUnderTest

MISSING_ID = "0" * 26


async def test_push_then_fetch_and_restore_are_bit_identical(api: ClientUnderTest) -> None:
    record = make_record(seed=1, sizes=((64, 33), (7,), (0,)))
    summary = await api.call("push", record, run="r1", step=5, tags={"lr": "0.1"})
    assert (summary.run, summary.step, summary.num_params) == ("r1", 5, 3)
    assert summary.nbytes == record.nbytes

    info = await api.call("info", summary.id)
    assert info["tags"] == {"lr": "0.1"}
    assert [g["param_id"] for g in info["gradients"]] == [str(e.param_id) for e in record]

    fetched = await api.call("fetch", summary.id)
    for sent, got in zip(record, fetched, strict=True):
        assert (got.param_id, got.name, got.dtype, got.shape) == (
            sent.param_id,
            sent.name,
            sent.dtype,
            sent.shape,
        )
        assert bytes(got.data) == bytes(sent.data)

    grads = await api.call("restore", summary.id, "cpu")
    assert isinstance(grads, GradientsParams)
    restored = grads.try_to_record()
    assert [bytes(e.data) for e in restored] == [bytes(e.data) for e in record]

    again = await api.call("push", grads, run="r1", step=6)  # GradientsParams, not a record
    refetched = await api.call("fetch", again.id)
    assert [bytes(e.data) for e in refetched] == [bytes(e.data) for e in record]


async def test_download_writes_safetensors_and_npz(api: ClientUnderTest, tmp_path: Path) -> None:
    record = make_record(seed=2)
    out = tmp_path / "downloads"
    out.mkdir()
    summary = await api.call("push", record, run="r", step=0)

    safetensors_path = await api.call("download", summary.id, out / "s.safetensors")
    read_back = record_from_safetensors(safetensors_path)
    assert [bytes(e.data) for e in read_back] == [bytes(e.data) for e in record]

    npz_path = await api.call("download", summary.id, out / "s.npz")
    with np.load(npz_path) as arrays:
        for entry in record:
            np.testing.assert_array_equal(arrays[str(entry.param_id)], entry.array)
    assert sorted(p.name for p in out.iterdir()) == ["s.npz", "s.safetensors"]


async def test_list_follows_the_cursor_across_pages(
    api: ClientUnderTest, run_named: Callable[[str], str]
) -> None:
    paged = run_named("paged")
    ids = [(await api.call("push", make_record(seed=i), run=paged, step=i)).id for i in range(5)]
    await api.call("push", make_record(seed=9), run=run_named("other"), step=0)

    listed = await api.list(run=paged, page_size=2)
    assert [s.id for s in listed] == ids[::-1]  # newest first, over three pages
    assert [s.step for s in await api.list(run=paged, step_min=1, step_max=3)] == [3, 2, 1]


async def test_delete_removes_the_snapshot(
    api: ClientUnderTest, run_named: Callable[[str], str]
) -> None:
    summary = await api.call("push", make_record(), run=run_named("r"), step=1)
    await api.call("delete", summary.id)
    assert await api.list(run=run_named("r")) == []
    assert summary.id not in {s.id for s in await api.list()}
    with pytest.raises(SnapshotNotFoundError, match=summary.id):
        await api.call("info", summary.id)


async def test_a_missing_snapshot_is_snapshot_not_found(api: ClientUnderTest) -> None:
    for method in ("info", "fetch", "delete"):
        with pytest.raises(SnapshotNotFoundError, match=MISSING_ID) as caught:
            await api.call(method, MISSING_ID)
        assert caught.value.status == 404  # type: ignore[attr-defined]
        assert caught.value.response.status_code == 404  # type: ignore[attr-defined]
        assert caught.value.error == "SnapshotNotFoundError"  # type: ignore[attr-defined]


async def test_a_wrong_token_is_auth_error(make_api, run_named) -> None:  # type: ignore[no-untyped-def]
    wrong = await make_api(token="not-the-token")
    with pytest.raises(AuthError, match="HTTP 401") as caught:
        await wrong.call("push", make_record(), run=run_named("r"), step=0)
    assert caught.value.request.method == "POST"  # type: ignore[attr-defined]
    anonymous = await make_api(token=None)
    with pytest.raises(AuthError):
        await anonymous.call("delete", MISSING_ID)
    reader = await make_api(token=READ_TOKEN)
    assert run_named("r") not in {s.run for s in await reader.list()}  # nothing was stored
    with pytest.raises(AuthError, match="HTTP 403") as caught:
        await reader.call("delete", MISSING_ID)
    assert caught.value.status == 403  # type: ignore[attr-defined]


async def test_a_refused_field_carries_the_server_detail(api: ClientUnderTest) -> None:
    with pytest.raises(ClientRequestError, match="HTTP 4") as caught:
        await api.call("push", make_record(), run="", step=0)
    error = caught.value
    assert error.status in (400, 422)
    assert error.detail


def test_the_client_never_imports_the_service(tmp_path: Path) -> None:
    code = (
        "import sys, gradvault.client\n"
        "bad = [m for m in ('fastapi', 'uvicorn', 'gradvault.service') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True)
    assert result.returncode == 0, result.stderr
