"""The project's URLs plus the MCP endpoint, as config/urls.py will mount it."""
from django.urls import include, path

from config.urls import urlpatterns as project_urlpatterns

urlpatterns = [path("mcp/", include("agents.urls")), *project_urlpatterns]
