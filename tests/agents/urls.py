"""The MCP endpoint alone, mounted as config/urls.py mounts it (`mcp/`), for the HTTP
tests while config/urls.py does not include it yet."""

from django.urls import include, path

urlpatterns = [path("mcp/", include("agents.urls"))]
