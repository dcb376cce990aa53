"""Support runbooks: versioned Markdown files in docs/runbooks/, rendered in the console.

Each file starts with Markdown `meta` lines (Title, Queue, Version). Three kinds of
placeholder keep the runbooks from drifting away from the code they describe:

- `[[customer:<key>]]` quotes the customer page's own words (payments.customer_copy.WORDS),
  so a runbook never restates what the customer reads in different words;
- `[[roles:<action>]]` names the roles that hold an access.Action (from access.MATRIX);
- `[[setting:<NAME>]]` shows a timing setting's current value — only for names in
  RUNBOOK_SETTINGS: every console user reads runbooks, and `SECRET_KEY`, the provider key
  or the webhook secrets must never be one placeholder away.

The files are repository content (trusted, reviewed like code); substituted values are
HTML-escaped anyway.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from functools import lru_cache

import markdown
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from support import customer_copy, queues
from support.access import MATRIX, Action

RUNBOOK_DIR = queues.RUNBOOK_DIR

# Each console queue declares its runbook in its QueueSpec (support.queues); these two maps
# are read from the registry, never written by hand.
QUEUE_RUNBOOK: dict[str, str] = {q.name: q.runbook for q in queues.QUEUES.values()}
# slug -> console queue it belongs to (a runbook no queue names is reached from a purchase
# or an incident only).
RUNBOOK_QUEUE: dict[str, str] = {slug: q for q, slug in QUEUE_RUNBOOK.items()}

# The settings a runbook may quote: timings, limits and who gets escalations. Never a
# secret, a URL with credentials or anything the environment adds later by default.
RUNBOOK_SETTINGS = frozenset(
    {
        "DISPATCH_LEASE_SECONDS",
        "RECONCILE_SCHEDULE_SECONDS",
        "RECONCILE_DEADLINE_SECONDS",
        "RECOVERY_OWNER_DEFAULT",
        "OUTBOX_SWEEP_SECONDS",
        "OUTBOX_LEASE_SECONDS",
        "OUTBOX_STUCK_ATTEMPTS",
        "OUTBOX_STUCK_SECONDS",
        "OUTBOX_BACKOFF_BASE_SECONDS",
        "OUTBOX_BACKOFF_CAP_SECONDS",
        "STEP_LEASE_SECONDS",
        "STEP_MAX_ATTEMPTS",
        "STEP_RETRY_LIMIT",
        "PAID_WITHOUT_ORDER_SECONDS",
        "DELIVERABLE_RETENTION_DAYS",
        "SETTLEMENT_WINDOW_HOURS",
        "SETTLEMENT_GRACE_SECONDS",
        "IDEMPOTENCY_LEASE_SECONDS",
        "SUPPORT_CONTACT",
        "X402_MAX_TIMEOUT_SECONDS",
        "X402_CONFIRMATIONS",
    }
)

_TOKEN = re.compile(r"\[\[(customer|roles|setting):([A-Za-z0-9_]+)\]\]")


@dataclass(frozen=True)
class Runbook:
    slug: str
    title: str
    version: str
    queue: str
    html: str
    path: str  # repository-relative, for "edit this file"


def _roles_for(action: str) -> str:
    try:
        wanted = Action(action)
    except ValueError:
        return f"(unknown action {action})"
    names = [role.value for role, actions in MATRIX.items() if wanted in actions]
    return ", ".join(names) or "nobody"


def _customer_quote(key: str) -> str:
    if key not in customer_copy.WORDS:
        return f"(unknown customer wording {key})"
    headline, message = customer_copy.wording(
        key, contact=getattr(settings, "SUPPORT_CONTACT", "") or "‹support contact›"
    )
    return (
        f"\n\n> **{html.escape(headline)}**  \n> {html.escape(message)}\n"
        f'> <small class="meta">Customer page wording `{key}` '
        f"(payments/customer_copy.py)</small>\n\n"
    )


# "`[[setting:X_SECONDS]]` seconds" in a runbook reads as a duration ("3 days"), not as
# "259200 seconds" a person must divide at 3 a.m.
_DURATION_TOKEN = re.compile(r"`?\[\[setting:([A-Z0-9_]+_SECONDS)\]\]`?(?: seconds)?")
_UNITS = (("day", 86400), ("hour", 3600), ("min", 60), ("s", 1))


def duration_words(seconds: int) -> str:
    """259200 -> "3 days", 90 -> "1 min 30 s", 0 -> "0 s"."""
    parts, rest = [], int(seconds)
    for name, size in _UNITS:
        n, rest = divmod(rest, size)
        if n:
            plural = "s" if n > 1 and name in ("day", "hour") else ""
            parts.append(f"{n} {name}{plural}")
    return " ".join(parts) or "0 s"


def _duration_setting(m: re.Match) -> str:
    name = m.group(1)
    value = getattr(settings, name, None) if name in RUNBOOK_SETTINGS else None
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return html.escape(", ".join(duration_words(v) for v in value))
    if isinstance(value, int) and not isinstance(value, bool):
        return html.escape(duration_words(value))
    return m.group(0)  # left to the general substitution below


def _substitute(text: str) -> str:
    text = _DURATION_TOKEN.sub(_duration_setting, text)

    def one(m: re.Match) -> str:
        kind, name = m.group(1), m.group(2)
        if kind == "customer":
            return _customer_quote(name)
        if kind == "roles":
            return html.escape(_roles_for(name))
        if name not in RUNBOOK_SETTINGS:
            return f"(setting {name} is not shown in runbooks)"
        value = getattr(settings, name, None)
        return html.escape(str(value)) if value is not None else f"(unset {name})"

    return _TOKEN.sub(one, text)


def runbook_slugs() -> list[str]:
    return sorted(p.stem for p in RUNBOOK_DIR.glob("*.md"))


@lru_cache(maxsize=64)
def _load(slug: str, mtime: float) -> Runbook:
    path = RUNBOOK_DIR / f"{slug}.md"
    md = markdown.Markdown(extensions=["meta", "tables", "sane_lists", "toc"])
    body = md.convert(_substitute(path.read_text(encoding="utf-8")))
    meta = {k: " ".join(v) for k, v in getattr(md, "Meta", {}).items()}
    return Runbook(
        slug=slug,
        title=meta.get("title", slug),
        version=meta.get("version", ""),
        queue=meta.get("queue", RUNBOOK_QUEUE.get(slug, "")),
        html=body,
        path=f"docs/runbooks/{slug}.md",
    )


@receiver(setting_changed)
def _forget_renders_on_setting_changed(**_kwargs) -> None:
    """A render holds the settings of its moment (`_substitute`): a test's override must
    neither outlive the test nor be missed by the next one."""
    _load.cache_clear()


def runbook_get(slug: str) -> Runbook | None:
    if not re.fullmatch(r"[a-z0-9-]+", slug or ""):
        return None
    path = RUNBOOK_DIR / f"{slug}.md"
    if not path.is_file():
        return None
    return _load(slug, path.stat().st_mtime)


def runbooks_all() -> list[Runbook]:
    return [rb for rb in (runbook_get(s) for s in runbook_slugs()) if rb is not None]
