"""The customer's status page: `/status/<token>/`, its JSON poll and "pay again".

The token is the only key (unguessable, never sequential). An unknown token answers the
same 404 whatever exists, so the page cannot be used to probe for purchases. The words
come from payments.customer_copy only.
"""

from __future__ import annotations

import secrets
from decimal import Decimal
from urllib.parse import quote

from django.conf import settings
from django.core.mail import send_mail
from django.http import HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from payments.customer_copy import StateCode, customer_state
from payments.enums import DUPLICATE_GUARD_STATUSES, PAYMENT_KINDS, PurchaseStatus, Rail
from payments.models import PurchaseChannel
from payments.services import buyer_confirmation_issue
from recovery.models import EmailMessage
from support import selectors
from support.web import secure_headers, storefront_origin

# Poll cadence for the page's script: quick at first, slower while it stays unsettled.
POLL_FIRST_SECONDS = 3
POLL_MAX_SECONDS = 30


def _poll_seconds() -> int:
    return int(getattr(settings, "STATUS_POLL_SECONDS", POLL_FIRST_SECONDS))


def _headers(response):
    origin = storefront_origin()
    # The token is in the URL: never leak it to the storefront in a Referer header.
    # same-origin sends none across origins, and keeps a real `Origin` on this page's own
    # form posts, which the CSRF check of "new purchase" needs (no-referrer sends `null`).
    response = secure_headers(
        response, form_targets=(origin,) if origin else (), referrer="same-origin"
    )
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


def _not_found(request, *, json: bool = False):
    # Identical for every unknown token: no hint whether anything exists.
    if json:
        return _headers(JsonResponse({"detail": "Not found."}, status=404))
    return _headers(render(request, "status/not_found.html", status=404))


def _items(purchase) -> list[dict]:
    items = purchase.quote.items if isinstance(purchase.quote.items, list) else []
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        out.append(
            {
                "name": item.get("name") or item.get("sku") or "Item",
                "sku": item.get("sku", ""),
                "quantity": item.get("quantity", 1),
                "unit_price": item.get("unit_price"),
            }
        )
    return out


def _state_payload(token: str, state) -> dict:
    body = state.as_dict()
    body["pay_again_action"] = (
        reverse("support:status-pay-again", kwargs={"token": token})
        if state.can_pay_again
        else None
    )
    return body


@require_GET
def status_page(request, token: str):
    purchase = selectors.purchase_by_token(token)
    if purchase is None:
        return _not_found(request)
    state = customer_state(purchase)
    return _headers(
        render(
            request,
            "status/page.html",
            {
                "purchase": purchase,
                "items": _items(purchase),
                "state": state,
                "token": token,
                "poll_url": reverse("support:status-json", kwargs={"token": token}),
                "pay_again_action": reverse("support:status-pay-again", kwargs={"token": token}),
                "poll_seconds": _poll_seconds(),
                "poll_max_seconds": POLL_MAX_SECONDS,
                "can_confirm_new_purchase": _can_confirm_new_purchase(purchase),
                "guarded_over_acp": _guarded_over_acp(purchase),
                "new_purchase_action": reverse(
                    "support:status-new-purchase", kwargs={"token": token}
                ),
                "safe_action": _safe_action(state, purchase, token),
                "do_not_pay_again": state.code in _DO_NOT_PAY_AGAIN,
                "bought_through": _CHANNEL_WORDS.get(purchase.channel),
                "usdc_amount": _usdc_amount(purchase),
            },
        )
    )


# How the purchase was made, as the buyer knows it (the console keeps the technical names).
_CHANNEL_WORDS: dict[str, str] = {
    PurchaseChannel.API: "The shop's website or app",
    PurchaseChannel.MCP: "An AI assistant, on your behalf",
    PurchaseChannel.ACP: "An AI assistant, on your behalf",
}


def _usdc_amount(purchase) -> str | None:
    """ "9.00 USDC" when the buyer paid (or is paying) with USDC over the x402 rail: the
    amount as their wallet shows it, not only in dollars. None otherwise."""
    if (purchase.currency or "").lower() != "usd" or not purchase.operations.filter(
        kind__in=[k.value for k in PAYMENT_KINDS], rail=Rail.X402
    ).exists():
        return None
    return f"{Decimal(purchase.amount) / 100:,.2f} USDC"


# The pages that tell the buyer not to pay again. On them the safe path is the one primary
# action, and "Yes, start a new purchase" is a folded, secondary choice for a buyer who
# really wants a second, separate order (it must stay reachable: every status the
# duplicate guard asks can be lifted by the buyer).
_DO_NOT_PAY_AGAIN = (
    StateCode.BEING_CONFIRMED,
    StateCode.NOT_YET_CONFIRMABLE,
    StateCode.PAYMENT_PENDING,
    StateCode.UNDER_REVIEW,
    StateCode.DISPUTED,
    StateCode.PAID_CONFIRMATION_DELAYED,
)


def _checkout_url(purchase_id: str) -> str | None:
    template = getattr(settings, "STOREFRONT_CHECKOUT_URL", "") or ""
    if "{purchase_id}" not in template:
        return None
    return template.replace("{purchase_id}", quote(purchase_id, safe=""))


def _safe_action(state, purchase, token: str) -> dict | None:
    """The one primary action of a page that says "do not pay again": what the buyer can
    safely do now. {"id", "label", "href"} or None."""
    if state.code == StateCode.PAYMENT_PENDING:
        # The bank asked for a confirmation (3-D Secure) at the store's checkout: that is
        # where the step is finished; Verity never shows the card step itself.
        url = _checkout_url(purchase.pk)
        return (
            {"id": "finish-step", "label": "Finish the confirmation at the store", "href": url}
            if url
            else None
        )
    if state.code in (StateCode.UNDER_REVIEW, StateCode.DISPUTED) and state.support_contact:
        return {
            "id": "contact-support",
            "label": "Contact support",
            "href": f"mailto:{state.support_contact}?subject={quote('Purchase ' + purchase.pk)}",
        }
    if state.code in _DO_NOT_PAY_AGAIN and not state.final:
        return {
            "id": "check-now",
            "label": "Check again now",
            "href": reverse("support:status", kwargs={"token": token}),
        }
    return None


@require_GET
def status_json(request, token: str):
    purchase = selectors.purchase_by_token(token)
    if purchase is None:
        return _not_found(request, json=True)
    return _headers(JsonResponse(_state_payload(token, customer_state(purchase))))


# No CSRF token: this endpoint changes nothing. It re-checks the verified state on the
# server and either redirects to the storefront's checkout or refuses; a forged request
# can at most send someone to a checkout they were allowed to use anyway.
@csrf_exempt
@require_http_methods(["GET", "POST"])
def status_pay_again(request, token: str):
    purchase = selectors.purchase_by_token(token)
    if purchase is None:
        return _not_found(request)
    state = customer_state(purchase)
    if not (state.can_pay_again and state.pay_again_url):
        return _headers(
            render(
                request,
                "status/pay_again_refused.html",
                {"state": state, "token": token},
                status=409,
            )
        )
    return _headers(HttpResponseRedirect(state.pay_again_url, status=303))


# The states in which this purchase makes Verity refuse the buyer another purchase (the
# unresolved and duplicate guards); only here does the buyer's "yes" mean anything.
# Every status the duplicate-purchase guard asks (money held or unresolved) can be lifted
# by the buyer, or a refund in flight or a dispute would leave the buyer locked out.
_GUARDING = (*DUPLICATE_GUARD_STATUSES, PurchaseStatus.AWAITING_PAYMENT)


def _can_confirm_new_purchase(purchase) -> bool:
    return purchase.status in _GUARDING and purchase.channel != PurchaseChannel.ACP


def _guarded_over_acp(purchase) -> bool:
    # Over ACP the code would have nowhere to go: the spec's complete request cannot carry
    # it (docs/acp.md#the-buyer-guards). The page says so instead of e-mailing a dead code.
    return purchase.status in _GUARDING and purchase.channel == PurchaseChannel.ACP


# Who holds the code decides who can lift the guard. The status link is in every REST and
# MCP answer (`status_url`), so an API client can open this page and press the button as
# well as the buyer: the code is therefore never shown here, only e-mailed to the address
# of this (earlier) purchase, a channel the API client does not read. CSRF-protected (the
# page sends `Referrer-Policy: same-origin`, so browsers send a real Origin): a forged
# POST can at most send the buyer an e-mail they did not ask for, and one live code per
# purchase bounds even that.
@require_http_methods(["GET", "POST"])
def status_new_purchase(request, token: str):
    """The buyer's own "yes, start a new purchase": a single-use code sent by e-mail."""
    purchase = selectors.purchase_by_token(token)
    if purchase is None:
        return _not_found(request)
    if request.method == "GET" or not _can_confirm_new_purchase(purchase):
        return _headers(
            HttpResponseRedirect(reverse("support:status", kwargs={"token": token}), status=303)
        )
    sent = _send_confirmation_code(purchase)
    response = _headers(
        render(
            request,
            "status/new_purchase.html",
            {
                "purchase": purchase,
                "sent": sent,
                "token": token,
                "to": _masked(purchase.customer_email),
                "support_contact": settings.SUPPORT_CONTACT,
                "ttl_minutes": max(1, settings.BUYER_CONFIRMATION_TTL_SECONDS // 60),
            },
        )
    )
    response["Cache-Control"] = "no-store"
    return response


def _masked(address: str) -> str:
    # The page is reachable with the link alone: show enough for the buyer to recognise
    # their address, not enough to learn it.
    local, _, domain = (address or "").partition("@")
    return f"{local[:1]}***@{domain}" if local and domain else ""


def _send_confirmation_code(purchase) -> str:
    """ "sent", "already_sent" (a live code went out already), "no_email" or "failed"."""
    if not purchase.customer_email:
        return "no_email"
    if selectors.buyer_confirmation_live(purchase.pk):
        return "already_sent"
    code = buyer_confirmation_issue(purchase_id=purchase.pk)
    # Recorded before sending (an e-mail cannot be unsent); one row per code.
    email = EmailMessage.objects.create(
        purchase_id=purchase.pk,
        to=purchase.customer_email,
        kind=f"buyer_code:{secrets.token_hex(6)}",
        subject="Your confirmation code for a new purchase",
    )
    minutes = max(1, settings.BUYER_CONFIRMATION_TTL_SECONDS // 60)
    body = (
        f"Someone asked, on the status page of your purchase {purchase.pk}, to start "
        f"another purchase of the same kind.\n\nIf that was you, give this code to the "
        f"shop or its assistant: {code}\nIt works once, within {minutes} minutes. Your "
        f"purchase {purchase.pk} is not changed or cancelled.\n\nIf it was not you, "
        f"ignore this e-mail: without the code no second purchase is started.\n"
        f"Questions: {settings.SUPPORT_CONTACT}\n"
    )
    try:  # outside any transaction: a slow mail server holds no lock
        send_mail(
            f"Your confirmation code for a new purchase (next to {purchase.pk})",
            body,
            settings.DEFAULT_FROM_EMAIL,
            [purchase.customer_email],
            fail_silently=False,
        )
    except Exception:
        return "failed"  # the code is unusable without the mail; the buyer may ask again
    EmailMessage.objects.filter(pk=email.pk, sent_at=None).update(sent_at=timezone.now())
    return "sent"
