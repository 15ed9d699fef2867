"""ServiceMetrics: the service's Prometheus metrics, in a registry of each app's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

#: seconds; listing pages answer in milliseconds, gradient downloads in seconds
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServiceMetrics:
    """Counters and histograms of one app; several apps in one process do not share them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gradvault_http_requests",
            "HTTP requests answered, by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gradvault_http_request_duration_seconds",
            "Time from a request's arrival to its last response byte, by method and route",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bytes_served = Counter(
            "gradvault_http_response_bytes",
            "Response body bytes sent, by route",
            ["route"],
            registry=self.registry,
        )
        self.bytes_received = Counter(
            "gradvault_http_request_bytes",
            "Request body bytes received, by route",
            ["route"],
            registry=self.registry,
        )
        self.snapshots_written = Counter(
            "gradvault_snapshots_written",
            "Snapshots committed through this service",
            registry=self.registry,
        )
        self.snapshots_deleted = Counter(
            "gradvault_snapshots_deleted",
            "Snapshots deleted through this service",
            registry=self.registry,
        )
        self.errors = Counter(
            "gradvault_errors",
            "Failed requests by error kind (the error's class name), aborted streams included",
            ["error"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        """Every metric in the Prometheus text format."""
        return generate_latest(self.registry)
