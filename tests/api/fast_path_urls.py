"""A urlconf for tests/api/test_fast_path_middleware_order.py: the purchase path answers
418 from a plain view (no fast path), unless `fast_patterns()` is swapped in."""

from django.http import HttpResponse
from django.urls import include, path


def teapot(request, purchase_id):
    return HttpResponse(b"not the purchase view", status=418)


def fast_patterns():
    return [path("api/v1/", include("payments.api.urls"))]


urlpatterns = [path("api/v1/purchases/<str:purchase_id>", teapot)]
