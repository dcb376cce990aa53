import pytest


@pytest.mark.django_db
def test_healthz_answers_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_checks_database_and_broker(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}


@pytest.mark.django_db
def test_readyz_reports_unavailable_broker(client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"] == "unavailable"


@pytest.mark.django_db
def test_migrations_are_complete():
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)


def test_demo_checkout_stand_in_is_served(client):
    response = client.get("/demo-checkout/pur_123")
    assert response.status_code == 200 and b"pur_123" in response.content


def test_api_docs_and_their_assets_are_served_locally(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "cdn." not in html and "jsdelivr" not in html
    import re

    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert assets, "Swagger UI assets should come from /static/"
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200, asset
