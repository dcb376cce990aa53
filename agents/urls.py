"""Mounted by config/urls.py as `path("mcp/", include("agents.urls"))`."""

from django.urls import path

from .views import mcp_endpoint

app_name = "agents"

urlpatterns = [
    path("", mcp_endpoint, name="mcp"),
]
