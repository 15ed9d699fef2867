"""Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ..deps import MetricsDep
from ..metrics import CONTENT_TYPE

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(metrics: MetricsDep) -> Response:
    """Request counts, latencies, bytes, snapshots written and errors, in Prometheus text."""
    return Response(metrics.render(), media_type=CONTENT_TYPE)
