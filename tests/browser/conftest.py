"""The browser suite: Debian's /usr/bin/chromium, headless, driven over the DevTools
protocol by tests/support/cdp.py (Playwright is not in the lock; its own browser download
cannot run here). Each test plays one person's task against pytest-django's live server
and asserts what that person sees and what happened (e-mails sent, rows written).

Skipped only when /usr/bin/chromium is absent; .ci/run installs it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import cdp

ARTIFACTS = Path(os.environ.get("VERITY_ARTIFACT_DIR",
                                Path(__file__).resolve().parents[2] / "var" / "test-artifacts"))
SHOTS = ARTIFACTS / "screenshots"

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
        return bool(self.b.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return false; const r = e.getBoundingClientRect();"
            " return r.width > 0 && r.height > 0 && e.checkVisibility({"
            " contentVisibilityAuto: true, visibilityProperty: true}); })()"))

    def tap(self, selector: str, *, navigates: bool = True) -> None:
        box = self.b.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        assert box is not None, f"nothing to tap: {selector}"
        x, y = box
        if navigates:
            self.b.events = [e for e in self.b.events if e["method"] != "Page.loadEventFired"]
        for kind in ("mousePressed", "mouseReleased"):
            self.b.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                        clickCount=1)
        if navigates:
            self.b._wait_event("Page.loadEventFired")

    def last_document_status(self) -> int | None:
        """The HTTP status of the document now shown (Navigation Timing)."""
        return self.b.evaluate(
            "(performance.getEntriesByType('navigation')[0] || {}).responseStatus || null")

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
