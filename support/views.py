"""Console views: thin. Parse, ask support.selectors or call one support.services action,
render. Every view goes through web.console_view(action), the one permission gate."""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse

from payments.customer_copy import customer_state
from payments.enums import Outcome, PurchaseStatus
from payments.money import format_major, format_money
from support import charts, purchase_list, runbooks, selectors, services
from support.access import Action, can
from support.admin_site import lockout_message
from support.models import IncidentOutcome
from support.web import client_ip, console_view, not_allowed, secure_headers


def _abilities(user) -> dict:
    return {a.value: can(user, a) for a in Action}


def _ctx(request, **kw) -> dict:
    return {"can": _abilities(request.user), **kw}


# -------------------------------------------------------------------- auth


class ConsoleLoginView(auth_views.LoginView):
    """Django auth login, rate limited per IP and per username (rows in PostgreSQL)."""

    template_name = "console/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        wait = services.login_lockout_seconds(ip=client_ip(request), username=username)
        if wait:
            response = render(
                request,
                "console/login.html",
                {
                    "form": self.get_form(),
                    "throttled": True,
                    "lockout_message": lockout_message(wait),
                },
                status=429,
            )
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        services.login_failure_record(
            ip=client_ip(self.request), username=self.request.POST.get("username", "")
        )
        return super().form_invalid(form)

    def dispatch(self, request, *args, **kwargs):
        return secure_headers(super().dispatch(request, *args, **kwargs))


class ConsoleLogoutView(auth_views.LogoutView):
    next_page = "/console/login/"

    def dispatch(self, request, *args, **kwargs):
        return secure_headers(super().dispatch(request, *args, **kwargs))


# ---------------------------------------------------------------- read views


@console_view(Action.VIEW)
def dashboard(request):
    return render(
        request,
        "console/dashboard.html",
        _ctx(
            request,
            queues=selectors.queue_summaries(request.user),
            exposure=selectors.money_at_risk(),
            to_order=selectors.success_to_order_seconds(),
            interventions=selectors.manual_interventions(),
            halts=selectors.active_halts(),
            incidents=selectors.incidents_open(),
            charts=charts.CHARTS,
            refund_float=selectors.x402_refund_float(),
        ),
    )


@console_view(Action.VIEW)
def chart(request, name: str):
    entry = charts.CHARTS.get(name)
    if entry is None:
        raise Http404
    response = HttpResponse(entry[0](), content_type="image/svg+xml")
    # An image, never a document: no script at all, pygal's own <style> allowed.
    response["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
    )
    return response


@console_view(Action.VIEW)
def queue(request, name: str):
    spec = selectors.QUEUES.get(name)
    if spec is None:
        raise Http404
    if not can(request.user, spec.action):
        return not_allowed(request, spec.action)
    return render(
        request,
        spec.template,
        _ctx(request, spec=spec, items=spec.items(), runbook=runbooks.runbook_get(spec.runbook)),
    )


@console_view(Action.VIEW)
def search(request):
    q = request.GET.get("q", "").strip()
    result = selectors.search(q)
    if len(result.purchases) == 1:
        return redirect("support:purchase", purchase_id=result.purchases[0].pk)
    return render(request, "console/search.html", _ctx(request, q=q, result=result))


_LIST_PARAMS = (
    "q",
    "status",
    "created_from",
    "created_to",
    "amount_min",
    "amount_max",
    "customer",
    "per_page",
)


@console_view(Action.VIEW)
def purchases(request):
    filters, errors = purchase_list.filters_from_query(request.GET)
    page = purchase_list.purchase_list(filters)
    kept = {k: request.GET[k] for k in _LIST_PARAMS if request.GET.get(k)}
    return render(
        request,
        "console/purchases.html",
        _ctx(
            request,
            page=page,
            errors=errors,
            form=kept,
            q=filters.q,
            statuses=PurchaseStatus.choices,
            paged=bool(filters.cursor),
            first_url="?" + urlencode(kept),
            next_url="?" + urlencode({**kept, "cursor": page.next_cursor})
            if page.next_cursor
            else "",
        ),
    )


@console_view(Action.VIEW)
def purchase(request, purchase_id: str):
    p = selectors.purchase_get(purchase_id)
    if p is None:
        raise Http404
    ops = selectors.purchase_operations(p)
    slug = selectors.purchase_runbook_slug(p, ops)
    refundable = selectors.refundable_amount(p)
    steps = selectors.purchase_steps(p)
    return render(
        request,
        "console/purchase.html",
        _ctx(
            request,
            runbook=runbooks.runbook_get(slug) if slug else None,
            incidents=selectors.incidents_for_purchase(p.pk),
            purchase=p,
            buyer_name=purchase_list.buyer_names([p.pk]).get(p.pk, ""),
            ops=ops,
            timeline=selectors.purchase_timeline(p, user=request.user, ops=ops, steps=steps),
            customer=customer_state(p),
            next_action=selectors.purchase_next_action(p, ops),
            refundable=selectors.refundable_payment(p),
            refundable_amount=refundable,
            refundable_major=format_major(refundable, p.currency) if refundable else "",
            op_next=selectors.operation_next_actions(ops, p),
            steps=steps,
            step_trouble=[str(x) for x in selectors.STEP_TROUBLE],
            replay_available=settings.STRIPE_DEDUPES_KEYS,
            Outcome=Outcome,
            user_id=request.user.pk,
        ),
    )


@console_view(Action.VIEW)
def event(request, event_pk: int):
    e = selectors.event_get(event_pk)
    if e is None:
        raise Http404
    show_payload = can(request.user, Action.VIEW_REDACTED_PAYLOAD)
    return render(
        request,
        "console/event.html",
        _ctx(request, event=e, payload=e.payload if show_payload else None),
    )


@console_view(Action.VIEW)
def webhooks(request):
    """Storefront webhook endpoints (never their secrets) and the delivery log."""
    purchase_id = request.GET.get("purchase", "")[:40] or None
    return render(
        request,
        "console/webhooks.html",
        _ctx(
            request,
            endpoints=selectors.webhook_endpoints(),
            deliveries=selectors.webhook_deliveries(purchase_id=purchase_id),
            purchase_filter=purchase_id,
        ),
    )


@console_view(Action.MANAGE_WEBHOOKS, post=True)
def webhook_endpoint_enabled(request, endpoint_id: str, state: str):
    if state not in ("enable", "disable"):
        raise Http404
    return _run(
        request,
        reverse("support:webhooks"),
        services.webhook_endpoint_enable_by_user,
        f"Endpoint {state}d.",
        endpoint_id=endpoint_id,
        enabled=state == "enable",
    )


@console_view(Action.MANAGE_WEBHOOKS, post=True)
def webhook_delivery_resend(request, delivery_id: int):
    return _run(
        request,
        reverse("support:webhooks"),
        services.webhook_delivery_resend_by_user,
        "Queued to be sent again (same webhook-id: a receiver that dedupes takes it once).",
        delivery_id=delivery_id,
    )


@console_view(Action.VIEW)
def halts(request):
    active = selectors.active_halts()
    return render(
        request,
        "console/halts.html",
        _ctx(
            request,
            halts=active,
            names=services.halt_names(),
            halted_names={h.name for h in active},
        ),
    )


@console_view(Action.VIEW)
def audit(request):
    wanted = {k: (request.GET.get(k) or "").strip() for k in ("actor", "action", "target")}
    return render(
        request,
        "console/audit.html",
        _ctx(request, entries=selectors.audit_recent(**wanted), wanted=wanted),
    )


# -------------------------------------------------------------- POST actions


def _confirmed(request) -> bool:
    # Confirmation without JavaScript: a required checkbox next to the reason field.
    return request.POST.get("confirm") == "yes"


def _back(request, fallback: str):
    target = request.POST.get("next") or fallback
    if not target.startswith("/console/") or target.startswith("//"):
        target = fallback
    return HttpResponseRedirect(target)


def _refused(request, e: services.ConsoleError) -> None:
    if isinstance(e, services.FormAlreadySubmitted):
        # A double click or a resent form: the first submission's result, nothing new.
        messages.info(request, e.message)
    else:
        messages.error(request, f"Refused ({e.code}): {e.message}")


def _form_token(request) -> str:
    """The one-time token the submitted form carried (support.services.form_token_mint)."""
    return request.POST.get("form_token", "")


def _run(request, fallback: str, fn, ok_message: str, **kwargs):
    if not _confirmed(request):
        messages.error(request, "Tick the confirmation box to go ahead.")
        return _back(request, fallback)
    try:
        fn(
            user=request.user,
            reason=request.POST.get("reason", ""),
            ip=client_ip(request),
            **kwargs,
        )
    except services.ConsoleError as e:
        _refused(request, e)
        return _back(request, fallback)
    messages.success(request, ok_message)
    return _back(request, fallback)


def _purchase_url(purchase_id: str) -> str:
    return reverse("support:purchase", kwargs={"purchase_id": purchase_id})


def _op_purchase_url(operation_id: str) -> str:
    op = selectors.operation_get(operation_id)
    if op is None:
        raise Http404
    return _purchase_url(op.purchase_id)


@console_view(Action.ADD_NOTE, post=True)
def note_add(request, purchase_id: str):
    url = _purchase_url(purchase_id)
    try:
        services.note_add(
            purchase_id=purchase_id,
            user=request.user,
            body=request.POST.get("reason", ""),
            ip=client_ip(request),
        )
    except services.ConsoleError as e:
        messages.error(request, f"Refused ({e.code}): {e.message}")
        return _back(request, url)
    messages.success(request, "Note added.")
    return _back(request, url)


@console_view(Action.REQUEST_REFUND, post=True)
def refund_request(request, purchase_id: str):
    """Two posts: the typed amount (major units) is parsed and echoed back; only the
    second post, carrying the exact minor-unit amount the person saw, requests it."""
    url = _purchase_url(purchase_id)
    p = selectors.purchase_get(purchase_id)
    if p is None:
        raise Http404
    if request.POST.get("step") == "confirm":
        try:
            amount = int(request.POST.get("amount_minor", ""))
        except ValueError:
            messages.error(request, "The confirmed amount was missing; start again.")
            return _back(request, url)
        # The confirm moves money once approved: only with the echo page's one-time token.
        return _run(
            request,
            url,
            services.refund_request_confirmed_by_user,
            f"Refund of {format_money(amount, p.currency)} requested; it waits for "
            "a finance approver (not the requester).",
            purchase_id=purchase_id,
            amount=amount,
            form_token=_form_token(request),
        )
    if not _confirmed(request):
        messages.error(request, "Tick the confirmation box to go ahead.")
        return _back(request, url)
    reason = (request.POST.get("reason") or "").strip()
    if not reason:
        messages.error(request, "A reason is required.")
        return _back(request, url)
    check = selectors.refund_amount_check(p, typed=request.POST.get("amount") or "")
    if check.error:
        messages.error(request, check.error)
        return _back(request, url)
    return render(
        request,
        "console/refund_confirm.html",
        _ctx(
            request,
            purchase=p,
            amount=check.amount,
            refundable=check.refundable,
            typed=check.typed,
            reason=reason,
        ),
    )


# A read-back changes nothing at the provider: one press, no typed reason and no tick (those
# guard money movements). The audit row still records who read it back, with this reason
# unless the person added a note.
READ_BACK_REASON = "On-demand read-back (read-only at the provider)"


@console_view(Action.RECONCILE, post=True)
def reconcile(request, operation_id: str):
    url = _op_purchase_url(operation_id)
    before = selectors.operation_get(operation_id)
    try:
        op = services.operation_reconcile_by_user(
            operation_id=operation_id,
            user=request.user,
            reason=(request.POST.get("reason") or "").strip() or READ_BACK_REASON,
            ip=client_ip(request),
        )
    except services.ConsoleError as e:
        messages.error(request, f"Refused ({e.code}): {e.message}")
        return _back(request, url)
    before_outcome = before.outcome if before is not None else ""
    level, text = selectors.reconcile_feedback(before_outcome=before_outcome, op=op)
    messages.add_message(request, level, text)
    return _back(request, url)


@console_view(Action.RESOLVE, post=True)
def resolve(request, operation_id: str):
    return _run(
        request,
        _op_purchase_url(operation_id),
        services.operation_resolve_by_user,
        "Operation resolved manually.",
        operation_id=operation_id,
        outcome=request.POST.get("outcome", ""),
        form_token=_form_token(request),
    )


@console_view(Action.RESOLVE, post=True)
def overturn_review(request, operation_id: str):
    return _run(
        request,
        _op_purchase_url(operation_id),
        services.overturn_review_by_user,
        "Overturn marked reviewed.",
        operation_id=operation_id,
        form_token=_form_token(request),
    )


@console_view(Action.RESOLVE, post=True)
def void(request, purchase_id: str):
    return _run(
        request,
        _purchase_url(purchase_id),
        services.void_by_user,
        "Void sent to the provider; the order is cancelled once it confirms.",
        purchase_id=purchase_id,
        form_token=_form_token(request),
    )


@console_view(Action.REQUEST_REFUND, post=True)
def cancel(request, purchase_id: str):
    return _run(
        request,
        _purchase_url(purchase_id),
        services.purchase_cancel_by_user,
        "Purchase cancelled.",
        purchase_id=purchase_id,
        form_token=_form_token(request),
    )


@console_view(Action.REPLAY, post=True)
def replay(request, operation_id: str):
    return _run(
        request,
        _op_purchase_url(operation_id),
        services.operation_replay_by_user,
        "Replayed with the same provider key.",
        operation_id=operation_id,
        form_token=_form_token(request),
    )


@console_view(Action.RESOLVE, post=True)
def cancel_unapplied(request, operation_id: str):
    return _run(
        request,
        _op_purchase_url(operation_id),
        services.operation_cancel_unapplied_by_user,
        "Cancelled at the provider; the payment is failed.",
        operation_id=operation_id,
        form_token=_form_token(request),
    )


@console_view(Action.APPROVE_REFUND, post=True)
def refund_approve(request, operation_id: str):
    url = _op_purchase_url(operation_id)
    if not _confirmed(request):
        messages.error(request, "Tick the confirmation box to go ahead.")
        return _back(request, url)
    try:
        op = services.refund_approve_by_user(
            operation_id=operation_id,
            user=request.user,
            reason=request.POST.get("reason", ""),
            ip=client_ip(request),
            form_token=_form_token(request),
        )
    except services.ConsoleError as e:
        _refused(request, e)
        return _back(request, url)
    level, text = selectors.refund_approve_feedback(op=op)
    messages.add_message(request, level, text)
    return _back(request, url)


@console_view(Action.APPROVE_REFUND, post=True)
def refund_decline(request, operation_id: str):
    return _run(
        request,
        _op_purchase_url(operation_id),
        services.refund_decline_by_user,
        "Refund declined; nothing was sent to the provider.",
        operation_id=operation_id,
        form_token=_form_token(request),
    )


@console_view(Action.HALT, post=True)
def halt_set(request):
    return _run(
        request,
        reverse("support:halts"),
        services.halt_set_by_user,
        f"{request.POST.get('name', '')} halted: new dispatches are refused with "
        "503 workflow_halted until someone resumes it.",
        name=request.POST.get("name", ""),
    )


@console_view(Action.HALT, post=True)
def halt_clear(request):
    name = request.POST.get("name", "")
    return _run(
        request,
        reverse("support:halts"),
        services.halt_clear_by_user,
        f"{name} resumed: new dispatches are accepted again.",
        name=name,
    )


@console_view(Action.TRIAGE_QUARANTINE, post=True)
def event_triage(request, event_pk: int, decision: str):
    if decision not in ("release", "dismiss"):
        raise Http404
    return _run(
        request,
        reverse("support:event", kwargs={"event_pk": event_pk}),
        services.event_triage_by_user,
        {
            "release": "Event released: it is applied again through the normal matching rules.",
            "dismiss": "Event dismissed: it stays recorded and is not applied.",
        }[decision],
        event_pk=event_pk,
        decision=decision,
    )


# ------------------------------------------------------------ queue decisions


@console_view(Action.DECIDE_STEP, post=True)
def step_decide(request, purchase_id: str, step: str):
    decision = request.POST.get("decision", "")
    done = {
        services.StepDecision.RETRY: f"Step {step} will run again now; the purchase "
        "resumes from it.",
        services.StepDecision.DONE: f"Step {step} marked handled; the purchase resumes "
        "from the next step.",
    }
    return _run(
        request,
        _purchase_url(purchase_id) + "#steps-h",
        services.step_decide_by_user,
        done.get(decision, "Decided."),
        purchase_id=purchase_id,
        step=step,
        decision=decision,
    )


@console_view(Action.SETTLE_DISCREPANCY, post=True)
def discrepancy_explain(request, discrepancy_pk: int):
    return _run(
        request,
        reverse("support:queue", kwargs={"name": "settlement"}),
        services.discrepancy_explain_by_user,
        "Discrepancy acknowledged with your explanation and closed.",
        discrepancy_id=discrepancy_pk,
    )


@console_view(Action.RETRY_OUTBOX, post=True)
def outbox_retry(request, message_pk: int):
    return _run(
        request,
        reverse("support:queue", kwargs={"name": "stuck_outbox"}),
        services.outbox_retry_by_user,
        "The message is due now; the relay picks it up within seconds. If it fails "
        "again it backs off and its new error shows here.",
        message_id=message_pk,
    )


# ------------------------------------------------------------------ runbooks


@console_view(Action.VIEW)
def runbook_index(request):
    return render(
        request,
        "console/runbooks.html",
        _ctx(request, runbooks=runbooks.runbooks_all(), queues=selectors.QUEUES),
    )


@console_view(Action.VIEW)
def runbook(request, slug: str):
    rb = runbooks.runbook_get(slug)
    if rb is None:
        raise Http404
    queue = selectors.QUEUES.get(rb.queue)
    if queue is not None and not can(request.user, queue.action):
        queue = None  # e.g. support reads the settlement runbook but not that queue
    return render(request, "console/runbook.html", _ctx(request, runbook=rb, queue=queue))


# ----------------------------------------------------------------- incidents


@console_view(Action.VIEW)
def incidents(request):
    return render(
        request, "console/incidents.html", _ctx(request, incidents=selectors.incidents_recent())
    )


@console_view(Action.VIEW)
def incident(request, incident_id: int):
    inc = selectors.incident_get(incident_id)
    if inc is None:
        raise Http404
    return render(
        request,
        "console/incident.html",
        _ctx(
            request,
            incident=inc,
            items=selectors.incident_items(inc),
            audit=selectors.incident_audit(inc),
            names=services.halt_names(),
            active_halts={h.name for h in selectors.active_halts()},
            outcomes=IncidentOutcome.choices,
        ),
    )


@console_view(Action.MANAGE_INCIDENTS, post=True)
def incident_open(request):
    fallback = reverse("support:incidents")
    if not _confirmed(request):
        messages.error(request, "Tick the confirmation box to go ahead.")
        return _back(request, fallback)
    try:
        inc = services.incident_open(
            user=request.user,
            title=request.POST.get("title", ""),
            reason=request.POST.get("reason", ""),
            ip=client_ip(request),
        )
    except services.ConsoleError as e:
        messages.error(request, f"Refused ({e.code}): {e.message}")
        return _back(request, fallback)
    messages.success(request, "Incident opened.")
    return redirect("support:incident", incident_id=inc.pk)


def _incident_url(incident_id: int) -> str:
    return reverse("support:incident", kwargs={"incident_id": incident_id})


@console_view(Action.MANAGE_INCIDENTS, post=True)
def incident_attach(request, incident_id: int):
    return _run(
        request,
        _incident_url(incident_id),
        services.incident_attach,
        "Attached to the incident.",
        incident_id=incident_id,
        ref=request.POST.get("ref", ""),
    )


@console_view(Action.MANAGE_INCIDENTS, post=True)
def incident_halt(request, incident_id: int):
    return _run(
        request,
        _incident_url(incident_id),
        services.incident_halt,
        "Workflow halted from the incident.",
        incident_id=incident_id,
        name=request.POST.get("name", ""),
    )


@console_view(Action.MANAGE_INCIDENTS, post=True)
def incident_close(request, incident_id: int):
    outcomes = {
        k[len("outcome-") :]: v for k, v in request.POST.items() if k.startswith("outcome-")
    }
    return _run(
        request,
        _incident_url(incident_id),
        services.incident_close,
        "Incident closed.",
        incident_id=incident_id,
        outcomes=outcomes,
    )


@console_view(Action.REVIEW_EXTERNAL, post=True)
def external_review(request, operation_id: str):
    return _run(
        request,
        reverse("support:queue", args=["external"]),
        services.external_review_by_user,
        "Acknowledged: made outside Verity.",
        operation_id=operation_id,
    )
