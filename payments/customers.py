"""Customer references and baskets as the purchase guards compare them. Pure functions.

A careless agent that sends `"cust-42 "`, `"CUST-42"` or a fullwidth `ｃｕｓｔ-42` means the
same buyer as `"cust-42"`; comparing bytes let each variant open (and pay) another purchase
for the same basket. So the stored reference is trimmed and NFKC-normalised, and matching
uses its case-folded form (`customer_key`), always together with the API client: two
storefronts' "cust-42" are two different buyers
(docs/reliability.md#rules-every-money-movement-obeys).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata

CUSTOMER_REFERENCE_MAX = 100
# A payment method is a provider token, never card data (the REST serializer's rule too).
# spt_: a Stripe shared payment token an agent platform delegated (acp/).
PAYMENT_METHOD_TOKEN = re.compile(r"(pm|tok|src|card|spt)_[A-Za-z0-9_]{1,96}")
# 12-19 digits, optionally grouped by spaces or dashes: what a card number looks like.
CARD_NUMBER_LIKE = re.compile(r"(?:\d[ -]?){11,18}\d")


def customer_reference_clean(reference: str) -> str:
    """The reference as stored: NFKC, surrounding white space removed."""
    return unicodedata.normalize("NFKC", reference or "").strip()


def customer_key(reference: str) -> str:
    """The matching key: NFKC, trimmed, case-folded (NFKC again: casefold may denormalise)."""
    return unicodedata.normalize("NFKC", customer_reference_clean(reference).casefold())


def basket_fingerprint(*, items: list, amount: int, currency: str) -> str:
    """Same items and quantities, same amount, same currency: the same basket."""
    lines: dict[str, int] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            sku = str(item.get("sku", ""))
            lines[sku] = lines.get(sku, 0) + int(item.get("quantity") or 0)
    body = {
        "lines": sorted(lines.items()),
        "amount": int(amount),
        "currency": (currency or "").lower(),
    }
    return hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()
