"""The names gradvault.service.ui exports, pinned, and the pages kept out of the API schema."""

from __future__ import annotations

import gradvault.core
import gradvault.service
import gradvault.service.ui


def test_the_exported_names() -> None:
    assert sorted(gradvault.service.ui.__all__) == ["LoginRequiredError", "install_ui"]
    assert issubclass(gradvault.service.ui.LoginRequiredError, gradvault.core.GradvaultError)


def test_the_pages_are_not_in_the_openapi_document() -> None:
    app = gradvault.service.create_app(gradvault.service.Settings())
    paths = app.openapi()["paths"]
    assert not [path for path in paths if path == "/" or path.startswith("/ui")]
    served = {getattr(route, "path", None) for route in app.state.api_routes}
    assert served >= {"/", "/ui", "/ui/run", "/ui/api/run-stats"}
