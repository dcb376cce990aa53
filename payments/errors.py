"""The core's refusal type and the result of applying an observation: a leaf every layer
may import (the API and MCP map `DomainError` to a problem; the relay reads its code)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

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


class ApplyResult(str, Enum):
    APPLIED = "applied"
    NO_CHANGE = "no_change"
    STALE = "stale"
    CONFLICT = "conflict"
    MISMATCH = "mismatch"
