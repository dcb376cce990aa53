"""The browser suite: Debian's /usr/bin/chromium, headless. Playwright (a dev dependency:
its Python package ships its own driver, and it launches the system Chromium by path, so
no browser is downloaded) drives the people's tasks (`person_on_phone`, `person_at_desk`);
the older tests drive the same Chromium over the DevTools protocol (tests/browser/cdp.py).
Each test plays one person's task against pytest-django's live server and asserts what
that person sees and what happened (e-mails sent, rows written, provider objects).

Skipped only when /usr/bin/chromium is absent; .ci/run installs it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.browser import cdp
from tests.browser.pages import SHOTS

PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 3, "mobile": True}


class Person:
    """A browser tab used the way a person uses it: open a link, read the page, tap what is
    on the screen (a real pointer event at the button's position, not form.submit())."""

    def __init__(self, browser: cdp.Browser) -> None:
        self.b = browser

    def open(self, url: str) -> None:
        self.b.goto(url)

    def text(self) -> str:
        return self.b.evaluate("document.body.innerText")

    def js(self, expression: str):
        return self.b.evaluate(expression)

    def visible(self, selector: str) -> bool:
        return bool(
            self.b.evaluate(
                f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                " if (!e) return false; const r = e.getBoundingClientRect();"
                " return r.width > 0 && r.height > 0 && e.checkVisibility({"
                " contentVisibilityAuto: true, visibilityProperty: true}); })()"
            )
        )

    def tap(self, selector: str, *, navigates: bool = True) -> None:
        box = self.b.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        assert box is not None, f"nothing to tap: {selector}"
        x, y = box
        if navigates:
            self.b.events = [e for e in self.b.events if e["method"] != "Page.loadEventFired"]
        for kind in ("mousePressed", "mouseReleased"):
            self.b.call(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )
        if navigates:
            self.b._wait_event("Page.loadEventFired")

    def last_document_status(self) -> int | None:
        """The HTTP status of the document now shown (Navigation Timing)."""
        return self.b.evaluate(
            "(performance.getEntriesByType('navigation')[0] || {}).responseStatus || null"
        )

    def screenshot(self, name: str) -> None:
        self.b.screenshot(SHOTS / name)


@pytest.fixture
def phone(chromium) -> Person:
    """A customer's phone: 390×844 CSS pixels, no cookies from an earlier test."""
    chromium.call("Network.clearBrowserCookies")
    chromium.call("Emulation.setDeviceMetricsOverride", **PHONE)
    chromium.events.clear()
    yield Person(chromium)
    chromium.call("Emulation.clearDeviceMetricsOverride")


# -- Playwright -------------------------------------------------------------------------

CHROMIUM = cdp.CHROMIUM
CHROMIUM_ARGS = cdp.HEADLESS_FLAGS
DESK = {"width": 1440, "height": 900}


@pytest.fixture(scope="module")
def playwright_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop on this thread; Django then refuses ORM
    # calls from "an async context" although every call here is plain synchronous code
    # (pytest-playwright's documented workaround). Only while the browser is up.
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


def _watch_for_refusals(page, seen: list[str]) -> None:
    """Every document answer the person got: a 403 (CSRF or permission) is never
    something a person should meet while doing their job."""
    page.on(
        "response",
        lambda r: (
            seen.append(f"{r.status} {r.url}")
            if r.request.resource_type == "document" and r.status >= 400
            else None
        ),
    )


def _close_quietly(page, context) -> None:
    page.wait_for_load_state("networkidle")
    page.goto("about:blank")
    context.close()


@pytest.fixture(autouse=True)
def _live_server_closes_its_connections():
    """The live server answers each request on a new thread; with the project's persistent
    connections (CONN_MAX_AGE) each thread's session outlives it, and pytest-django then
    cannot drop the test database. Requests during these tests close theirs."""
    from django.db import connections

    db = connections.settings["default"]
    before = db.get("CONN_MAX_AGE")
    db["CONN_MAX_AGE"] = 0
    yield
    db["CONN_MAX_AGE"] = before


@pytest.fixture
def person_on_phone(playwright_chromium):
    """A customer's phone (390×844, touch), a fresh browser profile."""
    context = playwright_chromium.new_context(
        viewport={"width": 390, "height": 844},
        device_scale_factor=1,
        is_mobile=True,
        has_touch=True,
    )
    page = context.new_page()
    page.refusals = []
    _watch_for_refusals(page, page.refusals)
    yield page
    _close_quietly(page, context)


@pytest.fixture
def person_at_desk(playwright_chromium):
    """A console user's screen (1440×900), a fresh browser profile."""
    context = playwright_chromium.new_context(viewport=DESK)
    page = context.new_page()
    page.refusals = []
    _watch_for_refusals(page, page.refusals)
    yield page
    _close_quietly(page, context)


@pytest.fixture
def console_people(db, settings):
    """One console user per role, with a password a person types at the login page."""
    from django.contrib.auth.models import Group, User

    from support.access import Role, ensure_groups

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    ensure_groups()
    people = {}
    for role, name in (("support", "sam"), ("operator", "olga"), ("finance", "fred")):
        user = User.objects.create_user(username=name, password=f"pw-{name}")
        user.groups.add(Group.objects.get(name=getattr(Role, role.upper())))
        people[role] = user
    return people
