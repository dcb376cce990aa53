from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register this app's outbox handlers with the relay (recovery.outbox).
        # The deploy check that the database keeps acknowledged commits (config.durability).
        import config.durability  # noqa: F401

        from . import handlers  # noqa: F401
