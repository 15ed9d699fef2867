"""What an error body tells a stranger: the snapshot or the input it names, never where the
server keeps its store; echoed input cut to ``ECHO_LIMIT`` characters; a store that cannot
be reached as one sentence, the backend's own text (obstore's debug dump) in the log only."""

from __future__ import annotations

import logging
import os

import pytest

from gradvault.core.errors import ECHO_LIMIT
from gradvault.service.error_handlers import MAX_DETAIL_CHARACTERS, PUBLIC_DETAIL_BY_STATUS

from ..conftest import S3_BUCKET

MISSING = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # well formed, never written
PARAM = "9f3c0a1b2c3d4e5f"
LONG = 8000


def _server_paths(service) -> list[str]:  # noqa: ANN001 - the RunningService of conftest
    places = {service.app.state.store.location, service.settings.store}
    if "://" not in service.settings.store:
        places.add(os.path.abspath(service.settings.store))
    return sorted(places)


async def test_a_404_names_the_snapshot_and_not_the_store_location(service, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gradvault.service")
    async with service.client() as client:
        answers = [
            await client.get(f"/v1/snapshots/{MISSING}"),
            await client.get(f"/v1/snapshots/{MISSING}/grads/{PARAM}"),
            await client.get(f"/v1/snapshots/{MISSING}/safetensors"),
            await client.delete(f"/v1/snapshots/{MISSING}"),
            await client.get(f"/ui/snapshots/{MISSING}"),
        ]
    for answer in answers:
        assert answer.status_code == 404, answer.text
        detail = answer.json()["detail"]
        assert MISSING in detail
        for place in _server_paths(service):
            assert place not in answer.text, f"{answer.request.url}: {detail}"
    assert answers[0].json()["detail"] == f"no committed snapshot {MISSING} in the store"
    # the log keeps what the client was not told
    logged = [r.getMessage() for r in caplog.records if MISSING in r.getMessage()]
    assert any(service.app.state.store.location in message for message in logged), logged


@pytest.fixture
def store_kind() -> str:
    return "local"


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/snapshots/{'A' * LONG}",
        f"/v1/snapshots/{MISSING}/grads/{'f' * LONG}",
        f"/v1/snapshots?cursor={'Z' * LONG}",
        f"/v1/zarr/{'a' * LONG}/zarr.json",
        f"/ui/snapshots/{'A' * LONG}",
    ],
    ids=["snapshot-id", "param-id", "cursor", "store-path", "ui-page"],
)
async def test_long_input_is_echoed_cut(service, path: str) -> None:
    async with service.client() as client:
        answer = await client.get(path)
    assert 400 <= answer.status_code < 500, answer.text
    detail = answer.json()["detail"]
    assert len(detail) <= MAX_DETAIL_CHARACTERS, f"{len(detail)} characters: {detail[:200]}"
    longest_run = max(len(word) for word in detail.replace("'", " ").split())
    assert longest_run <= ECHO_LIMIT + 1, detail  # the cut input and its ellipsis
    assert "…" in detail and "characters)" in detail, detail


async def test_a_store_that_refuses_the_service_answers_one_sentence(
    make_service, s3_endpoint: str, caplog
) -> None:
    """A service whose S3 credentials the server does not know: every request, /ui too, is a
    503 whose body is one sentence; obstore's debug text is in the log."""
    caplog.set_level(logging.INFO, logger="gradvault.service")
    options = {
        "endpoint": s3_endpoint,
        "allow_http": True,
        "access_key_id": "nobody",
        "secret_access_key": "nothing",
    }
    service = await make_service(store=f"s3://{S3_BUCKET}/refused", store_options=options)
    async with service.client() as client:
        answers = [
            await client.get("/v1/snapshots"),
            await client.get(f"/v1/snapshots/{MISSING}"),
            await client.get("/ui", follow_redirects=True),
            await client.get("/readyz"),
        ]
    for answer in answers:
        assert answer.status_code == 503, (answer.request.url, answer.text)
        assert answer.json() == {
            "detail": PUBLIC_DETAIL_BY_STATUS[503],
            "error": "StoreUnavailableError",
        }
        assert s3_endpoint not in answer.text and "refused" not in answer.text
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "InvalidAccessKeyId" in logged and "Debug source" in logged
