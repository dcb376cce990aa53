from django.urls import path, re_path

from support import status_views, views, web

app_name = "support"

# Tokens are secrets.token_urlsafe(24): 32 URL-safe characters. Anything else is 404.
TOKEN = r"(?P<token>[A-Za-z0-9_-]{16,128})"

urlpatterns = [
    path("assets/verity/<str:name>", web.asset, name="asset"),
    # Customer page.
    re_path(rf"^status/{TOKEN}\.json$", status_views.status_json, name="status-json"),
    re_path(rf"^status/{TOKEN}/$", status_views.status_page, name="status"),
    re_path(rf"^status/{TOKEN}/pay-again$", status_views.status_pay_again, name="status-pay-again"),
    re_path(
        rf"^status/{TOKEN}/new-purchase$",
        status_views.status_new_purchase,
        name="status-new-purchase",
    ),
    # Console.
    path("console/login/", views.ConsoleLoginView.as_view(), name="login"),
    path("console/logout/", views.ConsoleLogoutView.as_view(), name="logout"),
    path("console/", views.dashboard, name="dashboard"),
    path("console/search/", views.search, name="search"),
    path("console/charts/<slug:name>.svg", views.chart, name="chart"),
    path("console/queues/<slug:name>/", views.queue, name="queue"),
    path("console/purchases/", views.purchases, name="purchases"),
    path("console/purchases/<str:purchase_id>/", views.purchase, name="purchase"),
    path("console/purchases/<str:purchase_id>/notes", views.note_add, name="note-add"),
    path(
        "console/purchases/<str:purchase_id>/refunds", views.refund_request, name="refund-request"
    ),
    path("console/purchases/<str:purchase_id>/void", views.void, name="void"),
    path("console/purchases/<str:purchase_id>/cancel", views.cancel, name="cancel"),
    path("console/operations/<str:operation_id>/reconcile", views.reconcile, name="reconcile"),
    path(
        "console/operations/<str:operation_id>/overturn-reviewed",
        views.overturn_review,
        name="overturn-review",
    ),
    path("console/operations/<str:operation_id>/resolve", views.resolve, name="resolve"),
    path("console/operations/<str:operation_id>/replay", views.replay, name="replay"),
    path(
        "console/operations/<str:operation_id>/cancel-unapplied",
        views.cancel_unapplied,
        name="cancel-unapplied",
    ),
    path(
        "console/operations/<str:operation_id>/approve", views.refund_approve, name="refund-approve"
    ),
    path(
        "console/operations/<str:operation_id>/review-external",
        views.external_review,
        name="external-review",
    ),
    path(
        "console/purchases/<str:purchase_id>/steps/<slug:step>/decide",
        views.step_decide,
        name="step-decide",
    ),
    path(
        "console/settlement/<int:discrepancy_pk>/explain",
        views.discrepancy_explain,
        name="discrepancy-explain",
    ),
    path("console/outbox/<int:message_pk>/retry", views.outbox_retry, name="outbox-retry"),
    path(
        "console/operations/<str:operation_id>/decline", views.refund_decline, name="refund-decline"
    ),
    path("console/events/<int:event_pk>/", views.event, name="event"),
    path("console/events/<int:event_pk>/<slug:decision>", views.event_triage, name="event-triage"),
    path("console/halts/", views.halts, name="halts"),
    path("console/webhooks/", views.webhooks, name="webhooks"),
    path(
        "console/webhooks/endpoints/<str:endpoint_id>/<str:state>",
        views.webhook_endpoint_enabled,
        name="webhook-endpoint-enabled",
    ),
    path(
        "console/webhooks/deliveries/<int:delivery_id>/resend",
        views.webhook_delivery_resend,
        name="webhook-delivery-resend",
    ),
    path("console/halts/set", views.halt_set, name="halt-set"),
    path("console/halts/clear", views.halt_clear, name="halt-clear"),
    path("console/audit/", views.audit, name="audit"),
    path("console/runbooks/", views.runbook_index, name="runbooks"),
    path("console/runbooks/<slug:slug>/", views.runbook, name="runbook"),
    path("console/incidents/", views.incidents, name="incidents"),
    path("console/incidents/open", views.incident_open, name="incident-open"),
    path("console/incidents/<int:incident_id>/", views.incident, name="incident"),
    path(
        "console/incidents/<int:incident_id>/attach", views.incident_attach, name="incident-attach"
    ),
    path("console/incidents/<int:incident_id>/halt", views.incident_halt, name="incident-halt"),
    path("console/incidents/<int:incident_id>/close", views.incident_close, name="incident-close"),
]
