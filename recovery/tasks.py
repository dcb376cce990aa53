"""Thin Celery tasks: take ids, call one service, own nothing else.

acks_late / reject_on_worker_lost come from settings. Tasks never carry backoff in a
countdown/eta: a failure is recorded on the outbox row (available_at), which survives a
lost broker; the beat sweep re-kicks the relay.
"""

from typing import Any

from celery import shared_task


@shared_task(name="recovery.relay_drain", ignore_result=True)
def relay_drain() -> int:
    from recovery.relay import relay_drain as drain

    return drain()


@shared_task(name="recovery.reconcile_due", ignore_result=True)
def reconcile_due() -> int:
    from recovery.reconciler import reconcile_due as run

    return run()


@shared_task(name="recovery.sweep_dead_dispatches", ignore_result=True)
def sweep_dead_dispatches() -> int:
    from recovery.reconciler import sweep_dead_dispatches as run

    return run()


@shared_task(name="recovery.x402_finality", ignore_result=True)
def x402_finality() -> dict[str, Any]:
    """Succeeded x402 payments read again until their block is final (docs/x402.md)."""
    from django.conf import settings

    if not settings.X402_ENABLED:
        return {}
    from payments.services.x402_finality import x402_finality_sweep

    return x402_finality_sweep()


@shared_task(name="recovery.resume_stalled_fulfilment", ignore_result=True)
def resume_stalled_fulfilment() -> int:
    from recovery.reconciler import resume_stalled_fulfilment as run

    return run()


@shared_task(name="recovery.expire_stale_purchases", ignore_result=True)
def expire_stale_purchases() -> int:
    from recovery.reconciler import expire_stale_purchases as run

    return run()


@shared_task(name="recovery.settlement_compare", ignore_result=True)
def settlement_compare() -> int:
    from recovery.settlement import settlement_compare as run

    return run().discrepancies


@shared_task(name="recovery.disputes_refresh_open", ignore_result=True)
def disputes_refresh_open() -> int:
    from recovery.disputes import disputes_refresh_open as run

    return run()


@shared_task(name="recovery.retention_prune", ignore_result=True)
def retention_prune() -> int:
    """Prune the append-heavy tables (docs/retention.md); returns rows pruned."""
    from recovery.retention import retention_run

    return sum(r.pruned for r in retention_run())


@shared_task(name="recovery.purchase_fulfil", ignore_result=True)
def purchase_fulfil(purchase_id: str) -> str:
    """On-demand resume (console); normal runs come through RUN_STEPS outbox messages."""
    from recovery.orchestrator import purchase_fulfil as run

    return run(purchase_id=purchase_id)
