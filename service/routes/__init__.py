"""The service's routers, one per resource."""
