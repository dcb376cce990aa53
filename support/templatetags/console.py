import json
from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.html import format_html

from payments.money import format_money
from support.timefmt import span, absolute, relative

register = template.Library()


@register.simple_tag
def money(amount, currency):
    """Major units with the currency's own decimals and its upper-case ISO code."""
    return format_money(amount, currency)


@register.filter
def age(value):
    """A duration ("12 min"), for queue ages; for a moment use `when`."""
    if value is None:
        return "—"
    if isinstance(value, datetime):
        value = timezone.now() - value
    if not isinstance(value, timedelta):
        return str(value)
    return span(max(0, int(value.total_seconds())))


@register.filter
def when(value):
    """The one time format of the console: relative ("12 min ago", "in 5 min") with the
    absolute UTC time on hover and in the machine-readable datetime attribute."""
    if not isinstance(value, datetime):
        return "—"
    return format_html('<time datetime="{}" title="{}">{}</time>',
                       value.isoformat(), absolute(value), relative(value))


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


@register.filter
def label(key):
    """A field name as a person reads it: "http_status" -> "HTTP status"."""
    text = str(key).replace("_", " ").strip()
    for word, shown in (("http", "HTTP"), ("id", "id"), ("ip", "IP"), ("url", "URL")):
        text = " ".join(shown if w == word else w for w in text.split(" "))
    return text[:1].upper() + text[1:]
