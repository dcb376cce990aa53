from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class SupportConfig(AppConfig):
    name = "support"
    default_auto_field = "django.db.models.BigAutoField"


class VerityAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin whose site shares the console's login lockout."""

    default = False  # named explicitly in INSTALLED_APPS; SupportConfig stays the default
    default_site = "support.admin_site.LockedAdminSite"
