"""StoreSpy: a store stand-in that records every call the routes make to it."""

from __future__ import annotations

from typing import Any


class StoreSpy:
    """Wraps a store; ``calls`` lists the names of the methods called, in order."""

    def __init__(self, store: Any, fail_with: BaseException | None = None) -> None:
        self._store = store
        self._fail_with = fail_with
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if self._fail_with is not None:
                raise self._fail_with
            return target(*args, **kwargs)

        return call


async def spy_on_store(service: Any, fail_with: BaseException | None = None) -> StoreSpy:
    """Route the service's store dependency, and its index, through a new StoreSpy.

    The listing the app starts when it opens is awaited first (through /readyz), so that
    nothing of the real store's is still under way when the spy takes over.
    """
    from gradvault.service.deps import get_store

    async with service.client() as client:
        (await client.get("/readyz")).raise_for_status()
    app = service.app
    spy = StoreSpy(app.state.store, fail_with)
    app.dependency_overrides[get_store] = lambda: spy
    app.state.index.store = spy
    return spy
