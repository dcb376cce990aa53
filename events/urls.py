"""Mounted at /api/v1/ before the payments routes (whose catch-all answers 404)."""

from django.urls import path

from . import apis

urlpatterns = [
    path("events", apis.EventListApi.as_view(), name="api-events"),
    path("webhook-endpoints", apis.EndpointListApi.as_view(), name="api-webhook-endpoints"),
    path(
        "webhook-endpoints/<str:endpoint_id>",
        apis.EndpointDetailApi.as_view(),
        name="api-webhook-endpoint",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/rotate-secret",
        apis.EndpointRotateApi.as_view(),
        name="api-webhook-endpoint-rotate",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/deliveries",
        apis.EndpointDeliveriesApi.as_view(),
        name="api-webhook-endpoint-deliveries",
    ),
]
