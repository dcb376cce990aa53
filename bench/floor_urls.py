"""config.urls plus the floors (bench only; never mounted in production)."""

from django.urls import include, path

from bench import floor_views

urlpatterns = [
    path("bench-floor/insert", floor_views.insert_one_row, name="bench-floor-insert"),
    path("bench-floor/purchase/<str:purchase_id>", floor_views.get_one_row, name="bench-floor-get"),
    path("", include("config.urls")),
]
