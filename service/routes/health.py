"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import IndexDep
from ..error_handlers import error_responses
from ..schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and answering."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=error_responses(503))
async def readyz(index: IndexDep) -> Health:
    """The store answers: it was listed within the index's refresh interval, or is now."""
    await index.refresh()
    return Health(status="ok")
