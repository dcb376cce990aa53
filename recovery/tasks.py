"""Thin Celery tasks: take ids, call one service. (Filled in by the recovery work.)"""
from celery import shared_task


@shared_task(name="recovery.relay_drain", ignore_result=True)
def relay_drain() -> int:
    from recovery.relay import relay_drain_once

    return relay_drain_once()
