"""The names gradvault.service exports, pinned."""

from __future__ import annotations

import gradvault.service


def test_the_exported_names():
    assert sorted(gradvault.service.__all__) == [
        "AuthenticationError",
        "CrossSiteRequestError",
        "InsufficientStorageError",
        "InvalidCursorError",
        "InvalidFormError",
        "OpenBindingError",
        "PermissionDeniedError",
        "RangeNotSatisfiableError",
        "RequestTimeoutError",
        "Scope",
        "Settings",
        "UnsupportedMediaTypeError",
        "UploadTooLargeError",
        "create_app",
        "serve",
    ]
    for name in gradvault.service.__all__:
        assert getattr(gradvault.service, name) is not None


def test_the_openapi_document_describes_every_route_and_error_body():
    app = gradvault.service.create_app(gradvault.service.Settings())
    document = app.openapi()
    assert set(document["paths"]) == {
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/snapshots",
        "/v1/snapshots/{snapshot_id}",
        "/v1/snapshots/{snapshot_id}/grads/{param_id}",
        "/v1/snapshots/{snapshot_id}/safetensors",
        "/v1/snapshots/{snapshot_id}/shards",
        "/v1/zarr/{path}",
    }
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (
                        path,
                        method,
                        status,
                    )
