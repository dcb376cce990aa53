"""Error codes and audit actions are enums whose members are their strings: the API's
problem documents, stored audit rows and any caller still holding a literal read the same
values as before."""

import json

from audit.actions import AuditAction
from payments.api.problems import problem_body
from payments.enums import Owner, RetryAdvice
from payments.errors import DomainError, ErrorCode


def test_an_error_code_is_its_string_everywhere_it_is_written():
    assert ErrorCode.NOT_FOUND == "not_found" and f"{ErrorCode.NOT_FOUND}" == "not_found"
    assert json.dumps({"code": ErrorCode.ALREADY_PAID}) == '{"code": "already_paid"}'
    err = DomainError(ErrorCode.ALREADY_PAID, "This purchase is already paid.")
    assert err.code == "already_paid" and str(err).startswith("already_paid: ")


def test_a_problem_document_carries_the_plain_code():
    body = json.loads(
        json.dumps(
            problem_body(
                code=ErrorCode.NOT_FOUND,
                detail="No such purchase.",
                status=404,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.BUYER,
            )
        )
    )
    assert body["code"] == "not_found" and body["type"].endswith(":not_found")


def test_values_are_unique_and_never_empty():
    for enum in (ErrorCode, AuditAction):
        values = [m.value for m in enum]
        assert len(values) == len(set(values)) and all(values)
    assert f"{AuditAction.CONSOLE_RESOLVE}.refused" == "console.resolve.refused"
