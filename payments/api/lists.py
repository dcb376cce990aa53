"""Parsing the purchases list's query (GET /api/v1/purchases) and its cursor."""

from __future__ import annotations

import base64
from datetime import datetime

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers

from ..enums import PurchaseStatus
from ..errors import ErrorCode
from ..models import Purchase
from ..selectors import PURCHASE_LIST_MAX, PurchaseFilter
from .problems import Problem
from .serializers import PurchaseOut

PURCHASE_LIST_PARAMETERS = [
    OpenApiParameter("status", str, description="comma-separated purchase statuses"),
    OpenApiParameter("customer_reference", str),
    OpenApiParameter("created_after", str, description="ISO 8601, inclusive"),
    OpenApiParameter("created_before", str, description="ISO 8601, exclusive"),
    OpenApiParameter("amount_min", int, description="minor units"),
    OpenApiParameter("amount_max", int, description="minor units"),
    OpenApiParameter("cursor", str, description="`next_cursor` of the previous page"),
    OpenApiParameter("limit", int, description=f"1..{PURCHASE_LIST_MAX}, default 20"),
]

PurchaseListOut = inline_serializer(
    "PurchaseList",
    {
        "purchases": serializers.ListField(child=PurchaseOut()),
        "next_cursor": serializers.CharField(allow_null=True),
    },
)


def _bad(detail: str) -> Problem:
    return Problem(code=ErrorCode.INVALID_REQUEST, status=400, detail=detail)


def _when(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise _bad(f"`{name}` must be an ISO 8601 time with its offset.")
    return parsed


def _amount(value: str | None, name: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except ValueError:
        raise _bad(f"`{name}` must be an integer (minor units).") from None
    if not 0 <= number <= 10**15:
        raise _bad(f"`{name}` is out of range.")
    return number


def purchase_list_cursor(purchase: Purchase) -> str:
    raw = f"{purchase.created_at.isoformat()}|{purchase.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _cursor(value: str | None) -> tuple[datetime, str] | None:
    if not value:
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        at, pk = raw.split("|", 1)
        when = parse_datetime(at)
    except (ValueError, UnicodeDecodeError):
        when, pk = None, ""
    if when is None or not pk or "\x00" in pk:
        raise _bad("`cursor` is not a cursor this API gave.")
    return when, pk


def purchase_list_query(params) -> tuple[PurchaseFilter, tuple[datetime, str] | None, int]:
    statuses = tuple(s for s in (params.get("status") or "").split(",") if s)
    unknown = [s for s in statuses if s not in PurchaseStatus.values]
    if unknown:
        raise _bad(f"Unknown statuses: {', '.join(unknown)}.")
    reference = params.get("customer_reference") or ""
    if len(reference) > 200 or "\x00" in reference:
        raise _bad("`customer_reference` is at most 200 characters.")
    limit = _amount(params.get("limit"), "limit") or 20
    where = PurchaseFilter(
        statuses=statuses,
        customer_reference=reference,
        created_after=_when(params.get("created_after"), "created_after"),
        created_before=_when(params.get("created_before"), "created_before"),
        amount_min=_amount(params.get("amount_min"), "amount_min"),
        amount_max=_amount(params.get("amount_max"), "amount_max"),
    )
    return where, _cursor(params.get("cursor")), min(limit, PURCHASE_LIST_MAX)
