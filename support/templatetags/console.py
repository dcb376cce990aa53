import json
from datetime import datetime, timedelta

from django import template
from django.utils import timezone

register = template.Library()

# ISO 4217 currencies without minor units (amounts are stored in minor units).
ZERO_DECIMAL = {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx",
                "vnd", "vuv", "xaf", "xof", "xpf"}


@register.simple_tag
def money(amount, currency):
    if amount is None:
        return "—"
    cur = (currency or "").lower()
    if cur in ZERO_DECIMAL:
        return f"{int(amount):,} {cur.upper()}"
    return f"{int(amount) / 100:,.2f} {cur.upper()}"


@register.filter
def age(value):
    if value is None:
        return "—"
    if isinstance(value, datetime):
        value = timezone.now() - value
    if not isinstance(value, timedelta):
        return str(value)
    seconds = max(0, int(value.total_seconds()))
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


@register.filter
def pretty_json(value):
    try:
        return json.dumps(value, indent=2, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def get(mapping, key):
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.simple_tag
def purchase_url(purchase_id) -> str:
    """The console link for a purchase id that came from outside (a signed event's metadata
    may say anything, `/` included): "" when it cannot be a console URL, never a 500."""
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse("support:purchase", args=[str(purchase_id)])
    except NoReverseMatch:
        return ""
