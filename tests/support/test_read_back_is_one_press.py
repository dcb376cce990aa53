"""Reconcile now is a read-back (read-only at the provider): one press, no typed reason and
no confirmation tick, unlike a money movement. The audit row still says who asked."""

from __future__ import annotations

import pytest
from django.urls import reverse

from payments.enums import CallPurpose, Outcome
from payments.models import PaymentOperation, ProviderCall
from support.models import AuditEntry
from tests.support.test_actions import _unknown_payment

pytestmark = pytest.mark.django_db(transaction=True)


def test_support_reads_back_with_one_press(login, new_purchase, drill, api_client):
    _, op = _unknown_payment(new_purchase, drill, api_client)
    reads_before = ProviderCall.objects.filter(
        operation_id=op.pk, purpose=CallPurpose.RECONCILE
    ).count()
    response = login("support").post(reverse("support:reconcile", args=[op.pk]), {})
    assert response.status_code == 302
    assert (
        ProviderCall.objects.filter(operation_id=op.pk, purpose=CallPurpose.RECONCILE).count()
        == reads_before + 1
    )
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.SUCCEEDED
    entry = AuditEntry.objects.get(action="console.reconcile")
    assert entry.actor == "sam" and "read-only" in entry.reason
