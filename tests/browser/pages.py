"""What a person's page leaves and does: screenshots under the test artifacts (and
docs/img/ when asked), and the console's login typed like a person types it."""

from __future__ import annotations

import os
from pathlib import Path

ARTIFACTS = Path(
    os.environ.get(
        "VERITY_ARTIFACT_DIR", Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
    )
)
SHOTS = ARTIFACTS / "screenshots"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def screenshot(
    page, name: str, *, docs: bool = False, full_page: bool = False, only: str | None = None
) -> Path:
    """Keep what the person saw under the test artifacts. With `docs=True` and
    VERITY_DOC_IMAGES=1 in the environment, also under docs/img/ (the pictures
    docs/console.md shows): a run refreshes them only when asked, so `make test` leaves
    the checkout clean."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    if only:  # one part of the page (a CSS selector)
        page.locator(only).first.screenshot(path=str(path))
    else:
        page.screenshot(path=str(path), full_page=full_page)
    if docs and os.environ.get("VERITY_DOC_IMAGES") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / name).write_bytes(path.read_bytes())
    return path


def log_in(page, base_url: str, username: str) -> None:
    """The console's login page, typed and clicked like a person does."""
    page.goto(f"{base_url}/console/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/console/")
