"""Floors: the least a Django view can do for the same request, in the same process.

They verify nothing, authenticate nothing and write no outbox row; they exist so every
headline figure is a ratio against what this machine, this PostgreSQL and this middleware
stack allow at that moment (the machine is shared and noisy).
"""

import json

from django.db import connection
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt

FLOOR_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS bench_floor_row (
    id bigserial PRIMARY KEY,
    key text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


@csrf_exempt
def insert_one_row(request):
    """Webhook floor: parse the body, insert one row by its id (ON CONFLICT DO NOTHING)."""
    key = json.loads(request.body)["id"]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_floor_row (key) VALUES (%s) ON CONFLICT DO NOTHING", [key]
        )
    return JsonResponse({"received": True})


def get_one_row(request, purchase_id: str):
    """Replay floor: one indexed (primary key) read of one row, as JSON."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, status, amount, currency FROM payments_purchase WHERE id = %s",
            [purchase_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise Http404
    return JsonResponse({"id": row[0], "status": row[1], "amount": row[2], "currency": row[3]})
