"""``GET /v1/snapshots/{id}`` is built from the manifest's columns, without a model per
gradient: the document is the one the ``SnapshotDetail`` model gives, field for field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId, new_snapshot_id
from gradvault.service.routes.snapshots import detail_json
from gradvault.service.schemas import SnapshotDetail

from .conftest import make_record


@pytest.fixture
def store_kind() -> str:
    return "local"  # the document is built from the manifest, wherever it was read


def _odd_record() -> GradientsParamsRecord:
    """Gradients whose stats are not plain: Inf and NaN, an overflowed norm, empty, bf16."""
    with_inf = np.array([1.0, np.inf, np.nan, -2.5], np.float32)
    overflow = np.full(4, 1.7e308, np.float64)
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(ParamId(1), "blöck.0.wéight", with_inf),
            GradientRecordEntry.from_array(ParamId(2), "", overflow),
            GradientRecordEntry.from_array(ParamId(3), "empty", np.zeros((0, 3), np.float64)),
            GradientRecordEntry.from_array(ParamId(4), "ids", np.arange(6, dtype=np.int64)),
        ],
        metadata={"lr": 1e-7, "big": 2**64 - 1, "nested": [{"ß": None, "t": True}], "e": 1e16},
    )


def _model_document(manifest: dict) -> dict:
    return SnapshotDetail.of_manifest(manifest).model_dump(mode="json")


def _assert_same_document(text: bytes, manifest: dict) -> None:
    document, expected = json.loads(text), _model_document(manifest)
    assert document == expected
    assert list(document) == list(expected)  # the fields in the model's order
    for gradient, model_gradient in zip(document["gradients"], expected["gradients"], strict=True):
        assert list(gradient) == list(model_gradient)
        assert list(gradient["stats"]) == list(model_gradient["stats"])


async def test_the_document_is_the_model_s_for_odd_stats_and_metadata(service, direct_store):
    info = await direct_store.write_snapshot(
        _odd_record(), run="rün", step=2**63 - 1, tags={"k": "v", "ü": ""}
    )
    manifest = await direct_store.info(info.id)
    _assert_same_document(detail_json(manifest), manifest)
    stats = json.loads(detail_json(manifest))["gradients"][1]["stats"]
    assert stats["l2_norm"] == "Infinity"  # an overflowed norm, as the manifest has it
    async with service.client() as client:
        response = await client.get(f"/v1/snapshots/{info.id}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    _assert_same_document(response.content, manifest)


async def test_the_document_of_an_empty_and_of_a_sharded_snapshot(service, direct_store):
    empty = await direct_store.write_snapshot(GradientsParamsRecord([]), run="r", step=0)
    sharded = new_snapshot_id()
    for rank in range(2):
        await direct_store.write_shard(
            make_record(rank), snapshot_id=sharded, rank=rank, world_size=2, run="ddp", step=5
        )
    for snapshot_id in (empty.id, sharded):
        manifest = await direct_store.info(snapshot_id)
        _assert_same_document(detail_json(manifest), manifest)
        async with service.client() as client:
            response = await client.get(f"/v1/snapshots/{snapshot_id}")
        _assert_same_document(response.content, manifest)
