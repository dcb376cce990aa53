import json
from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.html import format_html

from payments.money import format_money
from support.services import form_token_mint
from support.timefmt import absolute, relative, span

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
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        absolute(value),
        relative(value),
    )


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


@register.filter
def label(key):
    """A field name as a person reads it: "http_status" -> "HTTP status"."""
    text = str(key).replace("_", " ").strip()
    for word, shown in (("http", "HTTP"), ("id", "id"), ("ip", "IP"), ("url", "URL")):
        text = " ".join(shown if w == word else w for w in text.split(" "))
    return text[:1].upper() + text[1:]


_AMOUNT_KEYS = (
    "amount",
    "amount_received",
    "amount_capturable",
    "amount_refunded",
    "provider_amount",
    "ledger_amount",
    "refundable",
    "limit",
    "reserved",
)


def _display(key: str, value, currency: str):
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return when(value)
    if key in _AMOUNT_KEYS and isinstance(value, int) and currency:
        return format_money(value, currency)
    if key == "currency" and isinstance(value, str):
        return value.upper()
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "—"
    return value


def _flatten(mapping: dict, prefix: str = "") -> list[tuple[str, object]]:
    given = mapping.get("currency")
    currency = given if isinstance(given, str) else ""
    has_money = bool(currency) and any(isinstance(mapping.get(k), int) for k in _AMOUNT_KEYS)
    out = []
    for key in mapping:
        value = mapping[key]
        if value is None or value == "" or value == {} or value == []:
            continue
        if key == "currency" and has_money:
            continue  # shown with the amount ("15.00 USD")
        name = f"{prefix}{label(key)}"
        if isinstance(value, dict):
            out.extend(_flatten(value, prefix=f"{name} · "))
        else:
            out.append((name, _display(key, value, currency)))
    return out


@register.filter
def fields(mapping):
    """A dict of safe fields as labelled (label, value) rows for people: money in major
    units with its currency, times in the console's one format, nested dicts flattened,
    empty values left out. The raw JSON stays available behind a disclosure."""
    if not isinstance(mapping, dict):
        return []
    return _flatten(mapping)


@register.filter
def changes(entry):
    """An audit row's before/after as (field, before, after) for the fields that changed."""
    before = entry.before if isinstance(entry.before, dict) else {}
    after = entry.after if isinstance(entry.after, dict) else {}
    currency = after.get("currency") or before.get("currency") or ""
    rows = []
    for key in list(dict.fromkeys([*before, *after])):
        b, a = before.get(key), after.get(key)
        b = None if b == "" else b
        a = None if a == "" else a
        if b == a:
            continue
        # before None: the action set this field (no arrow from nothing).
        rows.append(
            (
                label(key),
                None if b is None else _display(key, b, currency),
                "—" if a is None else _display(key, a, currency),
            )
        )
    return rows


@register.simple_tag
def shop_name():
    from django.conf import settings

    return getattr(settings, "SHOP_NAME", "") or "Your shop"


@register.filter
def nested(mapping) -> bool:
    """True if some value is itself a dict: the labelled rows flatten it, so operators
    get the raw JSON beside them."""
    return isinstance(mapping, dict) and any(isinstance(v, dict) and v for v in mapping.values())


@register.filter
def tx_link(tx_hash: str):
    """An x402 transaction hash, linked to the configured explorer (X402_EXPLORER_TX_URL,
    `{tx}` replaced) when there is one."""
    from django.conf import settings

    if not tx_hash:
        return "—"
    template_url = getattr(settings, "X402_EXPLORER_TX_URL", "")
    if not template_url:
        return format_html("<code>{}</code>", tx_hash)
    return format_html(
        '<a href="{}" rel="noreferrer"><code>{}</code></a>',
        template_url.replace("{tx}", tx_hash),
        tx_hash,
    )


@register.simple_tag(takes_context=True)
def form_token(context):
    """The hidden one-time token of a console form that moves money: its effect is made
    once, however often it is posted (support.services, `_ConsoleAction.claim_form`)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return ""
    return format_html('<input type="hidden" name="form_token" value="{}">', form_token_mint(user))


_STRIPE_PATHS = {"pi_": "payments", "ch_": "payments", "py_": "payments", "re_": "refunds"}


@register.filter
def provider_link(ref: str):
    """A provider reference linked to where a person reads it: a Stripe object to the
    Stripe dashboard (STRIPE_DASHBOARD_URL), an x402 transaction hash to the block
    explorer (tx_link); anything else as code."""
    from django.conf import settings

    if not ref:
        return "—"
    if ref.startswith("0x") and len(ref) == 66:
        return tx_link(ref)
    base = (getattr(settings, "STRIPE_DASHBOARD_URL", "") or "").rstrip("/")
    path = _STRIPE_PATHS.get(ref[:3])
    if not base or path is None:
        return format_html("<code>{}</code>", ref)
    return format_html(
        '<a href="{}/{}/{}" rel="noreferrer" data-provider-link><code>{}</code></a>',
        base,
        path,
        ref,
        ref,
    )
