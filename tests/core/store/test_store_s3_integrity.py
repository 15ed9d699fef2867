"""A flipped byte in any chunk object on the S3 store names the parameter, as on disk."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from gradvault.core.errors import ChecksumMismatchError
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import open_store

from ..conftest import S3_BUCKET, S3_CREDENTIALS
from ..store_files import is_chunk_key


def _record() -> GradientsParamsRecord:
    arrays = {
        "big.weight": np.arange(2000, dtype=np.float32).reshape(40, 50),
        "tiny.bias": np.arange(5, dtype=np.float64),
    }
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, a) for name, a in arrays.items()]
    )


def _same(found: GradientsParamsRecord, expected: GradientsParamsRecord) -> bool:
    return [(e.param_id, e.array.tobytes()) for e in found] == [
        (e.param_id, e.array.tobytes()) for e in expected
    ]


async def test_a_flipped_byte_in_any_s3_chunk_names_the_parameter(
    s3_endpoint: str, boto3_s3
) -> None:
    prefix = f"{uuid.uuid4().hex}/store"
    store = open_store(
        f"s3://{S3_BUCKET}/{prefix}",
        endpoint=s3_endpoint,
        allow_http=True,
        chunk_bytes=2048,
        pack_threshold=256,
        **S3_CREDENTIALS,
    )
    record = _record()
    damaged = await store.write_snapshot(record, run="r", step=1)
    intact = await store.write_snapshot(record, run="r", step=2)
    manifest = await store.info(damaged.id)
    table = manifest["gradients"]
    owners = {
        table["array"][i]: (table["param_id"][i], table["name"][i])
        for i in range(len(table["param_id"]))
    }
    listing = boto3_s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{prefix}/snapshots/{damaged.id}/")
    chunk_keys = [o["Key"] for o in listing["Contents"] if is_chunk_key(o["Key"])]
    assert len(chunk_keys) > 3
    for key in chunk_keys:
        original = boto3_s3.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read()
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0x40
        boto3_s3.put_object(Bucket=S3_BUCKET, Key=key, Body=bytes(flipped))
        array_name = key.split(f"{damaged.id}/", 1)[1].split("/", 1)[0]
        param_id, name = owners[array_name]
        with pytest.raises(ChecksumMismatchError) as caught:
            await store.read_snapshot(damaged.id)
        assert param_id in str(caught.value) and name in str(caught.value)
        assert _same(await store.read_snapshot(intact.id), record)
        boto3_s3.put_object(Bucket=S3_BUCKET, Key=key, Body=original)
    assert _same(await store.read_snapshot(damaged.id), record)
    await store.close()
