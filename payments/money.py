"""Money for people: major units with the currency's own decimals (CLDR via Babel).

Verity stores and sends amounts in minor units (what the provider takes). People type
and read major units: "10.00" USD is 1 000 minor units, "1000" JPY is 1 000 (JPY has no
minor unit), "1.500" KWD is 1 500 (three decimals). Every surface that shows or accepts
an amount from a person goes through this module, so a typed `10` can never become
0.10 USD again.

A leaf: imports nothing from Verity.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from babel.numbers import (
    NumberFormatError,
    format_currency,
    get_currency_precision,
    parse_decimal,
)

DEFAULT_LOCALE = "en"
# "1,234.50 USD": digits then the upper-case ISO code, never a symbol ("$" is not one
# currency) and never the lower-case code the provider uses.
_PATTERN = "#,##0.00 ¤¤"
_NEGATIVE_PATTERN = "-#,##0.00 ¤¤"


class MoneyInputError(ValueError):
    """A typed amount that cannot be taken as money in this currency."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def currency_code(currency: str | None) -> str:
    return (currency or "").strip().upper()


def currency_exponent(currency: str) -> int:
    """Decimal places of the currency's minor unit (CLDR): USD 2, JPY 0, KWD 3."""
    return get_currency_precision(currency_code(currency))


def to_major(amount_minor: int, currency: str) -> Decimal:
    return Decimal(int(amount_minor)).scaleb(-currency_exponent(currency))


def format_money(
    amount_minor: int | None,
    currency: str | None,
    *,
    locale: str = DEFAULT_LOCALE,
    missing: str = "—",
) -> str:
    """`3050, "usd"` -> "30.50 USD"; `1000, "jpy"` -> "1,000 JPY"; None -> "—"."""
    code = currency_code(currency)
    if amount_minor is None:
        return f"{missing} {code}".strip() if code else missing
    if not code:
        return f"{int(amount_minor):,} (minor units, no currency)"
    value = to_major(amount_minor, code)
    pattern = _NEGATIVE_PATTERN if value < 0 else _PATTERN
    return format_currency(abs(value), code, format=pattern, locale=locale, currency_digits=True)


def format_major(amount_minor: int, currency: str, *, locale: str = DEFAULT_LOCALE) -> str:
    """The number alone as a person would type it back ("10.00"), for form values."""
    code = currency_code(currency)
    exp = currency_exponent(code)
    value = to_major(amount_minor, code)
    return f"{value:.{exp}f}"


def parse_money(text: str, currency: str, *, locale: str = DEFAULT_LOCALE) -> int:
    """A person's typed major-unit amount -> minor units, or MoneyInputError.

    Refuses what would be silently rounded (`10.005` USD, `10.5` JPY), a zero or
    negative amount, and numbers whose grouping is ambiguous (`1,0.5`)."""
    code = currency_code(currency)
    raw = (text or "").strip()
    # A person may paste "10.00 USD" or "USD 10.00": accept this currency's code only.
    upper = raw.upper()
    if upper.endswith(code):
        raw = raw[: -len(code)].strip()
    elif upper.startswith(code):
        raw = raw[len(code) :].strip()
    if not raw:
        raise MoneyInputError("amount_required", "Enter an amount.")
    try:
        value = parse_decimal(raw, locale=locale, strict=True)
    except (NumberFormatError, InvalidOperation, ValueError):
        raise MoneyInputError(
            "amount_invalid",
            f"“{text.strip()}” is not an amount in {code} "
            f"(write it like {format_major(123450, code)}).",
        ) from None
    if not value.is_finite() or value <= 0:
        raise MoneyInputError("amount_not_positive", "The amount must be more than zero.")
    exp = currency_exponent(code)
    minor = value.scaleb(exp)
    if minor != minor.to_integral_value():
        places = "no decimals" if exp == 0 else f"at most {exp} decimals"
        raise MoneyInputError(
            "amount_precision", f"{code} amounts have {places}; “{text.strip()}” has more."
        )
    return int(minor)
