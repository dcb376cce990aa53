from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config import demo, health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("events.urls")),  # before payments' catch-all
    path("api/v1/", include("payments.api.urls")),
    path("webhooks/", include("webhooks.urls")),
    path("mcp/", include("agents.urls")),
    path("acp/", include("acp.urls")),
    path("", include("recovery.urls")),
    path("", include("support.urls")),
    path("demo-checkout/<str:purchase_id>", demo.demo_checkout, name="demo-checkout"),
    path("admin/", admin.site.urls),
]

# Verity's own pages for an unknown address (the console's, the customer page's, or an
# RFC 9457 problem under /api/), never Django's default.
handler404 = "support.web.page_not_found"
