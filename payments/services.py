"""Payments services: the only code that writes Purchase and PaymentOperation.

Every function is keyword-only. Errors a caller must show to a client are raised as
`DomainError(code, message, status, retry, owner, purchase=, operation=)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .enums import Owner, RetryAdvice


@dataclass
class DomainError(Exception):
    """A refusal with a stable code. Raised before any effect unless stated."""

    code: str
    message: str
    status: int = 409
    retry: str = RetryAdvice.FORBIDDEN
    owner: str = Owner.BUYER
    purchase: str | None = None
    operation: str | None = None
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
