from django.apps import AppConfig


class SupportConfig(AppConfig):
    name = "support"
    default_auto_field = "django.db.models.BigAutoField"
