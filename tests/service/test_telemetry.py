"""Prometheus metrics and the JSON access log."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gradvault.service import Settings, create_app

from .conftest import make_record

SNAPSHOT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


@pytest.fixture
def store_kind() -> str:
    return "local"


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_requests_routes_statuses_bytes_and_errors(service, direct_store):
    info = await direct_store.write_snapshot(make_record(), run="r", step=0)
    async with service.client() as client:
        detail = await client.get(f"/v1/snapshots/{info.id}")
        await client.get(f"/v1/snapshots/{SNAPSHOT}")
        await client.get("/no/such/route")
        await client.delete(f"/v1/snapshots/{info.id}")
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    route = "/v1/snapshots/{snapshot_id}"
    requests = "gradvault_http_requests_total"
    assert samples[(requests, (("method", "GET"), ("route", route), ("status", "200")))] == 1
    assert samples[(requests, (("method", "GET"), ("route", route), ("status", "404")))] == 1
    assert samples[(requests, (("method", "GET"), ("route", "unmatched"), ("status", "404")))] == 1
    assert samples[(requests, (("method", "DELETE"), ("route", route), ("status", "204")))] == 1
    assert samples[("gradvault_errors_total", (("error", "SnapshotNotFoundError"),))] == 1
    assert samples[("gradvault_snapshots_deleted_total", ())] == 1
    served = samples[("gradvault_http_response_bytes_total", (("route", route),))]
    assert served >= len(detail.content)
    latency = (
        "gradvault_http_request_duration_seconds_count",
        (("method", "GET"), ("route", route)),
    )
    assert samples[latency] == 2


def test_two_apps_in_one_process_keep_their_own_metrics(tmp_path):
    first = create_app(Settings(store=str(tmp_path / "a")))
    second = create_app(Settings(store=str(tmp_path / "b")))
    first.state.metrics.snapshots_written.inc()
    assert "gradvault_snapshots_written_total 1.0" in first.state.metrics.render().decode()
    assert "gradvault_snapshots_written_total 0.0" in second.state.metrics.render().decode()


async def test_each_request_logs_one_json_access_line(service, caplog):
    caplog.set_level(logging.INFO, logger="gradvault.access")
    async with service.client() as client:
        await client.get(f"/v1/snapshots/{SNAPSHOT}")

    def access_lines() -> list[dict]:
        return [
            json.loads(record.getMessage())
            for record in caplog.records
            if record.name == "gradvault.access"
        ]

    # a server logs a request once its last byte is sent, which may be after the client has it
    deadline = time.monotonic() + 10
    while not access_lines() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    lines = access_lines()
    assert len(lines) == 1
    line = lines[0]
    assert line["method"] == "GET"
    assert line["route"] == "/v1/snapshots/{snapshot_id}"
    assert line["status"] == 404
    assert line["bytes"] > 0 and line["duration_ms"] >= 0
