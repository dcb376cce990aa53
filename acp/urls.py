"""Mounted by config/urls.py at /acp/. Route names are the idempotency scope."""

from django.urls import path, re_path

from . import views

urlpatterns = [
    path("checkout_sessions", views.SessionCreateApi.as_view(), name="acp-sessions"),
    path("checkout_sessions/<str:session_id>", views.SessionApi.as_view(), name="acp-session"),
    path(
        "checkout_sessions/<str:session_id>/complete",
        views.SessionCompleteApi.as_view(),
        name="acp-session-complete",
    ),
    path(
        "checkout_sessions/<str:session_id>/cancel",
        views.SessionCancelApi.as_view(),
        name="acp-session-cancel",
    ),
    # Anything else under /acp/ is an ACP Error too (404), never the site's HTML page.
    re_path(r"^.*$", views.UnknownApi.as_view(), name="acp-unknown"),
]
