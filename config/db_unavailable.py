"""503 with Retry-After while PostgreSQL is unreachable, for the plain Django views.

The API's DRF exception handler answers the same problem itself (payments/api/problems.py);
this middleware covers what DRF does not see: the webhook view, the console and the
customer page. A restart or failover of the database is not a bug in a view: the answer
says when to come back, and nothing was recorded (every write is one transaction).
"""

from __future__ import annotations

import json
import logging

from django.http import HttpResponse

from payments.api.problems import (
    PROBLEM_CONTENT_TYPE,
    database_unavailable_problem,
    is_database_unavailable,
    problem_body,
)

logger = logging.getLogger(__name__)


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        return database_unavailable_response(request, exception)


def database_unavailable_response(request, exception) -> HttpResponse | None:
    """The 503 for `exception` when it means PostgreSQL is unreachable, else None (also
    for config.early_webhook, which answers the webhook before this middleware)."""
    if not is_database_unavailable(exception):
        return None
    logger.warning("database unavailable for %s: %s", request.path, type(exception).__name__)
    problem = database_unavailable_problem()
    body = problem_body(
        code=problem.code,
        detail=problem.detail,
        status=problem.status,
        retry=problem.retry,
        owner=problem.owner,
        action_message=problem.action_message,
    )
    return HttpResponse(
        json.dumps(body),
        status=problem.status,
        content_type=PROBLEM_CONTENT_TYPE,
        headers=problem.headers,
    )
