from django.apps import AppConfig


class AcpConfig(AppConfig):
    name = "acp"
    default_auto_field = "django.db.models.BigAutoField"
