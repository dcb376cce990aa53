"""Storefront API routes (mounted at /api/v1/). Route names are the idempotency scope."""
from django.urls import path, re_path

from .api import views as apis
from .api.fast_path import fast  # issue 34: clean hot reads answered before DRF

urlpatterns = [
    path("products", apis.ProductListApi.as_view(), name="api-products"),
    path("quotes", apis.QuoteCreateApi.as_view(), name="api-quotes"),
    path("purchases", apis.PurchaseCreateApi.as_view(), name="api-purchases"),
    path("purchases/<str:purchase_id>", fast(apis.PurchaseDetailApi.as_view(), "purchase_get"),
         name="api-purchase"),
    path("purchases/<str:purchase_id>/payments",
         fast(apis.PaymentCreateApi.as_view(), "payment_replay"), name="api-purchase-payments"),
    path("purchases/<str:purchase_id>/capture", apis.CaptureApi.as_view(),
         name="api-purchase-capture"),
    path("purchases/<str:purchase_id>/void", apis.VoidApi.as_view(), name="api-purchase-void"),
    path("purchases/<str:purchase_id>/cancel", apis.PurchaseCancelApi.as_view(),
         name="api-purchase-cancel"),
    path("purchases/<str:purchase_id>/refunds", apis.RefundApi.as_view(),
         name="api-purchase-refunds"),
    path("purchases/<str:purchase_id>/deliverable", apis.DeliverableApi.as_view(),
         name="api-purchase-deliverable"),
    path("operations/<str:operation_id>", apis.OperationDetailApi.as_view(), name="api-operation"),
    path("operations/<str:operation_id>/reconcile", apis.OperationReconcileApi.as_view(),
         name="api-operation-reconcile"),
    path("operations/<str:operation_id>/replay", apis.OperationReplayApi.as_view(),
         name="api-operation-replay"),
    path("operations/<str:operation_id>/resolve", apis.OperationResolveApi.as_view(),
         name="api-operation-resolve"),
    path("operations/<str:operation_id>/decline", apis.RefundDeclineApi.as_view(),
         name="api-operation-decline"),
    path("clients/me/limits", apis.ClientLimitsApi.as_view(), name="api-client-limits"),
    # Last: any other path under /api/v1/ answers a problem document (404), not HTML.
    re_path(r"^.*$", apis.UnknownRouteApi.as_view(), name="api-unknown-route"),
]
