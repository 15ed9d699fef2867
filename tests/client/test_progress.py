"""``progress=`` on the transfer calls: told as bytes move, ending at the total."""

from __future__ import annotations

from pathlib import Path

from gradvault.core.records.safetensors_file import record_header
from tests.service.conftest import make_record

from .conftest import ClientUnderTest


class Reports(list[tuple[int, "int | None"]]):
    """Every ``(done_bytes, total_bytes)`` a transfer told."""

    def __call__(self, done: int, total: int | None) -> None:
        self.append((done, total))

    def assert_complete(self, total: int) -> None:
        assert self, "progress was never told"
        assert self[0] == (0, total)
        assert self[-1] == (total, total)
        dones = [done for done, _ in self]
        assert dones == sorted(dones)
        assert {reported for _, reported in self} == {total}


async def test_push_fetch_download_restore_report_progress(
    api: ClientUnderTest, tmp_path: Path
) -> None:
    record = make_record(seed=11, sizes=((256, 64), (64,), (3, 5)))
    file_length = len(record_header(record)) + record.nbytes

    pushed = Reports()
    summary = await api.call("push", record, run="p", step=1, progress=pushed)
    pushed.assert_complete(file_length)
    assert len(pushed) >= 4  # the header, then each gradient

    for method, args in (
        ("fetch", ()),
        ("restore", ("cpu",)),
        ("download", (tmp_path / "p.safetensors",)),
        ("download", (tmp_path / "p.npz",)),
    ):
        fetched = Reports()
        await api.call(method, summary.id, *args, progress=fetched)
        served = fetched[-1][1]
        assert served is not None
        fetched.assert_complete(served)
        assert served >= record.nbytes  # the service's own header may differ in metadata
