"""Random records, random damage to the store's files, every read: the original or an error.

Each example writes a random record, damages one or two of the snapshot's files (truncates,
flips a byte, deletes, puts a folder or a FIFO in its place, or edits one field of the
manifest or of an array's ``zarr.json``), and then lists, infos, reads, restores and reads
each gradient in a separate process (tests/core/store_reader.py) with a capped address
space and a timeout. Every read must answer, without dying and in bounded memory, either
with the original gradients or with a GradvaultError naming the snapshot.

What only the manifest states (a gradient's name, and a packed gradient's id, dtype and
shape: no other document repeats them) is read as the manifest now says; their bytes must
still be the original bytes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import (
    SUPPORTED_DTYPES,
    GradientRecordEntry,
    GradientsParamsRecord,
)
from gradvault.core.store import open_store

from ..conftest import S3_BUCKET, S3_CREDENTIALS
from ..store_files import LocalFiles, S3Files, edit_json, manifest_key
from ..store_reader import ReaderProcess, digest

#: Far more than these records need; far less than any claim of 2**40 bytes.
ADDRESS_SPACE = 4 << 30
#: What one read of these few-KiB records may add to the reader's resident set.
READ_MEMORY = 64 << 20

SIZES = [0, 1, 2, 3, 7, 8, 64, 255, 4096, 2**31, 2**40, 2**62]

records = st.lists(
    hnp.arrays(
        dtype=st.sampled_from(["float16", "float32", "float64", "int8", "int32", "uint8", "bool"]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=24),
    ),
    min_size=1,
    max_size=4,
)


def _manifest_edit(data: st.DataObject, manifest: dict) -> None:
    """Change one field of the manifest, keeping its totals consistent where that is easy
    (so that the change gets past the manifest's own validation to the reads)."""
    table = manifest["gradients"]
    i = data.draw(st.integers(0, len(table["param_id"]) - 1), label="gradient")
    field = data.draw(
        st.sampled_from(
            [
                "compression",
                "dtype",
                "shape",
                "chunk_shape",
                "packed",
                "offset",
                "nbytes",
                "checksum",
                "array",
                "name",
            ]
        ),
        label="manifest field",
    )
    size = st.sampled_from(SIZES)
    if field == "dtype":
        table["dtype"][i] = data.draw(st.sampled_from(SUPPORTED_DTYPES))
    elif field == "shape":
        table["shape"][i] = data.draw(st.lists(size, max_size=3))
    elif field == "chunk_shape":
        table["chunk_shape"][i] = data.draw(st.lists(size, max_size=3))
    elif field == "nbytes":
        table["nbytes"][i] = data.draw(size)
    elif field == "offset":
        table["offset"][i] = data.draw(size)
    elif field == "checksum":
        table["checksum"][i] = f"crc32c:{data.draw(st.integers(0, 2**32 - 1)):08x}"
    elif field == "array":
        table["array"][i] = "packed" if table["array"][i] != "packed" else table["param_id"][i]
    elif field == "name":
        table["name"][i] = table["name"][i] + "x"
    elif field == "packed" and manifest["packed"] is not None:
        key = data.draw(st.sampled_from(["nbytes", "chunk_bytes"]))
        manifest["packed"][key] = data.draw(size)
    elif field == "compression":
        manifest["compression"] = None if manifest["compression"] else "zstd:3"
    if field in ("dtype", "shape"):  # keep nbytes = prod(shape) x itemsize, and the total
        itemsize = np.dtype(table["dtype"][i]).itemsize
        table["nbytes"][i] = int(np.prod(table["shape"][i], dtype=object)) * itemsize
    manifest["nbytes"] = sum(table["nbytes"])


def _array_document_edit(data: st.DataObject, document: dict) -> None:
    field = data.draw(
        st.sampled_from(["data_type", "codecs", "shape", "chunk_shape", "separator", "name"]),
        label="array document field",
    )
    if field == "data_type":
        document["data_type"] = data.draw(st.sampled_from(SUPPORTED_DTYPES))
    elif field == "shape":
        document["shape"] = data.draw(st.lists(st.sampled_from(SIZES), max_size=3))
    elif field == "chunk_shape":
        chunk_shape = data.draw(st.lists(st.sampled_from(SIZES), max_size=3))
        document["chunk_grid"]["configuration"]["chunk_shape"] = chunk_shape
    elif field == "codecs":
        names = [codec["name"] for codec in document["codecs"]]
        if "zstd" in names:
            del document["codecs"][names.index("zstd")]
        else:
            document["codecs"].insert(1, {"name": "zstd", "configuration": {"level": 3}})
    elif field == "separator":
        document["chunk_key_encoding"]["configuration"]["separator"] = "."
    elif field == "name" and "gradvault" in document["attributes"]:
        document["attributes"]["gradvault"]["name"] += "x"


def _damage(data: st.DataObject, files: LocalFiles | S3Files, snapshot_id: str) -> bool:
    """Damage one file of the snapshot; whether it was the manifest."""
    keys = files.keys(snapshot_id)
    # the manifest, the arrays' documents and the chunks alike often, however many chunks
    manifest = [key for key in keys if key == manifest_key(snapshot_id)]
    documents = [key for key in keys if key.endswith("/zarr.json") and key not in manifest]
    chunks = [key for key in keys if not key.endswith("/zarr.json")]
    groups = [group for group in (manifest, documents, chunks) if group]
    key = data.draw(st.sampled_from(data.draw(st.sampled_from(groups))), label="file")
    kinds = ["edit", "flip", "truncate", "delete"]  # hypothesis tries the first ones most
    if isinstance(files, LocalFiles):
        kinds += ["folder", "fifo"]
    kind = data.draw(st.sampled_from(kinds), label="damage")
    original = files.read(key)
    if kind == "truncate":
        files.write(key, original[: data.draw(st.integers(0, max(0, len(original) - 1)))])
    elif kind == "flip":
        if not original:
            return False
        flipped = bytearray(original)
        flipped[data.draw(st.integers(0, len(original) - 1))] ^= data.draw(st.integers(1, 255))
        files.write(key, bytes(flipped))
    elif kind == "delete":
        files.delete(key)
    elif kind == "folder":
        files.replace_with_folder(key)  # type: ignore[union-attr]
    elif kind == "fifo":
        files.replace_with_fifo(key)  # type: ignore[union-attr]
    elif key.endswith("/zarr.json"):
        try:  # a document damaged already may not parse, or lack the field: left as it is
            if key == manifest_key(snapshot_id):
                # a snapshot whose node is the packed array: its document is the array's too
                root_array = json.loads(files.read(key)).get("node_type") == "array"
                if root_array and data.draw(st.booleans(), label="the array's fields"):
                    edit_json(files, key, lambda d: _array_document_edit(data, d))
                else:
                    edit_json(
                        files, key, lambda d: _manifest_edit(data, d["attributes"]["gradvault"])
                    )
            else:
                edit_json(files, key, lambda d: _array_document_edit(data, d))
        except (ValueError, LookupError, TypeError, AttributeError):
            return False
    else:
        return False
    return key == manifest_key(snapshot_id)


def _stated(files: LocalFiles | S3Files, snapshot_id: str) -> dict[str, list] | None:
    """The gradient table the (damaged) manifest now states, if it still parses."""
    try:
        return json.loads(files.read(manifest_key(snapshot_id)))["attributes"]["gradvault"][
            "gradients"
        ]
    except Exception:  # any damage: then nothing is stated
        return None


def _check_rows(
    found: list, expected: list, packed: list[bool], stated: dict[str, list] | None
) -> None:
    """``found`` holds the original bytes; its other fields are the original ones, except
    those of a packed gradient, which may be what the damaged manifest now states."""
    assert len(found) == len(expected), (found, expected)
    for position, (row, original) in enumerate(zip(found, expected, strict=True)):
        assert row[4] == original[4], ("not the original bytes", row, original)
        if row == original:
            continue
        assert packed[position], ("an own array's gradient changed", row, original)
        assert stated is not None, ("changed, with no manifest to say so", row, original)
        said = [stated[key][position] for key in ("param_id", "name", "dtype", "shape")]
        assert row[:4] == said, ("neither the original nor what the manifest says", row, said)


def _check(answer: dict[str, Any], snapshot_id: str, what: str) -> bool:
    """Whether ``answer`` is a result; otherwise it must be a GradvaultError naming the snapshot."""
    assert answer["peak_rss"] - answer["rss_before"] <= READ_MEMORY, (what, answer)
    if "result" in answer:
        return True
    assert answer["gradvault"], (what, answer)
    assert snapshot_id in answer["message"], (what, answer)
    return False


def _exercise(
    reader: ReaderProcess,
    url: str,
    options: dict[str, Any],
    files: LocalFiles | S3Files,
    data: st.DataObject,
    arrays: list[np.ndarray],
    compression: str | None,
) -> None:
    # ids drawn, not random: the files' order (by id) must not vary between replays
    ids = data.draw(
        st.lists(st.integers(0, 2**64 - 1), min_size=len(arrays), max_size=len(arrays), unique=True)
    )
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(ParamId(pid), f"p{i}", array)
            for i, (pid, array) in enumerate(zip(ids, arrays, strict=True))
        ]
    )
    expected = [[str(e.param_id), e.name, e.dtype, list(e.shape), digest(e.array)] for e in record]

    async def write() -> str:
        async with open_store(url, **options) as store:
            return (await store.write_snapshot(record, run="r", step=1, compression=compression)).id

    snapshot_id = asyncio.run(write())
    table = json.loads(files.read(manifest_key(snapshot_id)))["attributes"]["gradvault"]
    # "": the packed array is the snapshot's node (a snapshot of one chunk, format 4)
    packed = [array in ("packed", "") for array in table["gradients"]["array"]]
    damaged = [_damage(data, files, snapshot_id) for _ in range(data.draw(st.integers(1, 2)))]
    manifest_damaged = any(damaged)
    stated = _stated(files, snapshot_id) if manifest_damaged else None

    def ask(op: str, **fields: Any) -> dict[str, Any]:
        request = {"op": op, "url": url, "options": options, "id": snapshot_id, **fields}
        return reader.ask(request)

    listed = ask("list")
    assert "result" in listed and set(listed["result"]) <= {snapshot_id}, listed
    _check(ask("info"), snapshot_id, "info")
    for op in ("read_snapshot", "restore"):
        answer = ask(op)
        if _check(answer, snapshot_id, op):
            _check_rows(answer["result"], expected, packed, stated)
    for position, row in enumerate(expected):
        answer = ask("read_gradient", param_id=row[0])
        if _check(answer, snapshot_id, f"read_gradient {row[0]}"):
            one = stated and {k: [v[position]] for k, v in stated.items() if k != "stats"}
            _check_rows([answer["result"]], [row], [packed[position]], one)


@pytest.fixture(scope="module")
def reader() -> Any:
    process = ReaderProcess(ADDRESS_SPACE)
    yield process
    process.close()


FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(arrays=records, compression=st.sampled_from([None, "zstd"]), data=st.data())
def test_damaged_local_store_reads_the_original_or_names_the_snapshot(
    reader: ReaderProcess, tmp_path: Path, arrays: list, compression: str | None, data: Any
) -> None:
    root = tmp_path / uuid.uuid4().hex
    options = {"chunk_bytes": 256, "pack_threshold": 64}
    _exercise(reader, str(root), options, LocalFiles(root), data, arrays, compression)


@settings(FUZZ, max_examples=30)
@given(arrays=records, compression=st.sampled_from([None, "zstd"]), data=st.data())
def test_damaged_s3_store_reads_the_original_or_names_the_snapshot(
    reader: ReaderProcess, s3_endpoint: str, boto3_s3: Any, arrays: list, compression, data: Any
) -> None:
    prefix = f"{uuid.uuid4().hex}/store"
    options = {
        "chunk_bytes": 256,
        "pack_threshold": 64,
        "endpoint": s3_endpoint,
        "allow_http": True,
        **S3_CREDENTIALS,
    }
    url = f"s3://{S3_BUCKET}/{prefix}"
    _exercise(reader, url, options, S3Files(boto3_s3, prefix), data, arrays, compression)
