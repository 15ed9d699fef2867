"""A store whose files are hostile or damaged: every read ends, in bounded memory, with the
original bytes or a clear error naming the snapshot.

Reads run in a separate process (tests/core/store_reader.py) with a capped address space,
so that a read that would hang, crash or allocate without bound fails the test instead of
taking the suite down with it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.core.errors import ChecksumMismatchError
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, open_store

from ..store_files import (
    LocalFiles,
    edit_json,
    is_chunk_key,
    manifest_checksum,
    manifest_key,
    store_files,
)
from ..store_reader import ReaderProcess, digest

OPTIONS = {"chunk_bytes": 4096, "pack_threshold": 512}
#: The reader's address space: far above what these small stores need, far below 2**40.
ADDRESS_SPACE = 4 << 30


@pytest.fixture(scope="module")
def reader() -> Iterator[ReaderProcess]:
    process = ReaderProcess(ADDRESS_SPACE)
    yield process
    process.close()


def make_record() -> GradientsParamsRecord:
    rng = np.random.default_rng(0)
    arrays = {
        "fc.weight": rng.standard_normal((64, 33)).astype(np.float32),  # own array, 3 chunks
        "fc.bias": rng.standard_normal(33).astype(np.float32),  # packed
        "flags": rng.integers(0, 2, 13).astype(bool),  # packed
    }
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, a) for name, a in arrays.items()]
    )


def rows(record: GradientsParamsRecord) -> list[list]:
    """A record as the reader answers it."""
    return [[str(e.param_id), e.name, e.dtype, list(e.shape), digest(e.array)] for e in record]


class Case:
    """One snapshot written to this test's store, and ways to read it in the reader."""

    def __init__(
        self,
        reader: ReaderProcess,
        url: str,
        options: dict[str, Any],
        files: Any,
        record: GradientsParamsRecord,
        snapshot_id: str,
    ) -> None:
        self.reader, self.url, self.options = reader, url, {**options, **OPTIONS}
        self.files, self.record, self.id = files, record, snapshot_id
        self.own = record.entries[0]
        self.own_array = str(self.own.param_id)

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.reader.ask(
            {"op": op, "url": self.url, "options": self.options, "id": self.id, **fields}
        )

    def reads(self) -> dict[str, dict[str, Any]]:
        """Every way to read the snapshot: its answers by name."""
        answers = {op: self.ask(op) for op in ("read_snapshot", "restore")}
        for entry in self.record:
            answers[entry.name] = self.ask("read_gradient", param_id=str(entry.param_id))
        return answers

    def assert_refused(
        self,
        error: str,
        reads_named: list[str],
        *words: str,
        reads: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """The reads named (``read_snapshot``, ``restore`` or a gradient's name, for its
        ``read_gradient``) raise ``error`` naming the snapshot and ``words``."""
        answers = reads or self.reads()
        for op in reads_named:
            answer = answers[op]
            assert answer.get("error") == error, (op, answer)
            for word in (self.id, *words):
                assert word in answer["message"], (op, word, answer["message"])


#: The reads of the whole snapshot.
WHOLE = ["read_snapshot", "restore"]


@pytest.fixture
async def case(
    reader: ReaderProcess,
    make_store: Callable[..., SnapshotStore],
    store_url: str,
    store_kind: str,
    connection_options: dict[str, Any],
    request: pytest.FixtureRequest,
) -> Case:
    store = make_store(**OPTIONS)
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    await store.close()
    client = request.getfixturevalue("boto3_s3") if store_kind == "s3" else None
    files = store_files(store_url, client)
    return Case(reader, store_url, connection_options, files, record, info.id)


@pytest.fixture
async def local_case(reader: ReaderProcess, tmp_path: Path) -> Case:
    """A snapshot in a local store (what only a folder can hold in a file's place)."""
    root = tmp_path / "store"
    record = make_record()
    async with open_store(root, **OPTIONS) as store:
        info = await store.write_snapshot(record, run="r", step=1)
    return Case(reader, str(root), {}, LocalFiles(root), record, info.id)


def position(manifest: dict, name: str) -> int:
    return manifest["gradients"]["name"].index(name)


# --- claims the files cannot hold (no hang, no allocation of the claimed size) ----------


def claim_huge_own_array(document: dict) -> None:
    manifest = document["attributes"]["gradvault"]
    i = position(manifest, "fc.weight")
    table = manifest["gradients"]
    manifest["nbytes"] += 4 * 2**40 - table["nbytes"][i]
    table["shape"][i], table["chunk_shape"][i], table["nbytes"][i] = [2**40], [1], 4 * 2**40


async def test_an_own_array_claiming_2_40_chunks_is_refused_without_reading_them(
    case: Case,
) -> None:
    edit_json(case.files, manifest_key(case.id), claim_huge_own_array)
    assert case.ask("list")["result"] is not None  # ends
    case.assert_refused(
        "ManifestError", [*WHOLE, "fc.weight"], case.own_array, "'fc.weight'", "shape"
    )


async def test_an_array_document_agreeing_with_the_huge_claim_still_ends_in_an_error(
    case: Case,
) -> None:
    edit_json(case.files, manifest_key(case.id), claim_huge_own_array)

    def agree(document: dict) -> None:
        document["shape"] = [2**40]
        document["chunk_grid"]["configuration"]["chunk_shape"] = [1]

    edit_json(case.files, f"snapshots/{case.id}/{case.own_array}/zarr.json", agree)
    reads = case.reads()
    for op, answer in reads.items():
        assert answer.get("result") is not None or answer["gradvault"], (op, answer)
    case.assert_refused(
        "ChecksumMismatchError", [*WHOLE, "fc.weight"], case.own_array, "chunk", reads=reads
    )


def claim_huge_packed_array(document: dict) -> None:
    manifest = document["attributes"]["gradvault"]
    table = manifest["gradients"]
    last = position(manifest, "flags")
    table["offset"][last] = 2**40 - table["nbytes"][last]
    manifest["packed"]["nbytes"], manifest["packed"]["chunk_bytes"] = 2**40, 1


async def test_a_packed_array_of_2_40_one_byte_chunks_is_refused(case: Case) -> None:
    edit_json(case.files, manifest_key(case.id), claim_huge_packed_array)
    assert case.ask("list")["result"] is not None
    case.assert_refused(
        "ManifestError", [*WHOLE, "fc.bias", "flags"], "packed.nbytes", "1099511627776"
    )


# --- the manifest edited in place, at the same byte count (its checksum) ---------------

#: (what is edited, the bytes as written, the bytes put in their place): each edit keeps
#: the document's length and leaves a manifest every other check would take as it is
SAME_LENGTH_EDITS = [
    ("name of a packed gradient", b'"fc.bias"', b'"fc.bxas"'),
    ("dtype of a packed gradient", b'"bool"', b'"int8"'),
    ("shape of an own array", b"[64,33]", b"[33,64]"),
    ("step", b'"step":1', b'"step":7'),
    ("format version", b'"format_version":4', b'"format_version":1'),
]


@pytest.mark.parametrize(
    ("edited", "written", "replacement"),
    SAME_LENGTH_EDITS,
    ids=[edit[0] for edit in SAME_LENGTH_EDITS],
)
async def test_a_manifest_edited_in_place_is_refused_not_read_as_edited(
    case: Case, edited: str, written: bytes, replacement: bytes
) -> None:
    key = manifest_key(case.id)
    raw = case.files.read(key)
    assert raw.count(written) >= 1, edited
    start = raw.index(written)  # the manifest comes first in the group document
    assert start < raw.index(b'"consolidated_metadata"'), edited
    case.files.write(key, raw[:start] + replacement + raw[start + len(written) :])
    assert len(case.files.read(key)) == len(raw)
    # left out of listings, and every read names the snapshot and what failed
    assert case.id not in case.ask("list")["result"]
    words = ["carries no manifest_checksum"] if edited == "format version" else ["checksum"]
    case.assert_refused("ManifestError", [*WHOLE, "fc.weight", "fc.bias", "flags"], *words)
    info = case.ask("info")
    assert info.get("error") == "ManifestError" and case.id in info["message"], info


async def test_an_untouched_snapshot_of_this_format_reads(case: Case) -> None:
    document = json.loads(case.files.read(manifest_key(case.id)))
    manifest = document["attributes"]["gradvault"]
    assert manifest["format_version"] == 4
    assert manifest["manifest_checksum"] == manifest_checksum(manifest)
    assert case.ask("read_snapshot")["result"] == rows(case.record)
    assert case.id in case.ask("list")["result"]


# --- metadata that disagrees with the arrays' own zarr.json ----------------------------


def say_zstd(document: dict) -> None:
    document["attributes"]["gradvault"]["compression"] = "zstd:3"


def add_zstd_codec(document: dict) -> None:
    document["codecs"].insert(1, {"name": "zstd", "configuration": {"level": 3}})


async def test_a_manifest_saying_zstd_over_raw_chunks_names_the_parameter(case: Case) -> None:
    edit_json(case.files, manifest_key(case.id), say_zstd)
    reads = case.reads()
    # the whole snapshot: refused on whichever array's document is held against it first
    case.assert_refused("ManifestError", WHOLE, "codecs", "zstd", "compression", reads=reads)
    case.assert_refused(
        "ManifestError", ["fc.weight"], case.own_array, "'fc.weight'", "codecs", reads=reads
    )
    case.assert_refused("ManifestError", ["fc.bias", "flags"], "packed", reads=reads)


async def test_zstd_claimed_in_both_documents_over_raw_chunks_fails_the_chunk(case: Case) -> None:
    edit_json(case.files, manifest_key(case.id), say_zstd)
    for array in (case.own_array, "packed"):
        edit_json(case.files, f"snapshots/{case.id}/{array}/zarr.json", add_zstd_codec)
    reads = case.reads()
    case.assert_refused("ChecksumMismatchError", WHOLE, "chunk", "zstd", reads=reads)
    case.assert_refused(
        "ChecksumMismatchError", ["fc.weight"], case.own_array, "'fc.weight'", "zstd", reads=reads
    )
    case.assert_refused("ChecksumMismatchError", ["flags"], "'flags'", "zstd", reads=reads)


async def test_a_dtype_edited_in_the_manifest_is_not_read_reinterpreted(case: Case) -> None:
    def to_int32(document: dict) -> None:
        manifest = document["attributes"]["gradvault"]
        manifest["gradients"]["dtype"][position(manifest, "fc.weight")] = "int32"

    edit_json(case.files, manifest_key(case.id), to_int32)
    case.assert_refused(
        "ManifestError",
        [*WHOLE, "fc.weight"],
        case.own_array,
        "'fc.weight'",
        "int32",
        "float32",
    )


async def test_a_data_type_edited_in_the_array_document_is_refused(case: Case) -> None:
    edit_json(
        case.files,
        f"snapshots/{case.id}/{case.own_array}/zarr.json",
        lambda d: d.update(data_type="int32"),
    )
    case.assert_refused(
        "ManifestError", [*WHOLE, "fc.weight"], case.own_array, "data_type", "int32"
    )


async def test_an_array_document_with_the_earlier_chunk_key_separator_is_refused(
    case: Case,
) -> None:
    """A format 3 snapshot whose array document says chunk keys ``c/0/0`` (formats 1 and
    2) is refused, naming the array and both separators, not looked up under other names."""

    def earlier_separator(document: dict) -> None:
        document["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": "/"}}

    edit_json(case.files, f"snapshots/{case.id}/{case.own_array}/zarr.json", earlier_separator)
    case.assert_refused(
        "ManifestError",
        [*WHOLE, "fc.weight"],
        case.own_array,
        "chunk_key_encoding",
        "separator '.'",
        "'/'",
    )


# --- something other than a regular file in a file's place (local store) ---------------


def first_chunk(case: Case) -> str:
    return f"snapshots/{case.id}/{case.own_array}/c.0.0"


@pytest.mark.parametrize("replace", ["fifo", "folder", "link"])
async def test_a_chunk_that_is_not_a_regular_file_is_refused(
    local_case: Case, replace: str, tmp_path: Path
) -> None:
    key = first_chunk(local_case)
    if replace == "fifo":
        local_case.files.replace_with_fifo(key)
    elif replace == "folder":
        local_case.files.replace_with_folder(key)
    else:  # a link out of the store, to the very bytes the chunk held
        outside = tmp_path / "outside"
        outside.write_bytes(local_case.files.read(key))
        local_case.files.replace_with_link(key, outside)
    local_case.assert_refused(
        "ChecksumMismatchError",
        [*WHOLE, "fc.weight"],
        local_case.own_array,
        "'fc.weight'",
        "regular file",
    )


@pytest.mark.parametrize("replace", ["fifo", "folder", "link"])
async def test_a_chunk_replaced_between_listing_and_reading_is_refused(
    local_case: Case, replace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing said a regular file of the right size; the open finds otherwise."""
    async with open_store(local_case.url, **OPTIONS) as store:
        backend = store.backend
        stale = await backend.object_sizes(f"snapshots/{local_case.id}")
        key = first_chunk(local_case)
        if replace == "fifo":
            local_case.files.replace_with_fifo(key)
        elif replace == "folder":
            local_case.files.replace_with_folder(key)
        else:
            (tmp_path / "outside").write_bytes(b"\0" * stale[key.split("/", 2)[2]])
            local_case.files.replace_with_link(key, tmp_path / "outside")

        async def listed_before(prefix: str) -> dict[str, int | None]:
            return stale

        monkeypatch.setattr(backend, "object_sizes", listed_before)
        with pytest.raises(ChecksumMismatchError, match="regular file") as caught:
            await asyncio.wait_for(store.read_snapshot(local_case.id), 30)
    assert local_case.id in str(caught.value) and local_case.own_array in str(caught.value)


async def test_a_manifest_that_is_a_fifo_is_left_out_of_list_and_explained_by_info(
    local_case: Case,
) -> None:
    local_case.files.replace_with_fifo(manifest_key(local_case.id))
    assert local_case.ask("list")["result"] == []
    answer = local_case.ask("info")
    assert answer["error"] == "ManifestError", answer
    assert local_case.id in answer["message"] and "regular file" in answer["message"]


# --- what a restored gradient shares with the store's files ----------------------------


@pytest.mark.parametrize("layout", ["own array", "one packed chunk"])
@pytest.mark.parametrize("damage", ["rewrite", "truncate"])
async def test_a_restored_gradient_is_unaffected_by_its_chunk_file_changing_in_place(
    reader: ReaderProcess, tmp_path: Path, damage: str, layout: str
) -> None:
    array = np.arange(1 << 19, dtype=np.float32)  # 2 MiB in one chunk file
    record = GradientsParamsRecord([GradientRecordEntry.from_array(ParamId(), "w", array)])
    # a snapshot of at most one chunk is one packed chunk; pack_threshold=0 packs nothing
    options = {"pack_threshold": 0} if layout == "own array" else {}
    async with open_store(tmp_path, **options) as store:
        info = await store.write_snapshot(record, run="r", step=1)
    case = Case(reader, str(tmp_path), {}, LocalFiles(tmp_path), record, info.id)
    case.options = {}
    restored = case.ask("restore")
    assert restored["result"] == rows(record)
    folder = tmp_path / "snapshots" / info.id
    # the packed array of a snapshot of one chunk is the snapshot's node: its chunk is there
    path = (
        folder / str(record.entries[0].param_id) / "c.0"
        if layout == "own array"
        else folder / "c.0"
    )
    with open(path, "r+b") as file:  # in place: the same inode, as a careless tool would
        if damage == "rewrite":
            file.write(b"\xff" * (1 << 20))
        else:
            file.truncate(100)
        file.flush()
        os.fsync(file.fileno())
    assert case.reader.ask({"op": "held"})["result"] == rows(record)


# --- memory: restoring N bytes takes N bytes, plus at most one chunk ---------------------

RESTORED_BYTES = 256 << 20
CHUNK_BYTES = 32 << 20
#: Besides the gradient and one chunk: what one restore allocates for itself whatever the
#: gradient's size (the recorder's thread and loop, the store's thread pool, the manifest,
#: imports done on first use). Measured at 3-6 MiB here; a copy of the gradient is 256.
FIXED_MARGIN = 16 << 20


async def test_restoring_n_bytes_peaks_at_n_bytes_plus_one_chunk(tmp_path: Path) -> None:
    array = np.arange(RESTORED_BYTES // 4, dtype=np.float32)
    record = GradientsParamsRecord([GradientRecordEntry.from_array(ParamId(), "w", array)])
    async with open_store(tmp_path, chunk_bytes=CHUNK_BYTES) as store:
        info = await store.write_snapshot(record, run="r", step=1)
    files = LocalFiles(tmp_path)
    assert len([key for key in files.keys(info.id) if is_chunk_key(key)]) == 8
    del array, record  # the digest below is of the same values, computed again
    expected = digest(np.arange(RESTORED_BYTES // 4, dtype=np.float32))

    fresh = ReaderProcess()  # its own high-water mark, untouched by other tests' reads
    try:
        answer = fresh.ask({"op": "restore", "url": str(tmp_path), "id": info.id})
    finally:
        fresh.close()
    assert answer["result"][0][4] == expected
    growth = answer["peak_rss"] - answer["rss_before"]
    assert growth <= RESTORED_BYTES + CHUNK_BYTES + FIXED_MARGIN, growth / 2**20
