"""payments.money: people type and read major units with the currency's own decimals
(CLDR): USD two, JPY none, KWD three."""

from __future__ import annotations

import pytest

from payments.money import MoneyInputError, format_major, format_money, parse_money


@pytest.mark.parametrize(
    "amount, currency, shown",
    [
        (3050, "usd", "30.50 USD"),
        (1000, "jpy", "1,000 JPY"),
        (1500, "kwd", "1.500 KWD"),
        (123456789, "eur", "1,234,567.89 EUR"),
        (-250, "usd", "-2.50 USD"),
        (None, "usd", "— USD"),
    ],
)
def test_format_uses_the_currencys_decimals_and_upper_case_code(amount, currency, shown):
    assert format_money(amount, currency) == shown


@pytest.mark.parametrize(
    "typed, currency, minor",
    [
        ("10", "usd", 1000),
        ("10.00", "usd", 1000),
        ("1,000.50", "usd", 100050),
        ("10.00 USD", "usd", 1000),
        ("1000", "jpy", 1000),
        ("1.5", "kwd", 1500),
    ],
)
def test_parse_takes_major_units(typed, currency, minor):
    assert parse_money(typed, currency) == minor


@pytest.mark.parametrize(
    "typed, currency, code",
    [
        ("10.005", "usd", "amount_precision"),
        ("10.5", "jpy", "amount_precision"),
        ("0", "usd", "amount_not_positive"),
        ("-5", "usd", "amount_not_positive"),
        ("ten", "usd", "amount_invalid"),
        ("1,0.5", "usd", "amount_invalid"),
        ("", "usd", "amount_required"),
    ],
)
def test_parse_refuses_what_it_would_have_to_guess(typed, currency, code):
    with pytest.raises(MoneyInputError) as e:
        parse_money(typed, currency)
    assert e.value.code == code


def test_format_major_round_trips():
    for minor, currency in ((1000, "usd"), (7, "jpy"), (1234, "kwd")):
        assert parse_money(format_major(minor, currency), currency) == minor
