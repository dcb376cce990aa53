import pytest

DELIVER_SECRET = "whsec_payments_deliver"


@pytest.fixture
def deliver(settings, client):
    """Deliver a signed provider event through the real endpoint and process it."""
    from tests.webhooks.events import event_for, post
    from webhooks.models import ProviderEvent
    from webhooks.services import event_process

    settings.STRIPE_WEBHOOK_SECRETS = [DELIVER_SECRET]
    settings.STRIPE_WEBHOOK_TOLERANCE = 300
    settings.STRIPE_ACCOUNT = ""

    def run(obj: dict, type_: str) -> str:
        event = event_for(obj, type_)
        assert post(client, event, secret=DELIVER_SECRET).status_code == 200
        return event_process(event_id=ProviderEvent.objects.get(event_id=event["id"]).pk)

    return run
