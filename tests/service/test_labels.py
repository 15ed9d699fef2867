"""Metric labels come from a closed set, whatever a client sends (docs/SERVICE.md, Metrics)."""

from __future__ import annotations

import httpx

from gradvault.client.cli.serve import BackgroundService
from gradvault.service import Settings


def test_made_up_methods_and_paths_never_become_label_values(tmp_path):
    made_up = [f"X{index}" + "M" * 400 for index in range(30)]
    settings = Settings(store=str(tmp_path / "store"), port=0)
    with BackgroundService(settings) as service, httpx.Client(base_url=service.url) as client:
        for method in made_up:
            client.request(method, f"/nowhere/{method[:20]}")
        client.request("PROPFIND", "/healthz")
        assert client.get("/healthz").status_code == 200
        metrics = client.get("/metrics").text
    for method in made_up:
        assert method not in metrics
        assert method[:20] not in metrics
    assert "PROPFIND" not in metrics
    other = [
        line
        for line in metrics.splitlines()
        if line.startswith("gradvault_http_requests_total{") and 'method="other"' in line
    ]
    assert other and sum(float(line.rsplit(" ", 1)[1]) for line in other) == len(made_up) + 1
    assert 'method="GET",route="/healthz",status="200"' in metrics
    assert len(metrics) < 20_000  # a few series, however many requests
