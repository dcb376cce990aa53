from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register this app's outbox handlers with the relay (recovery.outbox).
        from . import handlers  # noqa: F401
