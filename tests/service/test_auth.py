"""Bearer tokens: one test per rule of docs/SERVICE.md's "Authentication"."""

from __future__ import annotations

import hmac

import pytest

from gradvault.service import Settings
from gradvault.service.deps import token_scope

from .conftest import make_record
from .spy import spy_on_store

TOKENS = "reader-token-1:read,writer-token-1:write"
SNAPSHOT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


@pytest.fixture
def store_kind() -> str:
    return "local"  # the rules are the service's; one store is enough


@pytest.fixture
async def guarded(make_service):
    return await make_service(tokens=TOKENS)


async def test_a_read_without_a_token_is_401_with_www_authenticate(guarded):
    spy = await spy_on_store(guarded)
    async with guarded.client() as client:
        response = await client.get("/v1/snapshots")
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["error"] == "AuthenticationError"
    assert spy.calls == []


async def test_an_unknown_token_is_401(guarded):
    spy = await spy_on_store(guarded)
    async with guarded.client("not-a-token") as client:
        response = await client.get(f"/v1/snapshots/{SNAPSHOT}")
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert spy.calls == []


async def test_a_token_with_another_scheme_counts_as_none(guarded):
    async with guarded.client() as client:
        response = await client.get("/v1/snapshots", headers={"Authorization": "Basic eDp5"})
    assert response.status_code == 401


async def test_a_read_token_reads(guarded, direct_store):
    info = await direct_store.write_snapshot(make_record(), run="r", step=0)
    async with guarded.client("reader-token-1") as client:
        assert (await client.get("/v1/snapshots")).json()["data"][0]["id"] == info.id
        assert (await client.get(f"/v1/snapshots/{info.id}")).status_code == 200


async def test_a_read_token_on_a_write_route_is_403(guarded, direct_store):
    info = await direct_store.write_snapshot(make_record(), run="r", step=0)
    spy = await spy_on_store(guarded)
    async with guarded.client("reader-token-1") as client:
        response = await client.delete(f"/v1/snapshots/{info.id}")
    assert response.status_code == 403
    assert response.json()["error"] == "PermissionDeniedError"
    assert spy.calls == []
    assert [i.id for i in await direct_store.list()] == [info.id]


async def test_a_write_token_reads_and_writes(guarded, direct_store):
    info = await direct_store.write_snapshot(make_record(), run="r", step=0)
    async with guarded.client("writer-token-1") as client:
        assert (await client.get(f"/v1/snapshots/{info.id}")).status_code == 200
        assert (await client.delete(f"/v1/snapshots/{info.id}")).status_code == 204


async def test_health_and_metrics_need_no_token(guarded):
    async with guarded.client() as client:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status_code == 200, path


async def test_public_reads_need_no_token_but_writes_do(make_service, direct_store):
    info = await direct_store.write_snapshot(make_record(), run="r", step=0)
    public = await make_service(tokens=TOKENS, public_read=True)
    async with public.client() as client:
        assert (await client.get(f"/v1/snapshots/{info.id}")).status_code == 200
        response = await client.delete(f"/v1/snapshots/{info.id}")
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
    async with public.client("not-a-token") as client:
        assert (await client.get(f"/v1/snapshots/{info.id}")).status_code == 401


async def test_without_tokens_everything_is_open(service, direct_store):
    info = await direct_store.write_snapshot(make_record(), run="r", step=0)
    async with service.client() as client:
        assert (await client.delete(f"/v1/snapshots/{info.id}")).status_code == 204


def test_tokens_are_compared_with_compare_digest_against_every_token(monkeypatch):
    settings = Settings(tokens="first-token:read,second-token:write,third-token:read")
    calls = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    assert token_scope(settings, "first-token") == "read"
    assert len(calls) == 3  # no early exit on the first match
    calls.clear()
    assert token_scope(settings, "nope") is None
    assert len(calls) == 3
