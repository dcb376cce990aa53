from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "events"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The purchase view an event carries is the API's presenter (one presenter for every
        # surface, docs/design-notes.md); the leaf that writes events takes it by
        # registration, as the relay takes its handlers, so the core never imports an
        # interface.
        from payments.api.presenters import purchase_view_by_id

        from . import delivery  # noqa: F401 (registers the fan-out handler)
        from .record import event_view_register

        def view(purchase_id: str) -> tuple[str, dict]:
            purchase, view = purchase_view_by_id(purchase_id)
            return purchase.api_client_id or "", view

        event_view_register(view)
