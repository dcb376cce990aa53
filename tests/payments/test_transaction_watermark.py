"""The no-transaction-for-I/O assertion sees through the test's own transaction only.

A rolled-back test runs inside atomic blocks django.test opened (the watermark); a block the
code opens above them is still refused, exactly as every block is outside tests.
"""

import pytest
from django.db import transaction

from payments.locks import assert_outside_transaction


@pytest.mark.django_db
def test_rolled_back_test_own_transaction_is_not_the_codes():
    assert transaction.get_connection().in_atomic_block  # the test's wrapper
    assert_outside_transaction()
    with transaction.atomic(), pytest.raises(RuntimeError, match="inside a database"):
        assert_outside_transaction()
    with transaction.atomic(), transaction.atomic(), pytest.raises(RuntimeError):
        assert_outside_transaction()


@pytest.mark.django_db(transaction=True)
def test_transactional_test_refuses_any_open_block():
    assert not transaction.get_connection().in_atomic_block
    assert_outside_transaction()
    with transaction.atomic(), pytest.raises(RuntimeError, match="inside a database"):
        assert_outside_transaction()


@pytest.mark.django_db
def test_a_block_not_from_the_test_case_counts_even_below_one_that_is():
    # Only django.test's own blocks are the watermark: a durable block the code opened
    # (nested in the test's, as Django allows) is a real transaction.
    with transaction.atomic(durable=True), pytest.raises(RuntimeError):
        assert_outside_transaction()
