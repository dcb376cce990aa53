from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register this app's outbox handlers with the relay (recovery.outbox).
        from . import handlers  # noqa: F401

        # The outbox (a leaf) publishes its on-commit kicks through the policy installed
        # here: the coalesced kick depends on the outbox, never the reverse.
        from .kick import relay_kick_coalesced
        from .outbox import outbox_kick_policy

        outbox_kick_policy(relay_kick_coalesced)
