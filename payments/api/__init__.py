"""The DRF edge of the payments API: views, serializers, routes, problem documents,
authentication, rate limits and the presenters every surface reads (docs/architecture.md)."""
