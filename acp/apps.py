from django.apps import AppConfig


class AcpConfig(AppConfig):
    name = "acp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The order-event outbox handler (its rows are written by payments.services).
        # The deploy-time warning about secrets still stored on a platform's row.
        from . import (
            checks,  # noqa: F401
            handlers,  # noqa: F401
        )
