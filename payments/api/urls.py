"""Storefront API routes (mounted at /api/v1/). Route names are the idempotency scope."""

from django.urls import path, re_path

from . import views
from .fast_path import fast  # clean hot reads answered before DRF

urlpatterns = [
    path("products", views.ProductListApi.as_view(), name="api-products"),
    path("quotes", views.QuoteCreateApi.as_view(), name="api-quotes"),
    path("purchases", views.PurchaseCreateApi.as_view(), name="api-purchases"),
    path(
        "purchases/<str:purchase_id>",
        fast(views.PurchaseDetailApi.as_view(), "purchase_get"),
        name="api-purchase",
    ),
    path(
        "purchases/<str:purchase_id>/payments",
        fast(views.PaymentCreateApi.as_view(), "payment_replay"),
        name="api-purchase-payments",
    ),
    path(
        "purchases/<str:purchase_id>/capture",
        views.CaptureApi.as_view(),
        name="api-purchase-capture",
    ),
    path("purchases/<str:purchase_id>/void", views.VoidApi.as_view(), name="api-purchase-void"),
    path(
        "purchases/<str:purchase_id>/cancel",
        views.PurchaseCancelApi.as_view(),
        name="api-purchase-cancel",
    ),
    path(
        "purchases/<str:purchase_id>/refunds",
        views.RefundApi.as_view(),
        name="api-purchase-refunds",
    ),
    path(
        "purchases/<str:purchase_id>/deliverable",
        views.DeliverableApi.as_view(),
        name="api-purchase-deliverable",
    ),
    path("operations/<str:operation_id>", views.OperationDetailApi.as_view(), name="api-operation"),
    path(
        "operations/<str:operation_id>/reconcile",
        views.OperationReconcileApi.as_view(),
        name="api-operation-reconcile",
    ),
    path(
        "operations/<str:operation_id>/replay",
        views.OperationReplayApi.as_view(),
        name="api-operation-replay",
    ),
    path(
        "operations/<str:operation_id>/resolve",
        views.OperationResolveApi.as_view(),
        name="api-operation-resolve",
    ),
    path(
        "operations/<str:operation_id>/decline",
        views.RefundDeclineApi.as_view(),
        name="api-operation-decline",
    ),
    path("clients/me/limits", views.ClientLimitsApi.as_view(), name="api-client-limits"),
    # Last: any other path under /api/v1/ answers a problem document (404), not HTML.
    re_path(r"^.*$", views.UnknownRouteApi.as_view(), name="api-unknown-route"),
]
